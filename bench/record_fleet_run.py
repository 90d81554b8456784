"""Record a real multi-process CPU run: per rank an actor and an engine process (real Recorders in
subprocesses, one host sampler per host), the colocated loop's phases with host allocations.

    python -m bench.record_fleet_run LOG_DIR [--ranks 2] [--hosts 1] [--iterations 6] [--leak-rank R]
    python -m miles_profile.visualize LOG_DIR/<run>   # the report shows the Fleet section

The engine gets its rank's RANK, as the distributed trainer spawns it. `--leak-rank R` makes rank R's
actor keep 64 MiB more every iteration (floor_trend_leak and the leak check should name it).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# One process: its role's phases, allocating bytearrays so host RSS moves (argv: run dir, role,
# iterations, leak bytes per iteration).
PROGRAM = r"""
import sys, time
import miles_profile as mp
run_dir, role, iterations, leak = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
MiB = 1024 * 1024
# MILES_PROFILE_RUN_DIR (set by the parent) makes the process record into the run's directory
kept = []
for k in range(iterations):
    if role == "engine":
        with mp.phase("generate", rollout_id=k):
            kv = bytearray(48 * MiB); time.sleep(0.15)
        with mp.phase("offload_kv", rollout_id=k, expected_bytes=48 * MiB, target="cpu"):
            time.sleep(0.05); del kv; time.sleep(0.05)
        time.sleep(0.3)  # the actor trains
    else:
        time.sleep(0.2)  # the engine generates
        with mp.phase("train", rollout_id=k):
            state = bytearray(32 * MiB); act = bytearray(16 * MiB); time.sleep(0.15); del act
        with mp.phase("offload_train", rollout_id=k, expected_bytes=32 * MiB, target="cpu"):
            time.sleep(0.05); del state; time.sleep(0.05)
        kept.append(bytearray(leak))
        time.sleep(0.1)
"""


def record_fleet_run(log_dir: str | Path, ranks: int = 2, hosts: int = 1, iterations: int = 6,
                     leak_rank: int | None = None, run_id: str = "fleet-demo") -> Path:
    """Record the run into a new directory under `log_dir`; returns it (several hosts: the first)."""
    from miles_profile.identity import HOST_ENV, ROLE_ENV
    from miles_profile.names import RUN_DIR_ENV
    from miles_profile.recorder import create_run
    import os
    run_dirs = [create_run(Path(log_dir) / f"host{h}", ["bench.record_fleet_run"], 20.0, run_id=run_id)
                for h in range(hosts)]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = []
    per_host = max(1, ranks // hosts)
    for rank in range(ranks):
        host = min(rank // per_host, hosts - 1)
        for role in ("actor", "engine"):
            leak = 64 * 1024 * 1024 if (role == "actor" and rank == leak_rank) else 0
            procs.append(subprocess.Popen(
                [sys.executable, "-c", PROGRAM, str(run_dirs[host]), role, str(iterations), str(leak)],
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank % per_host), "WORLD_SIZE": str(ranks),
                     ROLE_ENV: role, HOST_ENV: f"node{host}", RUN_DIR_ENV: str(run_dirs[host])}, cwd=REPO))
    for proc in procs:
        if proc.wait(timeout=120) != 0:
            raise RuntimeError(f"a recorded process exited with {proc.returncode}")
    return run_dirs[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.record_fleet_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("log_dir")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--leak-rank", type=int)
    args = parser.parse_args(argv)
    run_dir = record_fleet_run(args.log_dir, args.ranks, args.hosts, args.iterations, args.leak_rank)
    print(run_dir.parent if args.hosts > 1 else run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
