"""What each of the recorder's reads costs the job per call, measured at a high rate (a dose).

At the default rate one read costs too little to resolve against the A/B method's noise (+-1% a call of
a few minutes), so each load here runs alone at `--rate` calls a second (200: 20 times the 100 ms
default), by the A/B method of bench/overhead_ab.py (ABBA quads of short blocks, CUDA-event step times,
bootstrap interval): A = the load paused, B = running. Its cost per call is (ratio - 1) / calls per
second of B, and its cost at a recorder's rate is that times the rate: the dissection of
docs/benchmarks.md with a resolution of a few microseconds a call instead of a percent.

In the job (a thread that runs the load on a fixed schedule, as the sampler does; paused, it waits on
an event and never wakes):
    null        no thread (A against A: the method's noise)
    wake        the thread's wake-up alone
    gil_py      ~20 us of pure-Python work (a GIL hold without system calls)
    gil_release 10 ctypes calls that release and retake the GIL (a forced thread switch each)
    status      read /proc/self/status            clear_refs  write 5 to /proc/self/clear_refs
    allocator   the allocator probe (stats and peak reset)
    nvml        the sampler's NVML probe (device memory and the per-process list)
    row         one whole sampler row (every probe of the default recorder and the row's append)
    row_flush   a row, then the writer's flush     host        one tick of the host sampler
In another process (SIGSTOP-paused; no GIL shared with the job):
    ext_wake  ext_status  ext_clear_refs (of the job's pid)  ext_row (a `record --exec`-style recorder)

    PYTHONPATH=. python3 bench/overhead_dose.py [--loads row clear_refs ...] [--rate 200] [--blocks 160]
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import device, machine  # noqa: E402
from bench.overhead_ab import (_time_block, add_block_arguments, parse_block_arguments, ratio_interval,  # noqa: E402
                               warm_loop)
from miles_profile import host_sampler  # noqa: E402
from miles_profile.probes.procfs import ProcFile  # noqa: E402
from miles_profile.recorder import Recorder  # noqa: E402

IN_JOB = ("null", "wake", "gil_py", "gil_release", "status", "clear_refs", "allocator", "nvml", "row", "row_flush",
          "host")
EXTERNAL = ("ext_wake", "ext_status", "ext_clear_refs", "ext_row")
_NEVER_S = 3600.0

# One external load's loop: `call` every 1/rate s, counting calls in a shared file's first 8 bytes.
_EXTERNAL_LOOP = """
import os, sys, time
pid, rate, what = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
sys.path.insert(0, sys.argv[4])
from miles_profile.probes.procfs import ProcFile
if what == "ext_row":
    from miles_profile.recorder import Recorder
    Recorder(sys.argv[5], child_pid=pid, interval_ms=1e3 / rate).start()
    print("ready", flush=True); time.sleep(1e6)
status, refs = ProcFile(f"/proc/{pid}/status"), ProcFile(f"/proc/{pid}/clear_refs", writable=True)
call = {"ext_wake": lambda: None, "ext_status": status.read, "ext_clear_refs": lambda: refs.write(b"5")}[what]
print("ready", flush=True)
due = time.monotonic()
while True:
    due += 1 / rate
    time.sleep(max(0.0, due - time.monotonic()))
    call()
