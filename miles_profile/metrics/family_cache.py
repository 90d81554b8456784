"""prometheus_client's encoder run a family at a time, the bytes of a family kept with its samples and
answered again while its samples stay the same.

prometheus_client encodes every sample of every family at every scrape, about 6.5 us a sample on the
development VM (docs/prometheus.md, Cost), although between two scrapes a second apart most families of
a host repeat exactly: the info series, floors, iteration counts, the last offloads and transitions,
GPU totals, kills. Each family is still encoded by prometheus_client's own encoder (the one it chose
for the scraper's Accept header), alone; the answer is, byte for byte, what that encoder gives for the
whole registry (tests/unit/test_metrics_exposition.py holds them equal scrape after scrape).
"""
from __future__ import annotations

from typing import Any, Callable

# OpenMetrics ends the whole exposition with this line; an encoder run on one family writes it too.
OPENMETRICS_EOF = b"# EOF\n"


class _OneFamily:
    """A registry holding one family, for prometheus_client's encoders (they only call collect())."""

    def __init__(self, family: Any):
        self._family = family

    def collect(self) -> list:
        return [self._family]


class FamilyCache:
    """Encodes a registry's families with `encoder`, reusing a family's bytes while its samples are
    equal to those it was encoded from. Safe for two scrapes at once: both may encode a family, either
    result is right."""

    def __init__(self) -> None:
        # (content type, family name) -> (what the bytes were encoded from, the bytes)
        self._encoded: dict[tuple[str, str], tuple[tuple, bytes]] = {}

    def encode(self, registry: Any, encoder: Callable[[Any], bytes], content_type: str) -> bytes:
        openmetrics = content_type.startswith("application/openmetrics-text")
        parts = []
        for family in registry.collect():
            key = (content_type, family.name)
            source = (family.type, family.documentation, family.unit, family.samples)
            known = self._encoded.get(key)
            if known is not None and known[0] == source:  # a NaN is never equal: encoded again, rightly
                parts.append(known[1])
                continue
            body = encoder(_OneFamily(family))
            if openmetrics and body.endswith(OPENMETRICS_EOF):
                body = body[:-len(OPENMETRICS_EOF)]
            self._encoded[key] = (source, body)
            parts.append(body)
        if openmetrics:
            parts.append(OPENMETRICS_EOF)
        return b"".join(parts)
