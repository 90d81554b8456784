"""Wall time of importing a Miles dashboard directory whose rollout engines registered one at a time.

    python bench/bench_miles_import.py [--engines 3000] [--seconds 60] [--repeat 3] [--keep DIR] [--json OUT]

The directory is the tests' synthetic dump (tests/unit/test_miles_dashboard_import.py,
`write_miles_dashboard`: 2 hosts x 4 GPUs, 8 training ranks, 2 iterations) plus what a large rollout
fleet adds, as Miles' store.py writes it: `--engines` engines of one GPU each (8 per node) registering
one at a time, so topology.jsonl holds N snapshots of 1..N engines (3,000 engines: 4.5 million engine
listings, about 540 MB), and one gpu_util sample per engine GPU per second for `--seconds`.
Each repeat imports it in a fresh child process (`load_miles_dashboard`, what `visualize` and the
dashboard call) and prints its wall time, CPU time and peak RSS; the median is the figure in
docs/report.md ("Importing Miles' dashboard data").
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PER_NODE = 8


def engine(e: int) -> dict:
    node = f"10.1.{e // PER_NODE // 256}.{e // PER_NODE % 256}"
    return {"addr": f"http://{node}:{30000 + e % PER_NODE}", "worker_type": "regular", "engine_rank": e,
            "gpus": [[node, e % PER_NODE]], "gpu_uuids": [f"GPU-{e:08x}-0000-4000-8000-000000000000"]}


def write_dump(root: Path, engines: int, seconds: int) -> Path:
    """The tests' dump plus `engines` engines registering one at a time and their GPUs' samples."""
    from tests.unit.test_miles_dashboard_import import START, write_miles_dashboard
    write_miles_dashboard(root, iterations=2)
    listed = [json.dumps(engine(e), separators=(",", ":")) for e in range(engines)]
    with open(root / "topology.jsonl", "w") as f:
        body = ""
        for k, text in enumerate(listed):  # snapshot k lists engines 0..k, as each registration writes one
            body = f"{body},{text}" if body else text
            f.write(f'{{"ts":{START + 2 + k * 1e-3:.3f},"engines":[{body}]}}\n')
    with open(root / "gpu_util" / "extra.jsonl", "w") as f:
        for s in range(seconds):
            f.writelines(f'{{"ts":{START + s:.1f},"node":"{e["gpus"][0][0]}","gpu":{e["gpus"][0][1]},"util":50,'
                         f'"mem_mb":{40_000 + (s % 30) * 100},"power_w":400}}\n' for e in map(engine, range(engines)))
    return root


CHILD = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
from miles_profile.importers.miles_dashboard import load_miles_dashboard
wall, cpu = time.perf_counter(), time.process_time()
run = load_miles_dashboard({root!r})
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
engines = sum(p["role"] == "engine" for p in run.processes)
print(json.dumps({{"wall_s": wall, "cpu_s": cpu, "engine_processes": engines, "gpu_samples": len(run.gpu_samples),
                  "phases": len(run.phases), "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def measure(root: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD.format(repo=str(REPO), root=str(root))], cwd=REPO,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=3000)
    parser.add_argument("--seconds", type=int, default=60, help="seconds of gpu_util samples per engine GPU")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", help="write (or reuse) the dump here instead of a temporary directory")
    parser.add_argument("--json", help="also write the result to this directory")
    args = parser.parse_args(argv)
    from bench.common import write_result
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp) / "dashboard"
        if not (root / "meta.json").exists():
            start = time.perf_counter()
            write_dump(root, args.engines, args.seconds)
            print(f"wrote {root} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        sizes = {p.name: p.stat().st_size for p in [root / "topology.jsonl", root / "gpu_util" / "extra.jsonl"]}
        runs = []
        for k in range(args.repeat):
            runs.append(measure(root))
            print(f"run {k + 1}: {runs[-1]['wall_s']:.2f} s wall, {runs[-1]['cpu_s']:.2f} s CPU, "
                  f"{runs[-1]['peak_rss_mib']:.0f} MiB peak RSS", file=sys.stderr)
    write_result(args.json, "bench_miles_import", {
        "engines": args.engines, "seconds": args.seconds, "file_bytes": sizes,
        "wall_s_median": statistics.median(r["wall_s"] for r in runs),
        "cpu_s_median": statistics.median(r["cpu_s"] for r in runs),
        "peak_rss_mib_max": max(r["peak_rss_mib"] for r in runs), "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