"""


class _Thread:
    """Runs `call` every 1/rate s in a thread of this process; paused, it blocks on an event."""

    def __init__(self, call, rate: float):
        self._call, self._period = call, 1.0 / rate
        self._running, self._stop = threading.Event(), False
        self.calls = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._running.wait()
            if self._stop:
                return
            due = time.monotonic()
            while self._running.is_set() and not self._stop:
                due += self._period
                delay = due - time.monotonic()
                if delay < 0:
                    due, delay = time.monotonic(), 0.0
                time.sleep(delay)
                self._call()
                self.calls += 1

    def set(self, running: bool) -> None:
        self._running.set() if running else self._running.clear()

    def close(self) -> None:
        self._stop = True
        self._running.set()
        self._thread.join(timeout=10)


class _Process:
    """A load in another process, paused by SIGSTOP; calls counted by time (it keeps its schedule)."""

    def __init__(self, what: str, rate: float, log_dir: Path):
        root = str(Path(__file__).resolve().parents[1])
        self._proc = subprocess.Popen([sys.executable, "-c", _EXTERNAL_LOOP, str(os.getpid()), str(rate), what, root,
                                       str(log_dir)], stdout=subprocess.PIPE, text=True)
        if self._proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the external load {what} did not start")
        os.kill(self._proc.pid, signal.SIGSTOP)
        self._rate, self._since, self._paused, self._seconds = rate, 0.0, True, 0.0

    @property
    def calls(self) -> int:
        return round(self._seconds * self._rate)

    def set(self, running: bool) -> None:
        if running == self._paused:
            os.kill(self._proc.pid, signal.SIGCONT if running else signal.SIGSTOP)
            self._paused = not running
            now = time.monotonic()
            if running:
                self._since = now
            else:
                self._seconds += now - self._since

    def close(self) -> None:
        os.kill(self._proc.pid, signal.SIGCONT)
        self._proc.terminate()
        self._proc.wait(timeout=30)


def _gil_py() -> None:
    """About 20 us of bytecode on a current CPU, no system call."""
    total = 0
    for i in range(400):
        total += i * i
    return None


_libc = ctypes.CDLL(None)  # CDLL releases the GIL around each foreign call (PyDLL would not)


def _gil_release() -> None:
    for _ in range(10):
        _libc.getpid()


def _in_job_call(load: str, rec: Recorder):
    """The function a thread in the job calls for one load."""
    probes = {p.name: (p, partial) for p, _, partial in rec._sampler._plan}

    def probe(name: str):
        if name not in probes:
            raise LookupError(f"the recorder has no {name} probe here")
        p, partial = probes[name]
        return functools.partial(p.read, False) if partial else p.read

    if load in ("wake", "null"):
        return lambda: None
    if load == "gil_py":
        return _gil_py
    if load == "gil_release":
        return _gil_release
    if load == "status":
        return ProcFile("/proc/self/status").read
    if load == "clear_refs":
        return functools.partial(ProcFile("/proc/self/clear_refs", writable=True).write, b"5")
    if load in ("allocator", "nvml"):
        return probe({"allocator": "torch_allocator", "nvml": "nvml"}[load])
    if load == "row":
        return functools.partial(rec._sampler.sample, full=False)
    if load == "row_flush":
        return lambda: (rec._sampler.sample(full=False), rec._sampler._writer.flush())
    if load == "host":
        if rec._host is None or not rec._host.active:
            raise LookupError("no host sampler in this process")
        return rec._host.sample
    raise ValueError(load)


def measure(load: str, step, steps: int, dev, blocks: int, rate: float, seed: int, rec: Recorder, log_dir: Path) -> dict:
    if load in EXTERNAL:
        handle = _Process(load, rate, log_dir)
    else:
        handle = _Thread(_in_job_call(load, rec), rate)
    rng = random.Random(seed)
    quads = blocks // 4
    a, b = np.zeros(quads), np.zeros(quads)
    b_seconds = 0.0
    try:
        for q in range(quads):
            for cond in ("ABBA" if rng.random() < 0.5 else "BAAB"):
                handle.set(running=cond == "B" and load != "null")
                t0 = time.monotonic()
                seconds = _time_block(step, steps, dev)
                if cond == "B":
                    b[q] += seconds
                    b_seconds += time.monotonic() - t0
                else:
                    a[q] += seconds
        handle.set(running=False)
        calls = handle.calls
    finally:
        handle.close()
    ratio, lo, hi = ratio_interval(a, b, 10_000, seed)
    per_s = calls / b_seconds if b_seconds else 0.0
    # Time lost per call: the fraction of B's time lost, spread over B's calls.
    us = (ratio - 1) / ratio / per_s * 1e6 if per_s else None
    half = (hi - lo) / 2 / per_s * 1e6 if per_s else None
    return {"load": load, "ratio": round(ratio, 5), "ci95": [round(lo, 5), round(hi, 5)], "calls_per_s": round(per_s, 1),
            "us_per_call": None if us is None else round(us, 1), "us_per_call_pm": None if half is None else round(half, 1),
            "step_ms_a": round(a.sum() / (2 * quads) * 1e3, 4), "blocks": quads * 4}


def _idle_recorder(log_dir: Path) -> Recorder:
    """A default recorder whose own threads never wake (their loads are driven by hand)."""
    join = host_sampler.join
    host_sampler.join = functools.partial(join, interval_s=_NEVER_S)
    try:
        return Recorder(log_dir, interval_ms=60_000, flush_interval_s=_NEVER_S).start()
    finally:
        host_sampler.join = join


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/overhead_dose.py", description=__doc__.splitlines()[0])
    parser.add_argument("--loads", nargs="+", choices=IN_JOB + EXTERNAL, default=list(IN_JOB + EXTERNAL))
    parser.add_argument("--rate", type=float, default=200.0, help="calls a second of each load (default: %(default)s)")
    add_block_arguments(parser, blocks=160, block_ms=100.0, per="per load")
    args = parse_block_arguments(parser, argv)
    dev = device()
    step, steps = warm_loop(dev, args.block_ms)
    order = list(args.loads)
    random.Random(args.seed).shuffle(order)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        rec = _idle_recorder(Path(tmp) / "idle")
        try:
            for k, load in enumerate(order):
                try:
                    res = measure(load, step, steps, dev, args.blocks, args.rate, args.seed + k, rec, Path(tmp) / load)
                except LookupError as exc:
                    print(f"overhead_dose: {load:14s} skipped: {exc}", flush=True)
                    continue
                results.append(res)
                cost = "" if res["us_per_call"] is None else \
                    f" = {res['us_per_call']:.1f} +- {res['us_per_call_pm']:.1f} us a call"
                print(f"overhead_dose: {load:14s} ratio {res['ratio']:.4f} [{res['ci95'][0]:.4f}, {res['ci95'][1]:.4f}] "
                      f"at {res['calls_per_s']:.0f} calls/s{cost} ({res['blocks']} blocks, {res['step_ms_a']:.3f} ms a step)",
                      flush=True)
        finally:
            rec.stop()
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "device": dev.type,
                                        "rate": args.rate, "block_ms": args.block_ms, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
