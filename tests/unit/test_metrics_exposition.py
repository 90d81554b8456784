"""The exposition of families.py as the endpoint serves it (prometheus_client's encoder for what the
scraper asks, OpenMetrics or text 0.0.4): prometheus_client's own parsers (the strict OpenMetrics one and
the 0.0.4 text one) read back every family, in order, and every series with its labels and value,
escapes included."""
from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from miles_profile.metrics.families import P, families
from miles_profile.metrics.readings import GpuReading, HostReading, Offload, ProcessReading
from miles_profile.metrics.server import metrics_app

GiB = 1024**3
# Every family in the exposition's order, even one with no sample (no process has a floor yet, say).
FAMILIES = (("gpu_memory_used_bytes", "gauge"), ("gpu_memory_total_bytes", "gauge"), ("process", "info"),
            ("process_phase", "gauge"), ("process_gpu_memory_allocated_bytes", "gauge"),
            ("process_gpu_memory_reserved_bytes", "gauge"), ("process_gpu_memory_used_bytes", "gauge"),
            ("process_resident_memory_bytes", "gauge"), ("process_gpu_memory_allocated_peak_bytes", "gauge"),
            ("process_resident_memory_peak_bytes", "gauge"), ("process_gpu_memory_allocated_floor_bytes", "gauge"),
            ("process_resident_memory_floor_bytes", "gauge"), ("process_iterations", "counter"),
            ("transition_duration_seconds", "gauge"), ("offload_declared_bytes", "gauge"),
            ("offload_freed_bytes", "gauge"), ("offload_verdict", "gauge"),
            ("kills", "counter"))
# What Debian's Prometheus 2.42 asks for, and a scraper that asks for nothing in particular (curl).
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def render(reading: HostReading, accept: str) -> tuple[str, str]:
    """(content type, body) as the endpoint answers a scraper sending `accept`."""
    class One:
        def collect(self):
            return families(reading)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())
    encoder, content_type = choose_encoder(accept)
    return content_type, encoder(registry).decode()
UUID = "GPU-0e4b1a2c-0000"


def _reading() -> HostReading:
    odd = ProcessReading(rank="1", role='quo"te\\back\nline', pid=42, gpu="0", uuid=UUID, phase="train",
                         allocated=3 * GiB, reserved=4 * GiB, nvml_used=5 * GiB, resident=GiB,
                         peaks={"train": (6 * GiB, 2 * GiB), "offload_train": (None, 3 * GiB)},
                         floor_allocated=GiB, floor_resident=GiB // 2, iterations=7,
                         offloads={("offload_train", "train_state"): Offload(2 * GiB, -5, "allocated", "fail", 3)},
                         transitions={"offload_train": 0.125})
    # before CUDA: no GPU named yet, its allocator read as 0 (seen on an H100): no GPU series until it names one
    plain = ProcessReading(rank="0", role="actor", pid=41, allocated=0, reserved=0, peaks={"none": (0, GiB)})
    return HostReading(hostname="node-1", gpus=[GpuReading("0", UUID, 80 * GiB, 70 * GiB)],
                       processes=[odd, plain], kills={"oom_kill": 2})


def _samples(families) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


