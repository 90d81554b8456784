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
    lines: list[bytes] | None  # body's lines, header first then one a sample (_lines); None: not laid out so
    header: int  # how many header lines lead
    plain: bool  # every sample plain (_plain) and none zero: equal samples give equal lines


def _plain(sample: Any) -> bool:
    """True when prometheus_client's encoders write `sample`'s line as its name and labels, one space and
    floatToGoString(value), nothing after: no timestamp, exemplar or native histogram, and a value of
    int or float (whose equal values give one float, hence one string, but for the sign of a zero)."""
    return (sample[3] is None and sample[4] is None and sample[5] is None
            and (type(sample[2]) is float or type(sample[2]) is int))


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
    it is equal to the one at its place before, that line's prefix with the new value after it where
    only the value moved (_spliced). Safe for two scrapes at once: both may encode a family, either
    result is right."""

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
                encoded = _whole(family, source, encoder, openmetrics)
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


def _is_plain(samples: list) -> bool:
    """Every sample plain and none zero (0.0 and -0.0 are equal, written apart)."""
    return all(map(_plain, samples)) and 0 not in [s[2] for s in samples]


def _whole(family: Any, source: tuple, encoder: Callable[[Any], bytes], openmetrics: bool) -> _Encoded:
    body = _one(family, encoder, openmetrics)
    lines, header = _lines(body, len(family.samples))
    return _Encoded(source, body, lines, header, _is_plain(family.samples))


def _spliced(family: Any, source: tuple, known: _Encoded, encoder: Callable[[Any], bytes],
             openmetrics: bool) -> _Encoded | None:
    """`family` from the lines of `known`: a sample equal to the one at its place before keeps that line;
    one whose name and labels are that one's and both plain (_plain) keeps the line's prefix, everything up
    to its value, as the encoder wrote it, followed by the new value formatted by prometheus_client's own
    floatToGoString (the value, the last thing on a plain line, never holds a space); the others are
    encoded anew, as a copy of the family holding only them, and their lines put at their places. None
    when most samples need the encoder (encoding the whole family costs less than splicing it) or a body
    is not laid out as _lines expects."""
    samples, before, lines, header = family.samples, known.source[3], known.lines, known.header
    out = lines[:header]
    redo = []
    for i, (s, o) in enumerate(zip(samples, before), start=header):
        if s[:2] == o[:2] and _plain(s) and _plain(o):
            value = s[2]
            line = lines[i]
            if value != o[2] or not value:  # a zero's sign may differ between equal values: written again
                line = line[:line.rindex(b" ") + 1] + floatToGoString(value).encode()
            out.append(line)
        else:
            redo.append(i - header)
            out.append(b"")
    redo.extend(range(len(before), len(samples)))
    out.extend(b"" for _ in range(len(before), len(samples)))
    if 2 * len(redo) > len(samples):
        return None
    if redo:
        part = copy.copy(family)  # its name, help, type and unit: the same header
        part.samples = [samples[i] for i in redo]
        new, new_header = _lines(_one(part, encoder, openmetrics), len(redo))
        if new is None or new[:new_header] != out[:header]:
            return None
        for k, i in enumerate(redo, start=new_header):
            out[header + i] = new[k]
    body = b"\n".join(out) + b"\n"
    return _Encoded(source, body, out, header, _is_plain(samples))
