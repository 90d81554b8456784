"""The exposition: one host's reading as Prometheus metric families (docs/prometheus.md lists them).

Names follow Prometheus' rules and the OpenTelemetry-to-Prometheus mapping (a metric `miles_profile.x`
in unit `By` becomes `miles_profile_x_bytes`, `s` becomes `_seconds`, a monotonic sum gets `_total`),
so an OTLP exporter added later gives the same names. Labels join dcgm-exporter's (`gpu`: NVML index,
`UUID`, `hostname`) plus ours (`rank`, `role`, `phase`, `tag`); no pid and nothing per iteration on a
fleet series: `miles_profile_process_info` alone maps (rank, role) to a pid.

Built once a scrape by server.py's collector, a sample at a time as prometheus_client's `Sample` (its
labels as one dict; `add_sample`, which does the same, is internal to prometheus_client and a call
more a sample); prometheus_client's encoder renders them in the format the scraper asked for (most of a scrape's
time: docs/prometheus.md).
"""
from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.samples import Sample

from miles_profile.metrics.readings import HostReading
from miles_profile.oom import OOM_KILL, RAY_OOM_KILL, SIGKILL, VANISHED

# Every known cause is exported from 0, so `increase()` sees the first kill; others (a Ray cause) join as seen.
KILL_CAUSES = (OOM_KILL, SIGKILL, VANISHED, RAY_OOM_KILL)

P = "miles_profile_"
PROCESS = ["hostname", "rank", "role"]
PROCESS_GPU = [*PROCESS, "gpu", "UUID"]


def families(host: HostReading) -> Iterator[Metric]:
    yield from _gpus(host)
    yield from _processes(host)
    yield from _offloads(host)
    kills = CounterMetricFamily(P + "kills", "Processes of this host killed while recorded (OOM killer, SIGKILL, "
                                "vanished without ending), by cause", labels=["hostname", "cause"])
    for cause, count in sorted({**dict.fromkeys(KILL_CAUSES, 0), **host.kills}.items()):
        kills.add_metric([host.hostname, cause], count)
    yield kills


def _gpus(host: HostReading) -> Iterator[Metric]:
    used = GaugeMetricFamily(P + "gpu_memory_used_bytes", "Device memory used on the GPU by every process (NVML)",
                             labels=["hostname", "gpu", "UUID"])
    total = GaugeMetricFamily(P + "gpu_memory_total_bytes", "Device memory of the GPU (NVML)",
                              labels=["hostname", "gpu", "UUID"])
    for g in host.gpus:
        if g.used is not None:
            used.add_metric([host.hostname, g.index, g.uuid], g.used)
        if g.total is not None:
            total.add_metric([host.hostname, g.index, g.uuid], g.total)
    yield used
    yield total


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, doc, labels=labels)


