"""prometheus_client's encoder run a family at a time, the bytes of a family kept with its samples and
answered again while its samples stay the same; of a family where some samples changed, only those are
encoded again.

prometheus_client encodes every sample of every family at every scrape, about 6.5 us a sample on the
development VM (docs/prometheus.md, Cost), although between two scrapes a second apart most families of
a host repeat exactly: the info series, floors, iteration counts, the last offloads and transitions,
GPU totals, kills; and of a family that changed, often only some samples did (the transition that
ended this second, one of four a process). Each family is still encoded by prometheus_client's own
encoder (the one it chose for the scraper's Accept header), alone, or as a copy holding only the samples
that changed, whose lines then replace those samples' lines; the answer is, byte for byte, what that
encoder gives for the whole registry (tests/unit/test_metrics_exposition.py holds them equal scrape
after scrape).
"""
from __future__ import annotations

import copy
from typing import Any, Callable, NamedTuple

from prometheus_client.utils import floatToGoString

# OpenMetrics ends the whole exposition with this line; an encoder run on one family writes it too.
OPENMETRICS_EOF = b"# EOF\n"


class _OneFamily:
    """A registry holding one family, for prometheus_client's encoders (they only call collect())."""

    def __init__(self, family: Any):
        self._family = family

    def collect(self) -> list:
        return [self._family]


class _Encoded(NamedTuple):
    source: tuple  # (type, documentation, unit, samples) the bytes were encoded from
    body: bytes
    header: list[bytes] | None  # body's header lines, when it is laid out as _lines expects; else None
    plain: bool  # every sample plain (_plain) and none zero: equal samples give equal lines
    # The line of each sample of `source`, in its order, or None where the sample is not plain.
    lines: list[bytes | None]
    # (sample name, its labels' names and values) -> (the line's prefix as the encoder wrote it, a line):
    # the plain samples of this family seen in this content type, from scrape to scrape.
    prefixes: dict[tuple, bytes]


def _plain(sample: Any) -> bool:
    """True when prometheus_client's encoders write `sample`'s line as its name and labels, one space and
    floatToGoString(value), nothing after: no timestamp, exemplar or native histogram, and a value of
    int or float (whose equal values give one float, hence one string, but for the sign of a zero)."""
    return (sample[3] is None and sample[4] is None and sample[5] is None
            and (type(sample[2]) is float or type(sample[2]) is int))


def _key(sample: Any) -> tuple:
    # The label names then their values: as many of each, so two different label dicts never meet.
    return (sample[0], *sample[1], *sample[1].values())


def _remember(prefixes: dict, samples: list, lines: list[bytes]) -> list[bytes | None]:
    """Puts the prefix of each plain sample's line in `prefixes`; the lines, None where not plain."""
    kept: list[bytes | None] = []
    for sample, line in zip(samples, lines):
        if _plain(sample):
            prefixes[_key(sample)] = line[:line.rindex(b" ") + 1]
            kept.append(line)
        else:
            kept.append(None)
    return kept


def _lines(body: bytes, samples: int) -> tuple[list[bytes] | None, int]:
    """(the lines of one family's `body`, how many header lines lead), or (None, 0) when the body is not
    its header lines (# HELP, # TYPE, # UNIT) followed by exactly one line a sample, in the samples'
    order: prometheus_client's text encoder writes a counter's `_created` samples after the others under
    headers of their own, its OpenMetrics 1.0 encoder leaves native histograms out. Every newline in a
    name, label value or help text is escaped, so a line that starts with '#' is a header's."""
    lines = body.split(b"\n")
    if lines.pop() != b"":
        return None, 0
    header = 0
    while header < len(lines) and lines[header][:1] == b"#":
        header += 1
    if body.count(b"\n#") + (body[:1] == b"#") != header or len(lines) != header + samples:
        return None, 0
    # The family's own header has one # TYPE line; the text format's `_created` gauge, its samples all
    # `_created`, follows it with its own right away: lines that go with those samples, not the family.
    if body.count(b"\n# TYPE ") + body.startswith(b"# TYPE ") != 1:
        return None, 0
    return lines, header


