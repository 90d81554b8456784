"""What a GiB written and thrown away costs the machine: into a directory on the temporary directory's
disk against one on tmpfs (/dev/shm), side by side, alternating.

Why the suite's programs that write GiBs they throw away (the corpus's disk offloads, the held-out
programs' staging, a disk calibration) write them to tmpfs (tests/corpus/runner.py, tests/conftest.py's
ram_dir): on the development VM the kernel time of a GiB written to ext4 varies from round to round (0.3
to 7.5 CPU-s, 2026-12-06), part of it in kernel threads that no process's rusage shows; /proc/stat does.

    python bench/scratch_write_cost.py [--gib 2] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time

CHUNK = 16 * 1024 ** 2


def busy_s() -> float:
    """CPU-seconds of the whole machine so far (every core, every process and kernel thread)."""
    fields = list(map(int, open("/proc/stat").readline().split()[1:9]))
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def write_and_drop(directory: str, nbytes: int) -> tuple[float, float, float]:
    """(wall s, this process's sys s, the machine's CPU-s until the data was on disk) for one file written
    in 16 MiB chunks, synced and deleted."""
    block = b"\1" * CHUNK
    path = os.path.join(directory, "scratch.bin")
    t0, s0, m0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_stime, busy_s()
    with open(path, "wb") as f:
        for _ in range(nbytes // CHUNK):
            f.write(block)
    os.sync()  # the writeback counted here, not in the next round
    t1, s1, m1 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_stime, busy_s()
    os.unlink(path)
    return t1 - t0, s1 - s0, m1 - m0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="GiB written a round (default 2)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not os.path.isdir("/dev/shm"):
        raise SystemExit("scratch_write_cost: no /dev/shm on this machine")
    nbytes = int(args.gib * 1024 ** 3)
    places = {"disk": tempfile.mkdtemp(prefix="scratch-cost-"), "tmpfs": tempfile.mkdtemp(prefix="scratch-cost-",
                                                                                       dir="/dev/shm")}
    print(f"{args.gib:g} GiB written, synced and deleted a round; disk: {places['disk']}")
    print(f"{'round':>5} {'where':>6} {'wall s':>7} {'sys s':>6} {'machine CPU-s':>14}")
    totals = {where: 0.0 for where in places}
    try:
        for k in range(args.rounds):
            order = list(places) if k % 2 == 0 else list(reversed(places))
            for where in order:
                wall, sys_s, machine = write_and_drop(places[where], nbytes)
                totals[where] += machine
                print(f"{k + 1:>5} {where:>6} {wall:>7.2f} {sys_s:>6.2f} {machine:>14.2f}")
    finally:
        for path in places.values():
            shutil.rmtree(path, ignore_errors=True)
    per_gib = {where: totals[where] / (args.rounds * args.gib) for where in places}
    print(f"machine CPU-s a GiB: disk {per_gib['disk']:.2f}, tmpfs {per_gib['tmpfs']:.2f}, "
          f"ratio disk/tmpfs {per_gib['disk'] / max(per_gib['tmpfs'], 1e-9):.1f}")


if __name__ == "__main__":
    main()
