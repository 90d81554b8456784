"""The body of scripts/ray_gpu.sh, with ray already importable: start a Ray head node, run the recorded
trainer on it with `--launcher ray`, stop the cluster by its processes' ids, and write the run (tarred) and
a summary to --out. Never `ray stop`: it would end every Ray process of the machine (docs/ray.md).

    python scripts/ray_gpu_run.py --out DIR [--mode gpu|cpu]

gpu: two trainer runs on the machine's GPUs (NPROC ranks, default one per GPU): offloads alone, then with
--use-critic (the critic as an actor of its own, as Miles runs it); cpu: one tiny run of 2 ranks with the
critic. TRAINER_FLAGS (one string) replaces the flags of every run. Prints the summary; exit 0 only if every
run exited 0 with every rank, engine (and critic) recorded (on its GPU in gpu mode) and the cluster left
nothing running.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.ray_cluster import RAY_CLI, Cluster, free_port, kill, wait_nodes  # noqa: E402

OFFLOADS = ["--offload-train", "--offload-rollout"]
RUNS = {
    "gpu": [("offloads", ["--preset", "gpu", "--num-rollout", "2", *OFFLOADS]),
            ("critic", ["--preset", "gpu", "--num-rollout", "2", *OFFLOADS, "--use-critic"])],
    "cpu": [("critic", ["--preset", "tiny", "--num-rollout", "2", *OFFLOADS, "--use-critic"])],
}
TIMEOUT_S = {"gpu": 220, "cpu": 300}  # per trainer run: two gpu runs and the start fit the call's 600 s


def gpu_count() -> int:
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.SubprocessError):
        return 0


def start_head(temp_dir: Path, env: dict[str, str], num_cpus: int | None, log, num_gpus: int = 0) -> Cluster:
    port = free_port()
    args = [*RAY_CLI, "start", "--head", f"--port={port}", f"--temp-dir={temp_dir}",
            "--include-dashboard=false", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
            f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}", *([f"--num-cpus={num_cpus}"] if num_cpus else []),
            *([f"--num-gpus={num_gpus}"] if num_gpus else [])]
    cluster = Cluster(f"127.0.0.1:{port}", "", [temp_dir], env)
    started = time.monotonic()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=180)
    log.write(f"$ {shlex.join(args)}\nexit {done.returncode} after {time.monotonic() - started:.1f} s\n"
              f"{done.stdout}\n{done.stderr}\n")
    if done.returncode != 0:
        cluster.stop()
        raise RuntimeError(f"ray start --head failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    wait_nodes(cluster, 1)
    return cluster


def summarize(run_dir: Path, mode: str, nproc: int, critic: bool) -> dict:
    import miles_profile as mp
    from miles_profile.logdir.cluster import read_cluster
    from miles_profile.verdicts.oom import check_oom
    from miles_profile.verdicts.per_process import per_process_checks
    run = mp.load(run_dir)
    keys = ("pid", "host", "role", "rank", "ray_actor_class", "ray_bundle_index", "ray_gpu_ids", "gpu_uuid")
    processes = [{k: p.get(k) for k in keys} for p in run.processes]
    for p in processes:
        p["phases"] = dict(Counter(run.phases[run.phases["pid"] == p["pid"]]["name"].astype(str)))
    checks = per_process_checks(run)
    offload = next((r for r in checks if r.name == "offload_drop"), None)
    oom = check_oom(run)
    expected = {"actor": "RankActor", "engine": None, **({"critic": "CriticActor"} if critic else {})}
    problems = []
    for role, cls in expected.items():
        mine = [p for p in processes if p["role"] == role]
        if sorted(p["rank"] for p in mine) != list(range(nproc)):
            problems.append(f"{role}: ranks {sorted(p['rank'] for p in mine)}, expected 0..{nproc - 1}")
        if cls and any(p["ray_actor_class"] != cls for p in mine):
            problems.append(f"{role}: not all {cls}")
        if mode == "gpu" and any(not p["gpu_uuid"] for p in mine):
            problems.append(f"{role}: a process without its GPU's UUID")
    return {
        "run_dir": run_dir.name, "processes": processes,
        "checks": [{"name": r.name, "status": r.status, "summary": r.summary} for r in checks],
        "offload_drop": [{"pid": f.numbers.get("pid"), "phase": f.phase, "iteration": f.iteration,
                          "status": f.status, "message": f.message[:300]}
                         for f in (offload.findings if offload else [])],
        "oom": {"status": oom.status, "summary": oom.summary},
        "warnings": list(run.warnings), "cluster": read_cluster(run_dir), "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--mode", choices=("gpu", "cpu"), default="gpu")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    gpus = gpu_count() if args.mode == "gpu" else 0
    if args.mode == "gpu" and not gpus:
        print("ray_gpu: no GPU seen by nvidia-smi (use --cpu here)", file=sys.stderr)
        return 1
    nproc = int(os.environ.get("NPROC") or (gpus if args.mode == "gpu" else 2))
    runs = RUNS[args.mode]
    if os.environ.get("TRAINER_FLAGS"):
        runs = [("custom", shlex.split(os.environ["TRAINER_FLAGS"]))]
    summary: dict = {"mode": args.mode, "gpus": gpus, "nproc": nproc, "runs": {}, "ok": False}
    tmp = Path(tempfile.mkdtemp(prefix="raygpu"))
    # A HOME of its own: Ray reads ~/.ray (tests/ray_cluster.py says why)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", HOME=str(tmp))
    if args.mode == "gpu":
        # Ray's memory monitor off: some GPU machines show a MemTotal that grows as memory is used
        # (seen on the lent GPU machines), and the critic run pins ~49 GiB of host memory (--plan);
        # its kills are tested on the CPU (tests/integration/test_ray_record.py).
        env["RAY_memory_monitor_refresh_ms"] = "0"
    temp_dir = Path(tempfile.mkdtemp(prefix="rg"))  # short: Ray's unix sockets live under it
    cluster = None
    codes = []
    try:
        with open(out / "ray_start.log", "w") as log:
            started = time.monotonic()
            cluster = start_head(temp_dir, env, None if args.mode == "gpu" else 2 * nproc, log, gpus)
            summary["cluster_start_s"] = round(time.monotonic() - started, 1)
        with open(out / "train.log", "w") as train_log, tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
            for name, flags in runs:
                log_dir = tmp / f"logs-{name}"
                command = [sys.executable, "-m", "miles_profile.record", "--log-dir", str(log_dir), "--",
                           "--launcher", "ray", "--nproc-per-node", str(nproc), *flags]
                train_log.write(f"$ RAY_ADDRESS={cluster.address} {shlex.join(command)}\n")
                train_log.flush()
                started = time.monotonic()
                try:
                    code = subprocess.run(command, env=dict(env, RAY_ADDRESS=cluster.address), stdout=train_log,
                                          stderr=subprocess.STDOUT, timeout=TIMEOUT_S[args.mode]).returncode
                except subprocess.TimeoutExpired:
                    code = 124
                codes.append(code)
                entry = {"exit": code, "wall_s": round(time.monotonic() - started, 1), "flags": flags}
                train_log.write(f"exit {code} after {entry['wall_s']} s\n\n")
                run_dirs = sorted(p for p in log_dir.glob("*") if p.is_dir()) if log_dir.is_dir() else []
                for run_dir in run_dirs:  # before loading: the reader leaves caches beside the CSVs
                    tar.add(run_dir, arcname=f"{name}/{run_dir.name}")
                if run_dirs:
                    try:
                        entry.update(summarize(run_dirs[-1], args.mode, nproc, "--use-critic" in flags))
                    except Exception as exc:  # noqa: BLE001 - the summary says what broke; the tar has the run
                        entry["problems"] = [f"summary failed: {type(exc).__name__}: {exc}"]
                else:
                    entry["problems"] = ["no run directory written"]
                summary["runs"][name] = entry
    except Exception as exc:  # noqa: BLE001 - one line in the summary, whatever broke
        summary["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if cluster is not None:
            kill(cluster.processes())
            time.sleep(1.0)
            left = cluster.processes()
            summary["left_running"] = [" ".join(p.cmdline()[:3]) for p in left if p.is_running()]
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    summary["ok"] = (not summary.get("error") and codes and all(c == 0 for c in codes)
                     and not summary.get("left_running")
                     and all(not r.get("problems") for r in summary["runs"].values()))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    for name, entry in summary["runs"].items():
        roles = Counter((p["role"], p["ray_actor_class"]) for p in entry.get("processes", []))
        verdicts = Counter(f["status"] for f in entry.get("offload_drop", []))
        print(f"ray_gpu {name}: exit {entry['exit']} in {entry['wall_s']} s; processes {dict(roles)}; "
              f"offload_drop {dict(verdicts)}; oom {entry.get('oom', {}).get('status')}; "
              f"warnings {len(entry.get('warnings', []))}; problems {entry.get('problems')}")
    print(f"ray_gpu: cluster started in {summary.get('cluster_start_s')} s; left running "
          f"{summary.get('left_running')}; error {summary.get('error')}; ok {summary['ok']}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
