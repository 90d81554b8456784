"""The recorder's step-time overhead taken apart: each component switched off on its own, by the A/B
method of bench/overhead_ab.py (ABBA quads of short blocks, CUDA-event step times, bootstrap interval).

A = the recorder paused, B = running, for one recorder configuration at a time (a variant):
    all            the default recorder: the sampler thread and the host sampler thread
    no_allocator   without the allocator probe (stats and peak reset): disable=["torch_allocator"]
    no_nvml        without the sampler's NVML reads (device and per process; the host sampler still reads)
    no_nvml_anywhere  without any NVML read: neither the sampler's nor the host sampler's (which still reads
                   host memory and the cgroup)
    no_proc        without the process probe's /proc reads (its columns left empty)
    no_host        without the host sampler thread's reads (NVML of every GPU and process, host memory,
                   cgroup, deaths): it samples once at start, then sleeps
    no_flush       without the writer's flushes (every 3600 s instead of 0.5 s)
    wake_only      the sampler thread's wake-up and row append alone: every probe empty, no flush, no host
    external       no recorder in the job: a separate process samples it (`record --exec` style:
                   /proc of this process tree, NVML per process, host), paused by SIGSTOP
Pausing holds the sampler's and the host sampler's locks (their threads wait without running); the
external sampler is stopped with SIGSTOP. A variant's ratio minus `all`'s says what its component costs.

    PYTHONPATH=. python3 bench/overhead_dissect.py [--variants all no_nvml ...] [--blocks 200] [--block-ms 100]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import device, machine  # noqa: E402
from bench.overhead_ab import (_time_block, add_block_arguments, parse_block_arguments, ratio_interval,  # noqa: E402
                               warm_loop)
from miles_profile import host_sampler  # noqa: E402
from miles_profile.recorder import DEFAULT_INTERVAL_MS, Recorder  # noqa: E402

VARIANTS = ("all", "no_allocator", "no_nvml", "no_nvml_anywhere", "no_proc", "no_host", "no_flush", "wake_only",
            "external")
_NEVER_S = 3600.0


class _Empty:
    """A probe's stand-in that reads nothing (its columns stay empty)."""

    def __init__(self, probe):
        self.name, self.columns, self.partial_reads = probe.name, probe.columns, False
        self._width = len(probe.columns)

    def read(self, full: bool = True):
        return [None] * self._width

    def close(self) -> None:
        pass


class _Locks:
    """Pauses an in-process recorder by holding its sampler's and host sampler's locks."""

    def __init__(self, rec: Recorder):
        host = rec._host
        self._locks = [rec._sampler._lock] + ([host._lock] if host is not None and host.active else [])
        self._paused = False

    def set(self, running: bool) -> None:
        if running == self._paused:
            for lock in self._locks:
                lock.release() if running else lock.acquire()
            self._paused = not running

    def close(self) -> None:
        self.set(running=True)


class _External:
    """A recorder in another process sampling this one (`record --exec` style), paused by SIGSTOP."""

    def __init__(self, log_dir: Path, interval_ms: float):
        code = ("import sys, time; from miles_profile.recorder import Recorder; "
                f"Recorder({str(log_dir)!r}, child_pid={os.getpid()}, interval_ms={interval_ms}).start(); "
                "print('ready', flush=True); time.sleep(1e6)")
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        self._proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True)
        if self._proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the external sampler did not start")
        self._paused = False

    def set(self, running: bool) -> None:
        if running == self._paused:
            os.kill(self._proc.pid, signal.SIGCONT if running else signal.SIGSTOP)
            self._paused = not running

    def close(self) -> None:
        self.set(running=True)
        self._proc.terminate()
        self._proc.wait(timeout=30)


def _start(variant: str, log_dir: Path, interval_ms: float):
    """The paused-or-running handle of one variant's recorder."""
    if variant == "external":
        return _External(log_dir, interval_ms)
    kwargs: dict = {"interval_ms": interval_ms}
    if variant == "no_allocator":
        kwargs["disable"] = ["torch_allocator"]
    if variant in ("no_nvml", "no_nvml_anywhere"):
        kwargs["disable"] = ["nvml"]
    if variant in ("no_flush", "wake_only"):
        kwargs["flush_interval_s"] = _NEVER_S
    join, open_gpus = host_sampler.join, host_sampler.open_host_gpus
    if variant in ("no_host", "wake_only"):
        host_sampler.join = functools.partial(join, interval_s=_NEVER_S)
    if variant == "no_nvml_anywhere":  # the host sampler still reads host memory and the cgroup
        host_sampler.open_host_gpus = lambda backend=None: (None, {"name": "nvml_host", "active": False})
    try:
        rec = Recorder(log_dir, **kwargs).start()
    finally:
        host_sampler.join, host_sampler.open_host_gpus = join, open_gpus
    plan = rec._sampler._plan
    if variant == "no_proc":
        rec._sampler._plan = [((_Empty(p) if p.name == "process" else p), w, partial) for p, w, partial in plan]
    if variant == "wake_only":
        rec._sampler._plan = [(_Empty(p), w, False) for p, w, _ in plan]
    handle = _Locks(rec)
    handle.close = lambda: (_Locks.close(handle), rec.stop())  # type: ignore[method-assign]
    return handle


def measure(variant: str, step, steps: int, dev, blocks: int, interval_ms: float, seed: int, log_dir: Path) -> dict:
    handle = _start(variant, log_dir, interval_ms)
    rng = random.Random(seed)
    quads = blocks // 4
    a, b = np.zeros(quads), np.zeros(quads)
    try:
        for q in range(quads):
            for cond in ("ABBA" if rng.random() < 0.5 else "BAAB"):
                handle.set(running=cond == "B")
                seconds = _time_block(step, steps, dev)
                if cond == "B":
                    b[q] += seconds
                else:
                    a[q] += seconds
    finally:
        handle.close()
    ratio, lo, hi = ratio_interval(a, b, 10_000, seed)
    return {"variant": variant, "ratio": round(ratio, 5), "ci95": [round(lo, 5), round(hi, 5)],
            "step_ms_a": round(a.sum() / (2 * quads) * 1e3, 4), "blocks": quads * 4}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/overhead_dissect.py", description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    add_block_arguments(parser, blocks=200, block_ms=100.0, per="per variant")
    parser.add_argument("--interval-ms", type=float, default=DEFAULT_INTERVAL_MS)
    parser.add_argument("--rounds", type=int, default=1, help="passes over the variants, in a shuffled order each")
    args = parse_block_arguments(parser, argv)
    dev = device()
    step, steps = warm_loop(dev, args.block_ms)
    results = []
    rng = random.Random(args.seed)
    for r in range(args.rounds):
        order = list(args.variants)
        rng.shuffle(order)
        for k, variant in enumerate(order):
            with tempfile.TemporaryDirectory() as tmp:
                res = measure(variant, step, steps, dev, args.blocks, args.interval_ms, args.seed + 1000 * r + k, Path(tmp))
            res["round"] = r
            results.append(res)
            print(f"overhead_dissect: {variant:13s} ratio {res['ratio']:.4f} [{res['ci95'][0]:.4f}, {res['ci95'][1]:.4f}] "
                  f"({res['blocks']} blocks of {steps} steps, {res['step_ms_a']:.3f} ms a step)", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "device": dev.type,
                                        "interval_ms": args.interval_ms, "block_ms": args.block_ms,
                                        "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
