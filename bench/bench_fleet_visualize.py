"""`visualize` end to end on runs of 64, 256 and 1,024 processes written in the real log format.

    python bench/bench_fleet_visualize.py [--sizes 64 256 1024] [--minutes 30] [--dir DIR] [--keep]

Each run: H hosts x 8 GPUs, an actor and an engine process per GPU (miles_profile/runmodel/fleet_synthetic.py:
the colocated loop, a hot rank 3 and a creeping rank 5), stretched to 30 iterations over `--minutes`;
per process a meta, an events file with every phase's begin and end (the end carrying its summary)
and a samples file at 50 ms (36,000 rows for 30 minutes: t, phase, gpu{i}_proc, rss); per host a host
sampler's meta, host.csv at 100 ms (host memory, `gpu_used:<UUID>` per GPU) and gpu_procs.csv (every
process on every GPU at each host sample). The samples files of the processes at the same GPU index
and role hold the same rows, so they are hard links to one file each (16 files on disk, whatever the
size); everything else is written per process and per host.

Then `python -m miles_profile.visualize RUN -o report.html` runs in a child per size; its wall time and
peak RSS (getrusage of children) are printed side by side, with the cost per process, which stays
flat when growth is at most linear. Figures: docs/report.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GPUS = 8
INTERVAL_S = 0.05
HOST_INTERVAL_S = 0.1
ITERATIONS = 30


def _write_csv(path: Path, columns: dict) -> None:
    """As the recorder writes: a plain header line (pyarrow would quote it), then the rows."""
    with pa.OSFile(str(path), "wb") as sink:
        sink.write((",".join(columns) + "\n").encode())
        pacsv.write_csv(pa.table(columns), sink, pacsv.WriteOptions(quoting_style="none", include_header=False))


def _levels(rows, t: np.ndarray, ctx: float) -> np.ndarray:
    """A process's level at times t from its phases: the phase's peak in its first half, its last
    level in the second half and until the next phase (its context before the first)."""
    t0, t1 = rows["t0"].to_numpy(), rows["t1"].to_numpy()
    k = np.searchsorted(t0, t, "right") - 1
    at = np.maximum(k, 0)
    rising = (k >= 0) & (t <= (t0[at] + t1[at]) / 2)
    level = np.where(k >= 0, rows["proc_last"].to_numpy()[at], ctx)
    return np.where(rising, rows["proc_peak"].to_numpy()[at], level)


def write_run(root: Path, processes: int, minutes: float, summaries: bool = True) -> Path:
    """`summaries=False`: the phases' end events carry no summary, as a crashed run's or a foreign log's,
    so every stage has to read the samples themselves."""
    from miles_profile.runmodel.fleet_synthetic import CTX, GPU_TOTAL, ITERATION_S, MiB, OUTSIDE, T_START, GiB, \
        synthetic_table
    hosts = processes // (2 * GPUS)
    table = synthetic_table(hosts, GPUS, ITERATIONS, hot_rank=(3, 3 * GiB), creep_rank=(5, 40 * MiB))
    stretch = minutes * 60 / (ITERATIONS * ITERATION_S)
    for c in ("t0", "t1"):
        table[c] = T_START + (table[c] - T_START) * stretch
    table = table.sort_values(["pid", "t0"]).reset_index(drop=True)
    run_dir = root / f"run-{processes}"
    run_dir.mkdir(parents=True)
    run_id = f"bench-{processes}"
    (run_dir / "meta.json").write_text(json.dumps({
        "format_version": 1, "run_id": run_id, "command": ["bench"], "host": "node0", "pid": 1,
        "start_time": T_START, "interval_ms": INTERVAL_S * 1000}))
    t = T_START + np.arange(int(minutes * 60 / INTERVAL_S)) * INTERVAL_S
    th = t[:: int(round(HOST_INTERVAL_S / INTERVAL_S))]
    # one samples file per (GPU index, role), from host 0's processes; hard-linked for every host
    templates, levels_h = {}, {}
    by_pid = dict(tuple(table.groupby("pid", sort=False)))
    first_host = table[table["host"] == "node0"]
    for (g, role), rows in first_host.groupby(["gpu_index", "role"]):
        rows = by_pid[int(rows["pid"].iloc[0])]
        level = _levels(rows, t, CTX)
        k = np.searchsorted(rows["t0"].to_numpy(), t, "right") - 1
        inside = (k >= 0) & (t <= rows["t1"].to_numpy()[np.maximum(k, 0)])
        phase = np.where(inside, rows["phase"].to_numpy()[np.maximum(k, 0)], "")
        path = root / f"template-gpu{g}-{role}.csv"
        _write_csv(path, {"t": np.round(t, 6), "phase": phase, f"gpu{g}_proc": level.astype(np.int64),
                          "rss": np.full(len(t), 2 * GiB, dtype=np.int64)})
        templates[(g, role)] = path
        levels_h[(g, role)] = _levels(rows, th, CTX).astype(np.int64)
    for (host, pid), rows in table.groupby(["host", "pid"], sort=False):
        first = rows.iloc[0]
        g, role, rank = int(first["gpu_index"]), str(first["role"]), int(first["rank"])
        stem = f"{host}-{pid}"
        os.link(templates[(g, role)], run_dir / f"{stem}.samples.csv")
        (run_dir / f"{stem}.meta.json").write_text(json.dumps({
            "format_version": 1, "host": host, "pid": int(pid), "run_id": run_id, "rank": rank,
            "local_rank": g, "world_size": processes // 2, "role": role, "host_sampler": g == 0 and role == "actor",
            "gpu_uuid": first["gpu_uuid"], "start_time": T_START, "end_time": float(t[-1]), "stem": stem,
            "interval_ms": INTERVAL_S * 1000, "columns": ["t", "phase", f"gpu{g}_proc", "rss"], "probes": []}))
        lines = []
        for r in rows.itertuples(index=False):
            exp = f',"expected_bytes":{int(r.expected_bytes)}' if r.expected_bytes == r.expected_bytes else ""
            lines.append(f'{{"t":{r.t0:.6f},"kind":"begin","name":"{r.phase}","pid":{pid},"host":"{host}",'
                         f'"id":{r.phase_id},"parent":null,"attrs":{{"rollout_id":{r.iteration}{exp}}}}}\n')
            n = max(1, int((r.t1 - r.t0) / INTERVAL_S))
            if not summaries:
                lines.append(f'{{"t":{r.t1:.6f},"kind":"end","name":"{r.phase}","pid":{pid},"host":"{host}",'
                             f'"id":{r.phase_id},"parent":null,"attrs":{{"status":"ok"}}}}\n')
                continue
            lines.append(f'{{"t":{r.t1:.6f},"kind":"end","name":"{r.phase}","pid":{pid},"host":"{host}",'
                         f'"id":{r.phase_id},"parent":null,"attrs":{{"status":"ok","summary":{{"rows":{n},'
                         f'"t_first":{r.t0 + INTERVAL_S:.6f},"t_last":{r.t1:.6f},"series":{{"gpu{g}_proc":'
                         f'{{"peak":{int(r.proc_peak)},"floor":{int(r.proc_floor)},"first":{int(r.proc_first)},'
                         f'"last":{int(r.proc_last)}}},"rss":{{"peak":{2 * GiB},"floor":{2 * GiB},'
                         f'"first":{2 * GiB},"last":{2 * GiB}}}}}}}}}}}\n')
        (run_dir / f"{stem}.events.jsonl").write_text("".join(lines))
    # per host: the host sampler's files (held by the actor of GPU 0)
    for h in range(hosts):
        host = f"node{h}"
        mine = table[table["host"] == host].drop_duplicates("pid")
        holder = int(mine[(mine["gpu_index"] == 0) & (mine["role"] == "actor")]["pid"].iloc[0])
        stem = f"{host}-{holder}"
        uuids = [mine[mine["gpu_index"] == g]["gpu_uuid"].iloc[0] for g in range(GPUS)]
        (run_dir / f"{stem}.host.json").write_text(json.dumps({
            "format_version": 1, "host": host, "pid": holder, "start_time": T_START, "end_time": float(t[-1]),
            "interval_ms": HOST_INTERVAL_S * 1000, "stem": stem,
            "gpus": [{"uuid": u, "name": "NVIDIA H100", "total": GPU_TOTAL, "index": g} for g, u in enumerate(uuids)],
            "probes": [{"name": "host", "active": True, "total": 2048 * GiB}]}))
        columns = {"t": np.round(th, 6), "host_available": np.full(len(th), 1500 * GiB, dtype=np.int64),
                   "host_total": np.full(len(th), 2048 * GiB, dtype=np.int64),
                   "cgroup_usage": np.full(len(th), 300 * GiB, dtype=np.int64)}
        for g, u in enumerate(uuids):
            columns[f"gpu_used:{u}"] = levels_h[(g, "actor")] + levels_h[(g, "engine")] + OUTSIDE
        _write_csv(run_dir / f"{stem}.host.csv", columns)
        pids, gpu_col, values = [], [], []
        for g, u in enumerate(uuids):
            for role in ("actor", "engine"):
                pid = int(mine[(mine["gpu_index"] == g) & (mine["role"] == role)]["pid"].iloc[0])
                pids.append(np.full(len(th), pid, dtype=np.int64))
                gpu_col.append(np.full(len(th), u, dtype=object))
                values.append(levels_h[(g, role)])
        order = np.argsort(np.tile(np.arange(len(th)), 2 * GPUS), kind="stable")  # by time, as written
        _write_csv(run_dir / f"{stem}.gpu_procs.csv", {
            "t": np.tile(np.round(th, 6), 2 * GPUS)[order], "gpu_uuid": np.concatenate(gpu_col)[order],
            "pid": np.concatenate(pids)[order], "bytes": np.concatenate(values)[order]})
    return run_dir


MEASURE = """
import resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(done.returncode, wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime)
sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
"""


def measure(run_dir: Path, lanes: str | None, repo: Path = REPO) -> dict:
    """visualize of `run_dir` with the code of `repo` (another checkout: an A/B in one session)."""
    command = [sys.executable, "-m", "miles_profile.visualize", str(run_dir), "-o", str(run_dir / "report.html")]
    if lanes:
        command += ["--lanes", lanes]
    env = {**os.environ, "PYTHONPATH": str(repo), "MILES_PROFILE_CACHE": "0"}
    done = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, env=env, cwd=repo)
    code, wall, rss, cpu = done.stdout.split()
    return {"exit": int(code), "wall_s": float(wall), "peak_rss": int(rss), "cpu_s": float(cpu), "output": done.stderr,
            "html_bytes": (run_dir / "report.html").stat().st_size if (run_dir / "report.html").exists() else 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--dir", help="where to write the runs (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the runs written")
    parser.add_argument("--lanes", help="--lanes for visualize (default: its own, worst:8)")
    parser.add_argument("--verbose", action="store_true", help="print visualize's output")
    args = parser.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-fleet-visualize-"))
    results = []
    try:
        for size in args.sizes:
            started = time.perf_counter()
            run_dir = root / f"p{size}" / f"run-{size}"
            if not (run_dir / "meta.json").is_file():  # --dir --keep: a run written before is reused
                run_dir = write_run(root / f"p{size}", size, args.minutes)
            written = time.perf_counter() - started
            result = measure(run_dir, args.lanes)
            result.update(processes=size, write_s=written)
            results.append(result)
            if args.verbose or result["exit"] not in (0, 1):
                print(result["output"])
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()
    print(f"visualize end to end, {args.minutes:g} min at {INTERVAL_S * 1000:g} ms, {ITERATIONS} iterations "
          f"(load average {load[0]:.1f} on {os.cpu_count()} cores)")
    print(f"{'processes':>10} {'exit':>5} {'wall s':>8} {'peak RSS GiB':>13} {'ms/process':>11} {'HTML MB':>8} {'write s':>8}")
    for r in results:
        print(f"{r['processes']:>10} {r['exit']:>5} {r['wall_s']:>8.1f} {r['peak_rss'] / 1024 ** 3:>13.2f} "
              f"{1000 * r['wall_s'] / r['processes']:>11.1f} {r['html_bytes'] / 1e6:>8.1f} {r['write_s']:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
