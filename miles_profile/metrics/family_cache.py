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
from operator import eq
from typing import Any, Callable, NamedTuple

# OpenMetrics ends the whole exposition with this line; an encoder run on one family writes it too.
OPENMETRICS_EOF = b"# EOF\n"
_PROBE = 8  # samples compared first (_changed_only)


class _OneFamily:
    """A registry holding one family, for prometheus_client's encoders (they only call collect())."""

    def __init__(self, family: Any):
        self._family = family

    def collect(self) -> list:
        return [self._family]


class _Encoded(NamedTuple):
    source: tuple  # (type, documentation, unit, samples) the bytes were encoded from
    body: bytes


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
    return lines, header


class FamilyCache:
    """Encodes a registry's families with `encoder`, reusing a family's bytes while its samples are
    equal to those it was encoded from, and a sample's line while that sample is equal to the one at
    its place before. Safe for two scrapes at once: both may encode a family, either result is right."""

    def __init__(self) -> None:
        self._encoded: dict[tuple[str, str], _Encoded] = {}  # (content type, family name) -> its last encoding

    def encode(self, registry: Any, encoder: Callable[[Any], bytes], content_type: str) -> bytes:
        openmetrics = content_type.startswith("application/openmetrics-text")
        parts = []
        for family in registry.collect():
            key = (content_type, family.name)
            source = (family.type, family.documentation, family.unit, family.samples)
            known = self._encoded.get(key)
            if known is not None and known.source == source:  # a NaN is never equal: encoded again, rightly
                parts.append(known.body)
                continue
            encoded = None
            if known is not None and known.source[:3] == source[:3] and len(known.source[3]) == len(family.samples):
                encoded = _changed_only(family, source, known, encoder, openmetrics)
            if encoded is None:
                encoded = _Encoded(source, _one(family, encoder, openmetrics))
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


def _changed_only(family: Any, source: tuple, known: _Encoded, encoder: Callable[[Any], bytes],
                  openmetrics: bool) -> _Encoded | None:
    """`family` with the lines of the samples unequal to the previous ones at their place encoded anew,
    the others kept; None when most changed (encoding the whole family costs less than splicing it) or
    a body is not laid out as _lines expects."""
    samples, before = family.samples, known.source[3]
    # A family whose first samples all changed (levels and peaks, every scrape) is encoded whole without
    # comparing the rest: comparing 2,000 samples costs 0.8 ms on the development VM.
    if len(samples) > 2 * _PROBE and not any(map(eq, samples[:_PROBE], before[:_PROBE])):
        return None
    changed = [i for i, same in enumerate(map(eq, samples, before)) if not same]
    if 2 * len(changed) > len(samples):
        return None
    lines, header = _lines(known.body, len(samples))
    if lines is None:
        return None
    part = copy.copy(family)  # its name, help, type and unit: the same header
    part.samples = [samples[i] for i in changed]
    new, new_header = _lines(_one(part, encoder, openmetrics), len(changed))
    if new is None or new[:new_header] != lines[:header]:
        return None
    for k, i in enumerate(changed, start=header):
        lines[header + i] = new[k]
    lines.append(b"")
    return _Encoded(source, b"\n".join(lines))