@pytest.mark.parametrize("openmetrics", [True, False], ids=["openmetrics", "text-0.0.4"])
def test_prometheus_client_reads_back_every_series(openmetrics):
    content_type, body = render(_reading(), PROMETHEUS_ACCEPT if openmetrics else "")
    assert content_type.startswith("application/openmetrics-text" if openmetrics else "text/plain; version=0.0.4")
    parsed = list((parse_openmetrics if openmetrics else parse_text)(body))
    kinds = {"info": "info" if openmetrics else "gauge", "counter": "counter", "gauge": "gauge"}
    assert [(f.name, f.type) for f in parsed] == [
        (P + name + ("_info" if kind == "info" and not openmetrics else ""), kinds[kind]) for name, kind in FAMILIES]
    got = _samples(parsed)
    role = 'quo"te\\back\nline'
    odd, gpu = (("hostname", "node-1"), ("rank", "1"), ("role", role)), (("UUID", UUID), ("gpu", "0"))

    def at(name, *labels):
        return got[(P + name, tuple(sorted(labels)))]

    assert at("gpu_memory_used_bytes", ("hostname", "node-1"), *gpu) == 70 * GiB
    assert at("process_info", *odd, *gpu, ("pid", "42")) == 1
    assert at("process_info", ("hostname", "node-1"), ("rank", "0"), ("role", "actor"), ("pid", "41"), ("UUID", ""),
              ("gpu", "")) == 1
    assert not [k for k in got if k[0].startswith(P + "process_gpu_") and ("rank", "0") in k[1]]
    assert at("process_phase", *odd, ("phase", "train")) == 1
    assert at("process_gpu_memory_allocated_bytes", *odd, *gpu) == 3 * GiB
    assert at("process_gpu_memory_used_bytes", *odd, *gpu) == 5 * GiB
    assert at("process_resident_memory_bytes", *odd) == GiB
    assert at("process_gpu_memory_allocated_peak_bytes", *odd, *gpu, ("phase", "train")) == 6 * GiB
    assert at("process_resident_memory_peak_bytes", *odd, ("phase", "offload_train")) == 3 * GiB
    assert (P + "process_gpu_memory_allocated_peak_bytes", tuple(sorted((*odd, *gpu, ("phase", "offload_train"))))) \
        not in got  # nothing measured: absent, never 0
    assert at("process_resident_memory_floor_bytes", *odd) == GiB // 2
    assert at("process_iterations_total", *odd) == 7
    assert at("transition_duration_seconds", *odd, ("phase", "offload_train")) == 0.125
    offload = (*odd, ("phase", "offload_train"), ("tag", "train_state"))
    assert (at("offload_declared_bytes", *offload), at("offload_freed_bytes", *offload)) == (2 * GiB, -5)
    assert at("offload_verdict", *offload, ("verdict", "fail")) == 1
    assert not [k for k in got if k[0] == P + "offloads_total"]  # iterations count them
    assert {k[1][0][1]: v for k, v in got.items() if k[0] == P + "kills_total"} == {
        "oom_kill": 2, "sigkill": 0, "vanished": 0, "ray_oom_kill": 0}
    # Bytes are exact on the wire (prometheus_client writes them as Go writes a float64: 8.589934592e+10).
    assert at("gpu_memory_total_bytes", ("hostname", "node-1"), *gpu) == 80 * GiB
    assert body.endswith("# EOF\n") == openmetrics


def _answer(app, accept: str, query: str = "", method: str = "GET") -> tuple[str, list, bytes]:
    got = {}

    def start_response(status, headers, exc_info=None):
        got.update(status=status, headers=headers)
    environ = {"REQUEST_METHOD": method, "PATH_INFO": "/metrics", "QUERY_STRING": query, "HTTP_ACCEPT": accept}
    body = b"".join(app(environ, start_response))
    return got["status"], got["headers"], body


def _registry_of(readings: list[HostReading]) -> CollectorRegistry:
    """A registry whose collector renders readings[0] (the test swaps it between scrapes)."""
    class One:
        def collect(self):
            return families(readings[0])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())
    return registry


def _many(processes: int = 64) -> HostReading:
    many = _reading()
    many.processes = [dataclasses.replace(many.processes[0], rank=str(k), pid=100 + k) for k in range(processes)]
    return many


