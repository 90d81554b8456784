"""CPU and wall time of one whole scrape (read the files, render the exposition Prometheus asks for) with
64 processes on a host, split into reading and rendering, for an A/B across commits on a shared machine,
where wall time mostly measures the wait for a core: this thread's CPU seconds do not. The same file
runs on this tree and on older ones (832a1cb, before round 3: prometheus_client's own WSGI app; 316cb90,
round 3 without the cache of unchanged families; 0108de6, a hand-written exposition), interleaved
(docs/prometheus.md, Cost):

    for c in 832a1cb 316cb90; do mkdir -p /tmp/ab/$c && git archive $c | tar -x -C /tmp/ab/$c \\
        && cp bench/bench_metrics.py bench/metrics_scrape_cpu.py /tmp/ab/$c/bench/; done
    for k in 1 2 3; do for t in /tmp/ab/832a1cb /tmp/ab/316cb90 .; do \\
        (cd $t && PYTHONPATH=$PWD python bench/metrics_scrape_cpu.py); done; done

    python bench/metrics_scrape_cpu.py --processes 8 16 24 32 48 64   # how the cost grows with processes
    python bench/metrics_scrape_cpu.py --phase-seconds 10              # phases of 10 s instead of 1 s

The host is bench_metrics.py's FakeHost (rows every 100 ms, a phase every second per process); the
rendering is what the endpoint answers Debian's Prometheus 2.42 (bench_metrics.PROMETHEUS_ACCEPT).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_metrics as b  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[64])
    parser.add_argument("--phase-seconds", type=float, default=1.0,
                        help="a phase begins and ends this often in every process (1: the stress; RL phases: tens)")
    args = parser.parse_args(argv)
    which, render = b.renderer()
    # How loaded this machine is: on an idle current x86 core this takes about 10 us.
    calibration = min(timeit.repeat("sum(range(1000))", number=1000, repeat=5)) / 1000
    print(f"{Path(__file__).resolve().parents[1]}: rendered by {which}; calibration: sum(range(1000)) "
          f"{calibration * 1e6:.1f} us")
    for processes, interval in ((n, i) for n in args.processes for i in (1.0, 15.0)):
        with tempfile.TemporaryDirectory() as tmp:
            host = b.FakeHost(Path(tmp), processes, args.phase_seconds)
            state = b.scrape_only_state(tmp)  # read at scrape time only: no follower reading for it
            # Longer phases need a whole cycle of them before every series is there (offloads, transitions);
            # the 1 s stress keeps the warm-up of the previous rounds' figures.
            host.advance(interval if args.phase_seconds == 1 else max(interval, len(b.PHASES) * args.phase_seconds))
            render(state.read())  # the first scrape reads every file's header and meta
            reads, renders, walls = [], [], []
            for _ in range(10):
                host.advance(interval)
                wall, cpu = time.perf_counter(), time.thread_time()
                reading = state.read()
                read_cpu = time.thread_time()
                body = render(reading)
                renders.append(time.thread_time() - read_cpu)
                reads.append(read_cpu - cpu)
                walls.append(time.perf_counter() - wall)
            samples = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
            build = ""
            if "families" in which:  # of the rendering, building the families (ours) apart from encoding them
                from miles_profile.metrics.families import families
                builds = []
                for _ in range(5):  # a median: one timing once caught a collection of the whole heap (26.9 ms)
                    cpu = time.thread_time()
                    list(families(reading))
                    builds.append(time.thread_time() - cpu)
                build = f" (of which building the families {statistics.median(builds) * 1e3:.2f})"
            total = [r + e for r, e in zip(reads, renders)]
            print(f"  {processes} processes, scrape every {interval:g} s ({samples} samples): "
                  f"CPU median {statistics.median(total) * 1e3:.2f} ms "
                  f"(reading {statistics.median(reads) * 1e3:.2f}, rendering {statistics.median(renders) * 1e3:.2f}{build}), "
                  f"min {min(total) * 1e3:.2f}; wall median {statistics.median(walls) * 1e3:.2f} ms, "
                  f"min {min(walls) * 1e3:.2f}; over {len(total)} scrapes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
