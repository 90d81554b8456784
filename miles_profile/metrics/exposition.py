"""The exposition: one host's reading as Prometheus text (0.0.4) or OpenMetrics 1.0 (docs/prometheus.md
lists every series).

Names follow Prometheus' rules and the OpenTelemetry-to-Prometheus mapping (a metric `miles_profile.x`
in unit `By` becomes `miles_profile_x_bytes`, `s` becomes `_seconds`, a monotonic sum gets `_total`),
so an OTLP exporter added later gives the same names. Labels join dcgm-exporter's (`gpu`: NVML index,
`UUID`, `hostname`) plus ours (`rank`, `role`, `phase`, `tag`); no pid and nothing per iteration on a
fleet series: `miles_profile_process_info` alone maps (rank, role) to a pid.

Rendered here rather than by prometheus_client: its exposition validates and escapes every label name
of every sample (~25 us a sample on the loaded development VM, 40 ms for 64 processes), where a
process's label set is the same in all its samples and is built once a scrape. Label names are in
sorted order and values are integers where they are bytes or counts, as Prometheus parses them.
"""
from __future__ import annotations

import functools

from miles_profile.metrics.readings import HostReading
from miles_profile.oom import OOM_KILL, RAY_OOM_KILL, SIGKILL, VANISHED

# Every known cause is exported from 0, so `increase()` sees the first kill; others (a Ray cause) join as seen.
KILL_CAUSES = (OOM_KILL, SIGKILL, VANISHED, RAY_OOM_KILL)
P = "miles_profile_"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (name, type, help), in the order of the exposition. A counter's samples end in _total, an info's in _info.
FAMILIES = (
    ("gpu_memory_used_bytes", "gauge", "Device memory used on the GPU by every process (NVML)"),
    ("gpu_memory_total_bytes", "gauge", "Device memory of the GPU (NVML)"),
    ("process", "info", "One per recording process: maps (rank, role) to its pid and GPU"),
    ("process_phase", "gauge", "1 for the innermost phase the process is in now"),
    ("process_gpu_memory_allocated_bytes", "gauge", "Bytes the process's torch allocator gives to tensors on "
     "its GPU"),
    ("process_gpu_memory_reserved_bytes", "gauge", "Bytes the process's torch allocator holds from the driver "
     "(cached included)"),
    ("process_gpu_memory_used_bytes", "gauge", "Bytes NVML counts for the process on its GPU (allocator, CUDA "
     "context, libraries)"),
    ("process_resident_memory_bytes", "gauge", "Resident host memory (RSS) of the process"),
    ("process_gpu_memory_allocated_peak_bytes", "gauge", "True peak of allocator-allocated bytes since the "
     "previous scrape, per phase it was in (a spike between two scrapes is kept)"),
    ("process_resident_memory_peak_bytes", "gauge", "True peak of RSS (VmHWM) since the previous scrape, per "
     "phase it was in"),
    ("process_gpu_memory_allocated_floor_bytes", "gauge", "Lowest allocator-allocated bytes of the last "
     "complete iteration (rollout_id)"),
    ("process_resident_memory_floor_bytes", "gauge", "Lowest RSS of the last complete iteration"),
    ("process_iterations", "counter", "Iterations (rollout_id) the process completed"),
    ("transition_duration_seconds", "gauge", "Seconds the last instance of each offload, onload and weight "
     "update took"),
    ("offload_declared_bytes", "gauge", "expected_bytes the last offload of this phase and tag declared"),
    ("offload_freed_bytes", "gauge", "Bytes the last offload freed: the level right before it minus the level "
     "at its end, on the allocator (GPU) or RSS (host); negative when memory grew"),
    ("offload_verdict", "gauge", "1, labelled with the live verdict of the last offload (pass: freed at least "
     "80% of declared inside the phase; fail; too_small; n/a)"),
    ("offloads", "counter", "Offloads of this phase and tag that ended"),
    ("kills", "counter", "Processes of this host killed while recorded (OOM killer, SIGKILL, vanished without "
     "ending), by cause"),
)
_SUFFIX = {"gauge": "", "counter": "_total", "info": "_info"}