class FamilyCache:
    """Encodes a registry's families with `encoder`, reusing a family's bytes while its samples are
    equal to those it was encoded from; of a family where some samples changed, a sample's line while
    it is the same, its prefix with the new value after it where only the value moved (_spliced). Safe
    for two scrapes at once: both may encode a family, either result is right."""

    def __init__(self) -> None:
        self._encoded: dict[tuple[str, str], _Encoded] = {}  # (content type, family name) -> its last encoding

    def encode(self, registry: Any, encoder: Callable[[Any], bytes], content_type: str) -> bytes:
        openmetrics = content_type.startswith("application/openmetrics-text")
        parts = []
        for family in registry.collect():
            key = (content_type, family.name)
            source = (family.type, family.documentation, family.unit, family.samples)
            known = self._encoded.get(key)
            if known is not None and known.plain and known.source == source:
                parts.append(known.body)
                continue
            encoded = None
            if known is not None and known.header is not None and known.source[:3] == source[:3]:
                encoded = _spliced(family, source, known, encoder, openmetrics)
            if encoded is None:
                encoded = _whole(family, source, encoder, openmetrics, None if known is None else known.prefixes)
            self._encoded[key] = encoded
            parts.append(encoded.body)
        if openmetrics:
            parts.append(OPENMETRICS_EOF)
        return b"".join(parts)


def _one(family: Any, encoder: Callable[[Any], bytes], openmetrics: bool) -> bytes:
    body = encoder(_OneFamily(family))
    if openmetrics and body.endswith(OPENMETRICS_EOF):
        body = body[:-len(OPENMETRICS_EOF)]
    return body


def _whole(family: Any, source: tuple, encoder: Callable[[Any], bytes], openmetrics: bool,
           prefixes: dict | None) -> _Encoded:
    """`family` encoded whole; its plain samples' prefixes added to `prefixes` (of this family, seen
    before) unless that holds many more series than the family now: series gone for good, forgotten."""
    samples = family.samples
    body = _one(family, encoder, openmetrics)
    lines, header = _lines(body, len(samples))
    if prefixes is None or _too_many(prefixes, samples):
        prefixes = {}
    if lines is None:
        return _Encoded(source, body, None, False, [], prefixes)
    kept = _remember(prefixes, samples, lines[header:])
    plain = None not in kept and 0 not in [s[2] for s in samples]
    return _Encoded(source, body, lines[:header], plain, kept, prefixes)


def _too_many(prefixes: dict, samples: list) -> bool:
    return len(prefixes) > 4 * len(samples) + 1024


def _spliced(family: Any, source: tuple, known: _Encoded, encoder: Callable[[Any], bytes],
             openmetrics: bool) -> _Encoded | None:
    """`family` from the lines of the samples seen before. A plain sample (_plain) whose name and labels
    are those of the sample at its place at the previous scrape, also plain, keeps that line while its
    value is equal (and not zero: 0.0 and -0.0 are equal, written apart), else the line's prefix,
    everything up to its value, as the encoder wrote it, followed by the new value formatted by
    prometheus_client's own floatToGoString (the value, the last thing on a plain line, never holds a
    space); one whose name and labels were seen at another place or scrape takes the prefix kept for
    them. The others are encoded anew, as a copy of the family holding only them, and their lines put at
    their places. None when most samples need the encoder (encoding the whole family costs less than
    splicing it), when the prefixes kept are many more than the family's series (series gone for good:
    the whole family encoded starts them again) or a body is not laid out as _lines expects."""
    samples, header, prefixes = family.samples, known.header, known.prefixes
    if _too_many(prefixes, samples):
        return None
    out = list(header)
    kept: list[bytes | None] = []
    redo = []
    plain = True
    before, lines = known.source[3], known.lines
    n = len(before)
    seen = prefixes.get
    for i, s in enumerate(samples):
        name, labels, value, timestamp, exemplar, histogram = s
        if timestamp is None and exemplar is None and histogram is None and (type(value) is float or type(value) is int):
            if not value:
                plain = False
            if i < n and (line := lines[i]) is not None and name == (o := before[i])[0] and labels == o[1]:
                if value != o[2] or not value:  # a NaN is never equal: written again, rightly
                    line = line[:line.rindex(b" ") + 1] + floatToGoString(value).encode()
                out.append(line)
                kept.append(line)
                continue
            prefix = seen(_key(s))
            if prefix is not None:
                line = prefix + floatToGoString(value).encode()
                out.append(line)
                kept.append(line)
                continue
        else:
            plain = False
        redo.append(i)
        out.append(b"")
        kept.append(None)
    if 2 * len(redo) > len(samples):
        return None
    if redo:
        part = copy.copy(family)  # its name, help, type and unit: the same header
        part.samples = [samples[i] for i in redo]
        new, new_header = _lines(_one(part, encoder, openmetrics), len(redo))
        if new is None or new[:new_header] != header:
            return None
        new_kept = _remember(prefixes, part.samples, new[new_header:])
        for i, line, k in zip(redo, new[new_header:], new_kept):
            out[len(header) + i] = line
            kept[i] = k
    return _Encoded(source, b"\n".join(out) + b"\n", header, plain, kept, prefixes)