def _processes(host: HostReading) -> Iterator[Metric]:
    h = host.hostname
    info = InfoMetricFamily(P + "process", "One per recording process: maps (rank, role) to its pid and GPU",
                            labels=PROCESS)
    phase = _gauge("process_phase", "1 for the innermost phase the process is in now", [*PROCESS, "phase"])
    current = {
        "allocated": _gauge("process_gpu_memory_allocated_bytes", "Bytes the process's torch allocator gives to "
                            "tensors on its GPU", PROCESS_GPU),
        "reserved": _gauge("process_gpu_memory_reserved_bytes", "Bytes the process's torch allocator holds from "
                           "the driver (cached included)", PROCESS_GPU),
        "nvml_used": _gauge("process_gpu_memory_used_bytes", "Bytes NVML counts for the process on its GPU "
                            "(allocator, CUDA context, libraries)", PROCESS_GPU),
        "resident": _gauge("process_resident_memory_bytes", "Resident host memory (RSS) of the process", PROCESS),
    }
    peak_alloc = _gauge("process_gpu_memory_allocated_peak_bytes", "True peak of allocator-allocated bytes since "
                        "the previous scrape, per phase it was in (a spike between two scrapes is kept)",
                        [*PROCESS_GPU, "phase"])
    peak_rss = _gauge("process_resident_memory_peak_bytes", "True peak of RSS (VmHWM) since the previous scrape, "
                      "per phase it was in", [*PROCESS, "phase"])
    floor_alloc = _gauge("process_gpu_memory_allocated_floor_bytes", "Lowest allocator-allocated bytes of the "
                         "last complete iteration (rollout_id)", PROCESS_GPU)
    floor_rss = _gauge("process_resident_memory_floor_bytes", "Lowest RSS of the last complete iteration",
                       PROCESS)
    iterations = CounterMetricFamily(P + "process_iterations", "Iterations (rollout_id) the process completed",
                                     labels=PROCESS)
    transition = _gauge("transition_duration_seconds", "Seconds the last instance of each offload, onload and "
                        "weight update took", [*PROCESS, "phase"])
    for r in host.processes:
        # Label dicts given whole (a Sample): add_metric zips names and values again for every sample,
        # a third of building the families.
        ids = {"hostname": h, "rank": r.rank, "role": r.role}
        gpu_ids = {**ids, "gpu": r.gpu, "UUID": r.uuid}
        info.samples.append(Sample(info.name + "_info", {**ids, "pid": str(r.pid), "gpu": r.gpu, "UUID": r.uuid}, 1))
        phase.samples.append(Sample(phase.name, {**ids, "phase": r.phase}, 1))
        # A GPU series only once the process names its GPU: before CUDA starts its allocator reads 0 with no UUID,
        # a series that would join nothing in DCGM's and be replaced by the labelled one seconds later.
        on_gpu = bool(r.uuid)
        for attr, family in current.items():
            value = getattr(r, attr)
            if value is not None and (on_gpu or attr == "resident"):
                family.samples.append(Sample(family.name, ids if attr == "resident" else gpu_ids, value))
        for name, (alloc, rss) in sorted(r.peaks.items()):
            if alloc is not None and on_gpu:
                peak_alloc.samples.append(Sample(peak_alloc.name, {**gpu_ids, "phase": name}, alloc))
            if rss is not None:
                peak_rss.samples.append(Sample(peak_rss.name, {**ids, "phase": name}, rss))
        if r.floor_allocated is not None and on_gpu:
            floor_alloc.samples.append(Sample(floor_alloc.name, gpu_ids, r.floor_allocated))
        if r.floor_resident is not None:
            floor_rss.samples.append(Sample(floor_rss.name, ids, r.floor_resident))
        iterations.samples.append(Sample(iterations.name + "_total", ids, r.iterations))
        for name, seconds in sorted(r.transitions.items()):
            transition.samples.append(Sample(transition.name, {**ids, "phase": name}, seconds))
    yield from (info, phase, *current.values(), peak_alloc, peak_rss, floor_alloc, floor_rss, iterations, transition)


def _offloads(host: HostReading) -> Iterator[Metric]:
    labels = [*PROCESS, "phase", "tag"]
    declared = _gauge("offload_declared_bytes", "expected_bytes the last offload of this phase and tag declared",
                      labels)
    freed = _gauge("offload_freed_bytes", "Bytes the last offload freed: the level right before it minus the "
                   "level at its end, on the allocator (GPU) or RSS (host); negative when memory grew", labels)
    verdict = _gauge("offload_verdict", "1, labelled with the live verdict of the last offload (pass: freed at least "
                     "80% of declared inside the phase; fail; too_small; n/a)", [*labels, "verdict"])
    for r in host.processes:
        for (name, tag), o in sorted(r.offloads.items()):
            ids = {"hostname": host.hostname, "rank": r.rank, "role": r.role, "phase": name, "tag": tag}
            if o.declared is not None:
                declared.samples.append(Sample(declared.name, ids, o.declared))
            if o.freed is not None:
                freed.samples.append(Sample(freed.name, ids, o.freed))
            # Only the current state: a scrape with 64 processes renders a sample per state otherwise.
            verdict.samples.append(Sample(verdict.name, {**ids, "verdict": o.verdict}, 1))
    # No count of offloads: in an RL loop each tag is offloaded once an iteration, which
    # process_iterations_total counts already; 2 samples a process that every scrape paid to encode.
    yield from (declared, freed, verdict)
