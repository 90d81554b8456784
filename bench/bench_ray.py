"""What recording a Ray job costs (issue 31, item 8), on a real two-node cluster on this machine.

    python bench/bench_ray.py [--rounds 3] [--steps 60]

- per node, our start-up: the sampler actor's own start (its __init__, `start_s` in cluster.json), and
  from the driver's request to its first answer (`ready_s`: Ray starting a worker process included);
- the driver's `ray.init` with the hook against without it;
- per actor, the step time of the same job recorded (`record --exec`) and not, alternated round by
  round (a machine shared with other work drifts: alternation keeps the drift out of the ratio).
Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from miles_profile.identity import HOST_ENV  # noqa: E402
from miles_profile.logdir.cluster import read_cluster  # noqa: E402
from tests.ray_cluster import start_cluster  # noqa: E402

JOB = REPO / "bench" / "ray_step_job.py"


def run_job(cluster, steps: int, log_dir: str | None) -> tuple[dict, dict | None]:
    command = [sys.executable, str(JOB), str(steps)]
    if log_dir:
        command = [sys.executable, "-m", "miles_profile.record", "--log-dir", log_dir, "--exec", "--", *command]
    done = subprocess.run(command, env=dict(cluster.env, RAY_ADDRESS=cluster.address), capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    doc = None
    if log_dir:
        (run_dir,) = [p for p in Path(log_dir).iterdir() if p.is_dir()]
        doc = read_cluster(run_dir)
    return result, doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        cluster = start_cluster(env, {HOST_ENV: "node2", "MILES_PROFILE_NODE_LOG_DIR": f"{tmp}/node2"})
        try:
            plain, recorded, inits, starts, readies = [], [], {"plain": [], "recorded": []}, [], []
            for i in range(args.rounds):
                for mode in (("plain", "recorded") if i % 2 == 0 else ("recorded", "plain")):
                    log_dir = f"{tmp}/logs-{i}" if mode == "recorded" else None
                    result, doc = run_job(cluster, args.steps, log_dir)
                    steps = [d for actor in result["durations"] for d in actor[5:]]  # warm-up left out
                    (recorded if mode == "recorded" else plain).append(statistics.median(steps))
                    inits[mode].append(result["init_s"])
                    if doc:
                        starts += [n["start_s"] for n in doc["nodes"]]
                        readies += [n["ready_s"] for n in doc["nodes"] if "ready_s" in n]
        finally:
            cluster.stop()
    out = {
        "rounds": args.rounds, "steps": args.steps,
        "node_start_s_max": max(starts), "node_start_s_median": statistics.median(starts),
        "node_ready_s_max": max(readies), "node_ready_s_median": statistics.median(readies),
        "ray_init_s_plain": statistics.median(inits["plain"]), "ray_init_s_recorded": statistics.median(inits["recorded"]),
        "step_ms_plain": [round(x * 1000, 2) for x in plain], "step_ms_recorded": [round(x * 1000, 2) for x in recorded],
        "step_overhead_pct": round((statistics.median(recorded) / statistics.median(plain) - 1) * 100, 2),
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
