"""prometheus_client's encoder run a family at a time, the bytes of a family kept with its samples and
answered again while its samples stay the same; of a family where some samples changed, a sample whose
value alone moved keeps its line's prefix as the encoder wrote it, the new value after it.

prometheus_client encodes every sample of every family at every scrape, 6.5 to 8 us a sample on the
development VM (docs/prometheus.md, Cost), although between two scrapes most families of a host repeat
exactly (the info series, floors, iteration counts, the last offloads and transitions, GPU totals, kills)
and of the others most samples keep their labels and move only their value (levels, peaks). A sample's
line is its name and labels, one space and floatToGoString(value) when it has no timestamp, exemplar or
native histogram: everything before the value, as the encoder wrote it, is kept for those labels and the
value formatted by prometheus_client's own floatToGoString. A sample the encoder has not written the
labels of, or not plain, goes through the encoder (the one it chose for the scraper's Accept header), as
a copy of its family holding only such samples, whose lines then take their places. The answer is, byte
for byte, what that encoder gives for the whole registry: tests/unit/test_metrics_exposition.py holds it
equal scrape after scrape, test_metrics_family_cache_property.py over random families, labels, values and
changes.
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
    # body's lines, its header then one a sample, when it is laid out as _lines expects; else None
    lines: list[bytes] | None
    header: int  # how many header lines lead
    all_plain: bool  # every sample plain (_plain): each line a prefix and a value
    plain: bool  # and none zero: equal samples give equal lines
    # (sample name, its labels' names and values) -> the prefix of its line as the encoder wrote it: the
    # plain samples of this family seen in this content type, from scrape to scrape.
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


def _remember(prefixes: dict, samples: list, lines: list[bytes]) -> None:
    """Puts the prefix of each plain sample's line in `prefixes`."""
    for sample, line in zip(samples, lines):
        if _plain(sample):
            prefixes[_key(sample)] = line[:line.rindex(b" ") + 1]


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
            if known is not None and known.lines is not None and known.source[:3] == source[:3]:
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
        return _Encoded(source, body, None, 0, False, False, prefixes)
    _remember(prefixes, samples, lines[header:])
    all_plain = all(map(_plain, samples))
    plain = all_plain and 0 not in [s[2] for s in samples]
    return _Encoded(source, body, lines, header, all_plain, plain, prefixes)


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
    samples, prefixes, header = family.samples, known.prefixes, known.header
    if _too_many(prefixes, samples):
        return None
    before, all_before_plain = known.source[3], known.all_plain
    out = known.lines[:header]
    append = out.append
    redo = []  # places in `out`
    all_plain = plain = True
    seen = prefixes.get
    # The samples at a place the previous scrape had, then the rest (zip stops at the shorter).
    for s, o, line in zip(samples, before, known.lines[header:]):
        name, labels, value, timestamp, exemplar, histogram = s
        if timestamp is None and exemplar is None and histogram is None and (type(value) is float or type(value) is int):
            if not value:
                plain = False
            if name == o[0] and labels == o[1] and (all_before_plain or _plain(o)):
                if value != o[2] or not value:  # a NaN is never equal: written again, rightly
                    line = line[:line.rindex(b" ") + 1] + floatToGoString(value).encode()
                append(line)
                continue
            prefix = seen(_key(s))
            if prefix is not None:
                append(prefix + floatToGoString(value).encode())
                continue
        else:
            all_plain = plain = False
        redo.append(len(out))
        append(b"")
    for s in samples[len(before):]:
        if _plain(s):
            if not s[2]:
                plain = False
            prefix = seen(_key(s))
            if prefix is not None:
                append(prefix + floatToGoString(s[2]).encode())
                continue
        else:
            all_plain = plain = False
        redo.append(len(out))
        append(b"")
    if 2 * len(redo) > len(samples):
        return None
    if redo:
        part = copy.copy(family)  # its name, help, type and unit: the same header
        part.samples = [samples[i - header] for i in redo]
        new, new_header = _lines(_one(part, encoder, openmetrics), len(redo))
        if new is None or new[:new_header] != out[:header]:
            return None
        _remember(prefixes, part.samples, new[new_header:])
        for i, line in zip(redo, new[new_header:]):
            out[i] = line
    return _Encoded(source, b"\n".join(out) + b"\n", out, header, all_plain, plain, prefixes)
