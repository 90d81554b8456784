"""FamilyCache (miles_profile/metrics/family_cache.py) answers, byte for byte, what prometheus_client's
own encoders write for the whole registry, for random families, labels and values and random sequences
of changes between scrapes: the reused lines, the lines whose prefix is kept with a new value after it
(floatToGoString), and the samples it hands to the encoder again (a timestamp, an exemplar, new labels,
a value that is not an int or float)."""
from __future__ import annotations

from functools import partial

import pytest

pytest.importorskip("prometheus_client")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from prometheus_client import exposition  # noqa: E402
from prometheus_client.metrics_core import Metric  # noqa: E402
from prometheus_client.openmetrics import exposition as openmetrics  # noqa: E402
from prometheus_client.samples import Exemplar, Sample, Timestamp  # noqa: E402

from miles_profile.metrics.family_cache import FamilyCache  # noqa: E402

# (encoder, the content type the endpoint keys it by): OpenMetrics 1.0 as Prometheus 2.x asks for it
# (underscores) and as the endpoint answers it (allow-utf-8), and the text format 0.0.4.
ENCODERS = [
    (partial(openmetrics.generate_latest, escaping=openmetrics.UNDERSCORES, version="1.0.0"),
     "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"),
    (partial(openmetrics.generate_latest, escaping=openmetrics.ALLOWUTF8, version="1.0.0"),
     "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=allow-utf-8"),
    (exposition.generate_latest, exposition.CONTENT_TYPE_PLAIN_0_0_4),
]
LABEL_NAMES = ["hostname", "rank", "phase", "gpu", "UUID", "le", "a.b", "ü", "9x"]
TEXT = st.text(alphabet=st.sampled_from(['"', "\\", "\n", " ", "a", "Z", "0", "{", "}", "=", ",", "é", "ß",
                                         "\u2603", "\U0001f600", "#"]), max_size=6)
VALUES = st.one_of(
    st.sampled_from([0, 0.0, -0.0]), st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70),
    st.sampled_from([0, 0.0, -0.0, 1, 1.0, 1e16, 1e-300, 5e-324, 1.7976931348623157e308, 123456789.0, 2**53 + 1]))
FAMILIES = [("g", "gauge", ""), ("c", "counter", ""), ("u", "unknown", ""), ("m_bytes", "gauge", "bytes"),
            ("i", "info", ""), ("s", "stateset", "")]
SAMPLE_SUFFIXES = {"counter": ["_total", "_created"], "info": ["_info"]}


@st.composite
def samples(draw, family: tuple[str, str, str]) -> Sample:
    name, kind, _ = family
    suffix = draw(st.sampled_from(SAMPLE_SUFFIXES.get(kind, [""])))
    labels = {k: draw(TEXT) for k in draw(st.lists(st.sampled_from(LABEL_NAMES), max_size=3, unique=True))}
    timestamp = draw(st.one_of(st.none(), st.none(), st.integers(0, 2**40), st.floats(0, 1e10),
                               st.builds(Timestamp, st.integers(0, 2**31), st.integers(0, 10**9 - 1))))
    exemplar = None
    if suffix == "_total" and draw(st.integers(0, 4)) == 0:
        exemplar = Exemplar({"trace_id": draw(TEXT)}, draw(VALUES), draw(st.one_of(st.none(), st.floats(0, 1e10))))
    return Sample(name + suffix, labels, draw(VALUES), timestamp, exemplar)


def _changed(draw, family: tuple[str, str, str], sample: Sample) -> list[Sample]:
    """The sample at the next scrape: the same or a new value mostly; at times an equal value written
    otherwise (0.0 and -0.0, 1 and 1.0, a timestamp 5 and 5.0), the same label values under other
    names, new labels, a timestamp, an exemplar or a value of another type, gone, or followed by the
    same series with a timestamp or by a new sample."""
    what = draw(st.integers(0, 11))
    value = sample.value
    if what <= 1:
        return [sample]
    if what <= 4:
        return [sample._replace(value=draw(VALUES))]
    if what == 5:  # equal, maybe written otherwise
        if type(value) in (int, float) and value == 0:  # the other sign
            return [sample._replace(value=0.0 if str(value) == "-0.0" else -0.0)]
        if type(value) is float and value.is_integer() and abs(value) < 2**53:
            return [sample._replace(value=int(value))]
        if type(value) is int and abs(value) < 2**53:
            return [sample._replace(value=float(value))]
        return [sample._replace(timestamp=None if sample.timestamp is None else float(sample.timestamp))]
    if what == 6:  # the same label values under other names
        names = draw(st.permutations(LABEL_NAMES))[:len(sample.labels)]
        return [sample._replace(labels=dict(zip(names, sample.labels.values())))]
    if what == 7:
        return [draw(samples(family))]
    if what == 8:
        return []
    if what == 9:
        return [sample._replace(timestamp=draw(st.sampled_from([5, 5.0, None])))]
    if what == 10:  # followed by the same series with a timestamp
        return [sample, sample._replace(timestamp=draw(st.sampled_from([5, 5.0])))]
    return [sample._replace(value=draw(st.sampled_from([True, "1.5", 2.5]))), draw(samples(family))]


class _Registry:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _family(family: tuple[str, str, str], doc: str, those: list[Sample]) -> Metric:
    name, kind, unit = family
    metric = Metric(name[:-len("_" + unit)] if unit else name, doc, kind, unit)
    metric.samples = those
    return metric


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_cache_writes_prometheus_clients_bytes(data):
    kinds = data.draw(st.lists(st.sampled_from(FAMILIES), min_size=1, max_size=3, unique=True))
    docs = {f: data.draw(TEXT) for f in kinds}
    now = {f: data.draw(st.lists(samples(f), max_size=5)) for f in kinds}
    cache = FamilyCache()
    for scrape in range(data.draw(st.integers(2, 6))):
        if scrape and data.draw(st.booleans()):  # each sample may change
            now = {f: [s for old in those for s in _changed(data.draw, f, old)] for f, those in now.items()}
        elif scrape:  # one sample of one family changes (or all go, or move), the rest stays equal
            f = data.draw(st.sampled_from(kinds))
            what = data.draw(st.integers(0, 5))
            if what == 0:
                now[f] = []
            elif what == 1:  # every series at another place: their prefixes remembered
                now[f] = [s._replace(value=data.draw(VALUES)) for s in reversed(now[f])]
            elif now[f]:
                i = data.draw(st.integers(0, len(now[f]) - 1))
                now[f] = [*now[f][:i], *_changed(data.draw, f, now[f][i]), *now[f][i + 1:]]
        for encoder, content_type in ENCODERS:
            # A new registry of new families each scrape, as the endpoint's collector builds them.
            registry = _Registry([_family(f, docs[f], list(now[f])) for f in kinds])
            try:
                theirs = encoder(registry)
            except (ValueError, TypeError):
                continue  # prometheus_client refuses it (a str value, an exemplar too long): not an exposition
            assert cache.encode(registry, encoder, content_type) == theirs, (content_type, scrape)
