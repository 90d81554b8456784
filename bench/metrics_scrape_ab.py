"""A scrape's CPU time on two or more trees, interleaved scrape by scrape (issue 32, item 5): one worker
process a tree, each with its own host of N recording processes (bench_metrics.FakeHost), told in turn,
in an order that alternates, to advance its host one scrape interval and scrape it (read the files,
render what the endpoint answers Debian's Prometheus 2.42). On a shared machine the load moves within
seconds: scrapes of the trees taken side by side see the same load, runs minutes apart do not.

    git -C /work/main worktree add /tmp/main-tree HEAD      # or: git archive HEAD | tar -x -C /tmp/main-tree
    python bench/metrics_scrape_ab.py /tmp/main-tree . [--processes 64] [--scrapes 15] [--intervals 1 15]
    cp bench/bench_metrics.py /tmp/main-tree/bench/ && python bench/metrics_scrape_ab.py /tmp/main-tree . --phase-seconds 10

Each tree runs its own bench/bench_metrics.py (FakeHost, the renderer) and its own miles_profile. Prints,
per interval and tree, the median over the scrapes of this thread's CPU time for the whole scrape, the
reading and the rendering, and the samples rendered.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

_WORKER = r"""
import json, sys, tempfile, time
from pathlib import Path
tree, interval, processes, phase_s = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
sys.path.insert(0, str(Path(tree) / "bench"))
import bench_metrics as b  # puts `tree` first on sys.path: its miles_profile
from miles_profile.metrics.host_state import HostState
_, render = b.renderer()
with tempfile.TemporaryDirectory() as tmp:
    host = b.FakeHost(Path(tmp), processes, *([phase_s] if phase_s != 1 else []))
    try:  # read at scrape time only: no follower reading for it (trees before it take no argument)
        state = HostState(tmp, b.HOST, collect_interval_s=None)
    except TypeError:
        state = HostState(tmp, b.HOST)
    host.advance(interval if phase_s == 1 else max(interval, len(b.PHASES) * phase_s))  # every series there
    render(state.read())  # the first scrape reads every file's header and meta (and imports)
    print("ready", flush=True)
    for _ in sys.stdin:
        host.advance(interval)
        cpu = time.thread_time()
        reading = state.read()
        read = time.thread_time()
        body = render(reading)
        done = time.thread_time()
        samples = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
        print(json.dumps([read - cpu, done - read, samples]), flush=True)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="directories holding miles_profile/ and bench/")
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--scrapes", type=int, default=15)
    parser.add_argument("--intervals", type=float, nargs="+", default=[1.0, 15.0])
    parser.add_argument("--phase-seconds", type=float, default=1.0,
                        help="a phase every this many seconds (1: the stress; other values need the tree's "
                             "bench_metrics.py from round 4 on)")
    args = parser.parse_args(argv)
    trees = [str(Path(t).resolve()) for t in args.trees]
    calibration = min(timeit.repeat("sum(range(1000))", number=1000, repeat=5)) / 1000
    print(f"calibration: sum(range(1000)) {calibration * 1e6:.1f} us (an idle current x86 core: about 10); "
          f"load average {os.getloadavg()[0]:.1f}")
    for interval in args.intervals:
        workers = [subprocess.Popen([sys.executable, "-c", _WORKER, tree, str(interval), str(args.processes),
                                     str(args.phase_seconds)],
                                    cwd=tree, env={**os.environ, "PYTHONPATH": tree}, text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE) for tree in trees]
        try:
            for w in workers:
                assert w.stdout.readline().strip() == "ready"
            got: list[list[list[float]]] = [[] for _ in trees]
            for k in range(args.scrapes):
                order = range(len(trees)) if k % 2 == 0 else reversed(range(len(trees)))
                for i in order:  # one scrape at a time: the trees never compete with each other
                    workers[i].stdin.write("\n")
                    workers[i].stdin.flush()
                    got[i].append(json.loads(workers[i].stdout.readline()))
        finally:
            for w in workers:
                w.stdin.close()
                w.wait()
        for tree, scrapes in zip(args.trees, got):
            read = [s[0] for s in scrapes]
            render = [s[1] for s in scrapes]
            whole = [r + e for r, e in zip(read, render)]
            print(f"  {args.processes} processes, every {interval:g} s, {tree}: CPU median "
                  f"{statistics.median(whole) * 1e3:.2f} ms (reading {statistics.median(read) * 1e3:.2f}, "
                  f"rendering {statistics.median(render) * 1e3:.2f}), min {min(whole) * 1e3:.2f}; "
                  f"{scrapes[-1][2]} samples; {len(scrapes)} scrapes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
