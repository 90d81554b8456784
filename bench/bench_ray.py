"""What recording a Ray job costs (issue 31, item 8), on a real two-node cluster on this machine.

    python bench/bench_ray.py [--rounds 2] [--steps 300]

- per node, our start-up: the sampler actor's own start (its __init__, `start_s` in cluster.json), and
  from the driver's request to its first answer (`ready_s`: Ray starting a worker process included);
- the driver's `ray.init` with the hook (a recorded job) against without it (a plain job), alternated;
- per actor, the step time recorded and not, paired: in each recorded job, two actors per node run the
  same ~30 ms step, one recorded and one whose runtime env blanks the run directory, asked in turn step
  by step in ABBA order (bench/ray_step_job.py). Each step's ratio recorded/plain cancels the machine's
  drift; the overhead is the mean log-ratio over every pair (the first WARM steps of each actor left out:
  the first phase starts the recorder, reported apart), with a 95% bootstrap interval;
- today's per-process cost the same way, in the same rounds: two plain Python processes (no Ray), one
  recorded by `record --exec` and one not, same step, ABBA (bench/local_step_pair.py); and the
  difference actor minus process, with its interval. "The same as today" is that difference near 0.
Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
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
LOCAL = REPO / "bench" / "local_step_pair.py"
WARM = 5  # steps per actor left out of the ratio: the recorder starts at the first phase


def run_job(cluster, steps: int, log_dir: str | None, job: Path = JOB) -> tuple[dict, dict | None]:
    command = [sys.executable, str(job), str(steps)]
    if log_dir:
        command = [sys.executable, "-m", "miles_profile.record", "--log-dir", log_dir, "--exec", "--", *command]
    done = subprocess.run(command, env=dict(cluster.env, RAY_ADDRESS=cluster.address), capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    doc = None
    if log_dir:
        (run_dir,) = [p for p in Path(log_dir).iterdir() if p.is_dir()]
        doc = read_cluster(run_dir) if job == JOB else None
    return result, doc


def overhead(log_ratios: list[float], draws: int = 2000) -> dict:
    """Mean log-ratio as a percentage, with a 95% bootstrap interval (seeded: the same data, the same CI)."""
    rng = random.Random(0)
    n = len(log_ratios)
    means = sorted(sum(rng.choices(log_ratios, k=n)) / n for _ in range(draws))
    pct = lambda x: round((math.exp(x) - 1) * 100, 2)  # noqa: E731
    return {"pct": pct(sum(log_ratios) / n), "ci95_pct": [pct(means[int(0.025 * draws)]), pct(means[int(0.975 * draws)])],
            "pairs": n, "pair_spread_pct": round(statistics.pstdev(log_ratios) * 100, 1)}


def difference(a: list[float], b: list[float], draws: int = 2000) -> dict:
    """Mean log-ratio of `a` minus that of `b` in percentage points, with a 95% bootstrap interval."""
    rng = random.Random(1)
    diffs = sorted(sum(rng.choices(a, k=len(a))) / len(a) - sum(rng.choices(b, k=len(b))) / len(b)
                   for _ in range(draws))
    return {"pct_points": round((sum(a) / len(a) - sum(b) / len(b)) * 100, 2),
            "ci95": [round(diffs[int(0.025 * draws)] * 100, 2), round(diffs[int(0.975 * draws)] * 100, 2)]}


def ratios(pair: dict, which: int) -> list[float]:
    """log(recorded / plain) per step pair; which: 0 wall time, 1 the process's CPU time."""
    return [math.log(r[which] / p[which]) for r, p in zip(pair["recorded"][WARM:], pair["plain"][WARM:])
            if r[which] > 0 and p[which] > 0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    inits: dict[str, list[float]] = {"plain": [], "recorded": []}
    starts, readies, first_ms, plain_ms, recorded_ms = [], [], [], [], []
    actor: dict[int, list[float]] = {0: [], 1: []}  # log-ratios by measure: 0 wall, 1 CPU
    local: dict[int, list[float]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        cluster = start_cluster(env, {HOST_ENV: "node2", "MILES_PROFILE_NODE_LOG_DIR": f"{tmp}/node2"})
        try:
            for i in range(args.rounds):
                for mode in (("plain", "recorded", "local") if i % 2 == 0 else ("local", "recorded", "plain")):
                    if mode == "local":  # today's recorder in a plain process, under the same load
                        result, _ = run_job(cluster, args.steps, f"{tmp}/local-{i}", LOCAL)
                        for which in (0, 1):
                            local[which] += ratios(result["steps"]["local"], which)
                        continue
                    if mode == "plain":  # ray.init without the hook: no actor needed
                        inits["plain"].append(run_job(cluster, 0, None)[0]["init_s"])
                        continue
                    result, doc = run_job(cluster, args.steps, f"{tmp}/logs-{i}")
                    inits["recorded"].append(result["init_s"])
                    starts += [n["start_s"] for n in doc["nodes"]]
                    readies += [n["ready_s"] for n in doc["nodes"] if "ready_s" in n]
                    for pair in result["steps"].values():
                        rec, plain = pair["recorded"], pair["plain"]
                        first_ms.append(round((rec[0][0] - plain[0][0]) * 1000, 2))
                        for which in (0, 1):
                            actor[which] += ratios(pair, which)
                        plain_ms.append(statistics.median(s[0] for s in plain[WARM:]) * 1000)
                        recorded_ms.append(statistics.median(s[0] for s in rec[WARM:]) * 1000)
        finally:
            cluster.stop()
    out = {
        "rounds": args.rounds, "steps": args.steps, "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
        "node_start_s_max": max(starts), "node_start_s_median": statistics.median(starts),
        "node_ready_s_max": max(readies), "node_ready_s_median": statistics.median(readies),
        "ray_init_s_plain": statistics.median(inits["plain"]), "ray_init_s_recorded": statistics.median(inits["recorded"]),
        "step_ms_plain_median": [round(x, 2) for x in plain_ms], "step_ms_recorded_median": [round(x, 2) for x in recorded_ms],
        "first_step_extra_ms": first_ms,
        "wall": {"actor": overhead(actor[0]), "today": overhead(local[0]),
                 "actor_minus_today": difference(actor[0], local[0])},
        "cpu": {"actor": overhead(actor[1]), "today": overhead(local[1]),
                "actor_minus_today": difference(actor[1], local[1])},
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
