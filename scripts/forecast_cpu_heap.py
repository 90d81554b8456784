"""The CPU forecast against glibc's count of heap bytes in use, per phase.

    PYTHONPATH=. python scripts/forecast_cpu_heap.py [trainer flags]
        (default: the flags of sample_logs/cpu, i.e. --preset cpu --num-rollout 3 and every offload)

A CPU run has no allocator counter like CUDA's `memory_allocated`, and RSS also holds library pages,
thread stacks and freed heap glibc keeps. glibc's `mallinfo2()` counts the bytes malloc has handed
out and not had back (`uordblks` in the arenas + `hblkhd` in mmapped chunks), which is what torch's
CPU tensors are made of. This runs the trainer in this process under a Recorder (for the phases)
while a thread polls that count every millisecond; the measured value per phase is its highest
reading minus the reading before the trainer started. Before that reading one tiny model is built on
the meta device: torch's one-time lazy initialisation mallocs 23.5 MiB at the first module built in
a process (measured here; a second model costs 0.08 MiB), a cost of the process like its libraries,
which the forecast leaves out. Each phase is also read as it opens and closes (`mp.phase` is wrapped
here), so a phase of a few milliseconds whose peak is its start (a release) is not missed; a spike
shorter than the poll interval inside a phase still can be. Linux with glibc only.
"""
from __future__ import annotations

import contextlib
import ctypes
import sys
import tempfile
import threading
import time

import torch

import miles_profile as mp
from trainer.args import parse_args
from trainer.config import PRESETS, model_config
from trainer.model import GPT
from trainer.plan import forecast
from trainer.train import run

GiB = 1024**3
DEFAULT = ["--preset", "cpu", "--num-rollout", "3", "--offload-train", "--offload-rollout",
           "--colocate-memory-peak-device", "gpu", "--offload-rollout-level", "kv_cache", "weight",
           "--optimizer-cpu-offload", "--offload-train-target", "disk", "--offload-train-disk-dir"]


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap_in_use() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def measure(argv: list[str], interval_s: float = 0.001) -> tuple[dict[str, int], object]:
    cfg = parse_args(argv, cuda_available=False)
    peaks: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as log_dir, mp.Recorder(log_dir) as recorder:
        with torch.device("meta"):
            GPT(model_config(PRESETS["tiny"], PRESETS["tiny"].digits))  # torch's lazy init, before the baseline
        baseline = heap_in_use()
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                phase, value = recorder.current_phase(), heap_in_use() - baseline
                if phase:
                    peaks[phase] = max(peaks.get(phase, 0), value)
                time.sleep(interval_s)

        real_phase = mp.phase

        @contextlib.contextmanager
        def phase(name, **attrs):  # the level as the phase opens and as it closes
            with real_phase(name, **attrs) as opened:
                peaks[name] = max(peaks.get(name, 0), heap_in_use() - baseline)
                yield opened
                peaks[name] = max(peaks.get(name, 0), heap_in_use() - baseline)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        mp.phase = phase  # trainer/train.py calls mp.phase at each step
        try:
            run(cfg)
        finally:
            mp.phase = real_phase
            stop.set()
            thread.join()
    return peaks, forecast(cfg)


def main(argv: list[str]) -> int:
    if not argv:
        argv = DEFAULT + [tempfile.mkdtemp(prefix="forecast-heap-")]
    peaks, plan = measure(argv)
    print("| phase | forecast GiB | heap in use GiB | error |\n|---|---:|---:|---:|")
    worst = 0.0
    for p in plan.phases:
        if p.device != "host" or p.phase not in peaks:
            continue
        error = (p.peak - peaks[p.phase]) / peaks[p.phase]
        worst = max(worst, abs(error), key=abs)
        print(f"| {p.phase} | {p.peak / GiB:.3f} | {peaks[p.phase] / GiB:.3f} | {error:+.1%} |")
    print(f"\nworst |error|: {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