def _headers(openmetrics: bool) -> list[tuple[str, str]]:
    """(the lines before a family's samples, its samples' name) per family."""
    out = []
    for name, kind, text in FAMILIES:
        sample = P + name + _SUFFIX[kind]
        if openmetrics:  # the family's name without the suffix; info is a type of its own
            head, shown = P + name, kind
            text = text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        else:  # 0.0.4 names the family after its samples; an info is a gauge there
            head, shown = sample, "gauge" if kind == "info" else kind
            text = text.replace("\\", "\\\\").replace("\n", "\\n")
        out.append((f"# HELP {head} {text}\n# TYPE {head} {shown}\n", sample))
    return out


_HEADERS = {False: _headers(False), True: _headers(True)}


@functools.lru_cache(maxsize=4096)
def _esc(value: str) -> str:
    """A label value as the exposition quotes it (phase names and tags repeat: cached)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: int | float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


def render(host: HostReading, openmetrics: bool = False) -> bytes:
    """The whole exposition of one scrape. Lines are built per family as '{labels} value' and the
    family's sample name is put in front of all of them in one join."""
    h = f'hostname="{_esc(host.hostname)}"'
    samples: list[list[str]] = [[] for _ in FAMILIES]
    (used, total, info, phase, allocated, reserved, nvml_used, resident, peak_alloc, peak_rss, floor_alloc,
     floor_rss, iterations, transition, declared, freed, verdict, offloads, kills) = samples
    for g in host.gpus:
        labels = f'{{UUID="{_esc(g.uuid)}",gpu="{_esc(g.index)}",{h}}} '
        if g.used is not None:
            used.append(labels + str(g.used))
        if g.total is not None:
            total.append(labels + _num(g.total))
    for r in host.processes:
        rr = f'rank="{_esc(r.rank)}",role="{_esc(r.role)}"'
        gpu = f'UUID="{_esc(r.uuid)}",gpu="{_esc(r.gpu)}",{h}'
        ids, gpu_ids = f"{{{h},{rr}}} ", f"{{{gpu},{rr}}} "
        info.append(f'{{{gpu},pid="{r.pid}",{rr}}} 1')
        phase.append(f'{{{h},phase="{_esc(r.phase)}",{rr}}} 1')
        if r.allocated is not None:
            allocated.append(gpu_ids + str(r.allocated))
        if r.reserved is not None:
            reserved.append(gpu_ids + str(r.reserved))
        if r.nvml_used is not None:
            nvml_used.append(gpu_ids + str(r.nvml_used))
        if r.resident is not None:
            resident.append(ids + str(r.resident))
        for name, (alloc, rss) in sorted(r.peaks.items()):
            if alloc is not None:
                peak_alloc.append(f'{{{gpu},phase="{_esc(name)}",{rr}}} {alloc}')
            if rss is not None:
                peak_rss.append(f'{{{h},phase="{_esc(name)}",{rr}}} {rss}')
        if r.floor_allocated is not None:
            floor_alloc.append(gpu_ids + _num(r.floor_allocated))
        if r.floor_resident is not None:
            floor_rss.append(ids + _num(r.floor_resident))
        iterations.append(ids + str(r.iterations))
        for name, seconds in sorted(r.transitions.items()):
            transition.append(f'{{{h},phase="{_esc(name)}",{rr}}} {_num(seconds)}')
        for (name, tag), o in sorted(r.offloads.items()):
            labels = f'{h},phase="{_esc(name)}",{rr},tag="{_esc(tag)}"'
            if o.declared is not None:
                declared.append(f"{{{labels}}} {o.declared}")
            if o.freed is not None:
                freed.append(f"{{{labels}}} {o.freed}")
            # Only the current state: a scrape with 64 processes renders a sample per state otherwise.
            verdict.append(f'{{{labels},verdict="{_esc(o.verdict)}"}} 1')
            offloads.append(f"{{{labels}}} {o.count}")
    for cause, count in sorted({**dict.fromkeys(KILL_CAUSES, 0), **host.kills}.items()):
        kills.append(f'{{cause="{_esc(cause)}",{h}}} {count}')
    parts = []
    for (head, name), lines in zip(_HEADERS[openmetrics], samples):
        parts.append(head)
        if lines:
            parts.append(name + f"\n{name}".join(lines) + "\n")
    if openmetrics:
        parts.append("# EOF\n")
    return "".join(parts).encode()