def test_prometheus_2_gets_the_answer_it_asked_for_from_the_cheaper_encoder():
    """metrics_app answers Prometheus 2.x's OpenMetrics request (escaping `underscores`, named or not) with
    prometheus_client's `allow-utf-8` encoder: the same status, headers and bytes as prometheus_client's own
    app gives for every Accept (what each costs: bench/metrics_first_scrape.py prints it, side by side)."""
    registry = _registry_of([_reading()])
    ours, theirs = metrics_app(registry), make_wsgi_app(registry, disable_compression=True)
    for accept in (PROMETHEUS_ACCEPT, "", "application/openmetrics-text;version=1.0.0;escaping=underscores",
                   "application/openmetrics-text; version=1.0.0; escaping=allow-utf-8",
                   "application/openmetrics-text;version=1.0.0;escaping=dots", "text/plain;version=0.0.4",
                   "application/openmetrics-text;version=0.0.1,application/openmetrics-text;version=1.0.0;q=0.5",
                   "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8,application/openmetrics-text",
                   "application/openmetrics-text"):
        assert _answer(ours, accept) == _answer(theirs, accept), accept
        assert _answer(ours, accept) == _answer(theirs, accept), accept  # the second time from the cache
    for query, method in (("name[]=miles_profile_process_phase", "GET"), ("job=x", "GET"), ("", "OPTIONS"),
                          ("", "POST")):
        assert _answer(ours, PROMETHEUS_ACCEPT, query, method) == _answer(theirs, PROMETHEUS_ACCEPT, query, method)



def test_a_family_is_encoded_again_only_when_its_samples_change():
    """Scrape after scrape, as samples change, appear and go, the answer is prometheus_client's own, byte
    for byte (what a repeated scrape costs: bench/metrics_first_scrape.py)."""
    readings = [_reading()]
    registry = _registry_of(readings)
    ours, theirs = metrics_app(registry), make_wsgi_app(registry, disable_compression=True)
    moved = _reading()
    moved.processes[0].allocated += 1  # one sample of one family
    moved.processes[0].transitions["onload_train"] = 0.5  # a new series
    fewer = _reading()
    fewer.processes.pop(0)
    fewer.gpus[0].used = float("nan")  # never equal to itself: encoded every time
    for reading in (_reading(), moved, moved, fewer, fewer, _reading()):
        readings[0] = reading
        for accept in (PROMETHEUS_ACCEPT, "", "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8"):
            assert _answer(ours, accept) == _answer(theirs, accept), accept



def test_only_the_samples_that_changed_are_encoded_again():
    """Of a family where a few samples changed, only those whose labels are new (another transition
    ended, the process entered another phase) go through the encoder again; those whose value alone
    moved (a level, a NaN floor, a transition's seconds) keep their line's prefix with the new value
    after it; the answer is still prometheus_client's own, byte for byte, label values with escapes
    included, in OpenMetrics and text 0.0.4 (test_metrics_family_cache_property.py: for any family)."""
    from miles_profile.metrics.family_cache import FamilyCache

    readings = [_many(20)]
    registry = _registry_of(readings)
    theirs = make_wsgi_app(registry, disable_compression=True)
    moved = _many(20)
    moved.processes[5] = dataclasses.replace(moved.processes[5], transitions={"onload_weights": 0.5})
    moved.processes[7] = dataclasses.replace(moved.processes[7], transitions={"offload_train": 0.5})
    moved.processes[9] = dataclasses.replace(moved.processes[9], allocated=1, floor_resident=float("nan"),
                                             phase="rollout")
    for accept in (PROMETHEUS_ACCEPT, ""):
        unescaped = accept.replace("version=1.0.0,", "version=1.0.0;escaping=allow-utf-8,", 1)
        real, content_type = choose_encoder(unescaped)
        encoded: list[int] = []

        def encoder(one, real=real, encoded=encoded):
            encoded.append(sum(len(f.samples) for f in one.collect()))
            return real(one)
        cache = FamilyCache()
        for reading, samples in ((_many(20), None), (moved, 2), (moved, 0), (_many(20), 0)):
            readings[0] = reading
            encoded.clear()
            body = cache.encode(registry, encoder, content_type)
            assert body == _answer(theirs, unescaped)[2], (accept, reading is moved)
            # A transition's and a phase's new labels; none again (the NaN's line spliced), nor back to the
            # labels seen before (their lines remembered).
            if samples is not None:
                assert sum(encoded) == samples, encoded
