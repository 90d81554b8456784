"""What one wake-up of a sleeping Python thread costs on this machine, with nothing to do.

    python bench/wake_cost.py [--interval-ms 20] [--seconds 6]

Reads the thread's on-CPU time and number of timeslices from /proc/self/task/<tid>/schedstat (Linux)
for a thread that only sleeps to a fixed schedule, once with time.sleep and once with Event.wait (what
the sampler uses). Compare with the sampler thread's own figure (docs/benchmarks.md): what is left
above this floor is the cost of reading the probes.
"""
from __future__ import annotations

import argparse
import threading
import time


def schedstat(tid: int) -> tuple[float, int]:
    """(seconds on a CPU, timeslices) of one thread."""
    on_cpu_ns, _, slices = open(f"/proc/self/task/{tid}/schedstat").read().split()[:3]
    return int(on_cpu_ns) / 1e9, int(slices)


def idle_wakeups(use_event: bool, interval_s: float, seconds: float) -> tuple[float, float]:
    """(µs on a CPU per wake-up, % of one core) of a thread that wakes every `interval_s` and does nothing."""
    stop = threading.Event()

    def loop() -> None:
        due = time.monotonic()
        while not stop.is_set():
            due += interval_s
            delay = max(0.0, due - time.monotonic())
            stop.wait(delay) if use_event else time.sleep(delay)

    thread = threading.Thread(target=loop)
    thread.start()
    time.sleep(0.3)
    cpu0, n0 = schedstat(thread.native_id)
    time.sleep(seconds)
    cpu1, n1 = schedstat(thread.native_id)
    stop.set()
    thread.join()
    return (cpu1 - cpu0) / max(1, n1 - n0) * 1e6, (cpu1 - cpu0) / seconds * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    for name, use_event in (("time.sleep", False), ("Event.wait", True)):
        per_wake, share = idle_wakeups(use_event, args.interval_ms / 1000, args.seconds)
        print(f"{name:10s} every {args.interval_ms:g} ms: {per_wake:.0f} us on a CPU per wake-up, {share:.3f}% of a core")


if __name__ == "__main__":
    main()
