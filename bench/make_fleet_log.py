"""Write a synthetic fleet run in the real log format (docs/log-format.md), for the dashboard's fleet
benchmark and browser test.

    python bench/make_fleet_log.py OUT_DIR [--hosts 64] [--gpus 8] [--minutes 3] [--interval-ms 50]

H hosts x G GPUs, on each GPU an actor rank and the engine process serving it (2 x H x G processes),
with the phase structure and levels of miles_profile/runmodel/fleet_synthetic.py (its injections: rank 5
runs 6 GiB hot in train, rank 9's floor creeps 256 MiB per iteration, rank 3's engine frees 3 GiB too
little in iteration 2's offload_kv). Per process: meta (host, pid, rank, role, gpu_uuid), samples (rss,
gpu0_alloc, gpu0_reserved; the process's own level: first for the first third of a phase, peak for
the middle third, last for the rest and until its next phase) and events whose `end` carries the
summary of those series. Per host: host meta with the GPUs, host.csv (NVML used per GPU: both
processes plus 300 MiB outside them) and gpu_procs.csv (every process's bytes), every 100 ms.
The files are written directly with numpy/pyarrow; no recorder runs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from miles_profile.runmodel import fleet_synthetic as fs  # noqa: E402

HOST_INTERVAL_S = 0.1
RSS = 3 * fs.GiB
RUN_ID = "fleet-synthetic"


def _write_csv(path: Path, columns: dict[str, np.ndarray]) -> None:
    columns = {k: np.round(v, 6) if k == "t" else v for k, v in columns.items()}
    with pa.OSFile(str(path), "wb") as sink:  # an unquoted header, as the recorder writes it
        sink.write((",".join(columns) + "\n").encode())
        pacsv.write_csv(pa.table(columns), sink, pacsv.WriteOptions(include_header=False, quoting_style="none"))


def _levels(t: np.ndarray, rows) -> np.ndarray:
    """A process's level at times `t` from its phase rows (sorted by t0), as the module docstring says."""
    t0, t1 = rows["t0"].to_numpy(), rows["t1"].to_numpy()
    first, peak, last = (rows[f"proc_{k}"].to_numpy() for k in ("first", "peak", "last"))
    i = np.searchsorted(t0, t, "right") - 1
    j = np.maximum(i, 0)
    pos = (t - t0[j]) / np.maximum(t1[j] - t0[j], 1e-9)
    level = np.where(pos < 1 / 3, first[j], np.where(pos < 2 / 3, peak[j], last[j]))
    return np.where(i >= 0, level, first[0]).astype(np.int64)


def _events(rows, pid: int, host: str) -> str:
    lines = []
    for k, r in enumerate(rows.itertuples(index=False), start=1):
        attrs = {"rollout_id": int(r.iteration)}
        if r.expected_bytes == r.expected_bytes:
            attrs["expected_bytes"] = int(r.expected_bytes)
        stats = {"peak": int(r.proc_peak), "floor": int(r.proc_floor), "first": int(r.proc_first),
                 "last": int(r.proc_last)}
        summary = {"rows": 1, "t_first": r.t0, "t_last": r.t1,
                   "series": {"rss": {"peak": RSS, "floor": RSS, "first": RSS, "last": RSS},
                              "gpu0_reserved": stats, "gpu0_alloc": stats}}
        base = {"name": r.phase, "pid": pid, "host": host, "id": k, "parent": None}
        lines.append(json.dumps({"t": r.t0, "kind": "begin", **base, "attrs": attrs}))
        lines.append(json.dumps({"t": r.t1, "kind": "end", **base, "attrs": {"status": "ok", "summary": summary}}))
    return "\n".join(lines) + "\n"


def write_fleet_run(run_dir: Path, hosts: int = 64, gpus: int = 8, minutes: float = 3.0,
                    interval_ms: float = 50.0) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    iterations = fs.iterations_for(minutes)
    table = fs.synthetic_table(hosts, gpus, iterations, hot_rank=(5, 6 * fs.GiB), creep_rank=(9, 256 * fs.MiB),
                               shortfall=(3, min(2, iterations - 1), 3 * fs.GiB), with_used=False)
    start, end = fs.T_START - 1.0, float(table["t1"].max()) + 1.0
    world = hosts * gpus
    (run_dir / "meta.json").write_text(json.dumps({
        "format_version": 1, "run_id": RUN_ID, "command": ["synthetic", "fleet", f"{hosts}x{gpus}"],
        "host": "node0", "pid": 1, "start_time": start, "interval_ms": interval_ms}))
    t = np.arange(start, end, interval_ms / 1000)
    host_t = np.arange(start, end, HOST_INTERVAL_S)
    device_used = {}
    for (pid, host, uuid, rank, role), rows in table.groupby(["pid", "host", "gpu_uuid", "rank", "role"], sort=False):
        rows = rows.sort_values("t0")
        stem = f"{host}-{pid}"
        (run_dir / f"{stem}.meta.json").write_text(json.dumps({
            "format_version": 1, "run_id": RUN_ID, "host": host, "pid": int(pid), "rank": int(rank),
            "local_rank": int(rank) % gpus, "world_size": world, "role": role, "gpu_uuid": uuid,
            "host_sampler": False, "start_time": start, "end_time": end, "interval_ms": interval_ms,
            "columns": ["rss", "rss_peak", "gpu0_alloc", "gpu0_reserved"]}))
        level = _levels(t, rows)
        phase_at = np.searchsorted(rows["t0"].to_numpy(), t, "right") - 1
        inside = (phase_at >= 0) & (t <= rows["t1"].to_numpy()[np.maximum(phase_at, 0)])
        labels = np.where(inside, rows["phase"].to_numpy()[np.maximum(phase_at, 0)], "")
        _write_csv(run_dir / f"{stem}.samples.csv", {
            "t": t, "phase": labels, "rss": np.full(len(t), RSS), "rss_peak": np.full(len(t), RSS),
            "gpu0_alloc": level, "gpu0_reserved": level})
        (run_dir / f"{stem}.events.jsonl").write_text(_events(rows, int(pid), host))
        device_used.setdefault((host, uuid), []).append((int(pid), _levels(host_t, rows)))
    for h in range(hosts):
        host = f"node{h}"
        uuids = [u for (hh, u) in device_used if hh == host]
        stem = f"{host}-1{h:05d}"
        (run_dir / f"{stem}.host.json").write_text(json.dumps({
            "format_version": 1, "host": host, "pid": int(f"1{h:05d}"), "start_time": start, "end_time": end,
            "interval_ms": HOST_INTERVAL_S * 1000, "lock": "flock",
            "gpus": [{"uuid": u, "name": "synthetic H100", "total": fs.GPU_TOTAL, "index": k}
                     for k, u in enumerate(uuids)]}))
        columns = {"t": host_t, "host_available": np.full(len(host_t), 1500 * fs.GiB),
                   "host_total": np.full(len(host_t), 2000 * fs.GiB)}
        proc_t, proc_uuid, proc_pid, proc_bytes = [], [], [], []
        for u in uuids:
            procs = device_used[(host, u)]
            columns[f"gpu_used:{u}"] = sum(level for _, level in procs) + fs.OUTSIDE
            for pid, level in procs:
                proc_t.append(host_t), proc_uuid.append(np.full(len(host_t), u, dtype=object))
                proc_pid.append(np.full(len(host_t), pid)), proc_bytes.append(level)
        _write_csv(run_dir / f"{stem}.host.csv", columns)
        order = np.argsort(np.concatenate(proc_t), kind="stable")
        _write_csv(run_dir / f"{stem}.gpu_procs.csv", {
            "t": np.concatenate(proc_t)[order], "gpu_uuid": np.concatenate(proc_uuid)[order].astype(str),
            "pid": np.concatenate(proc_pid)[order], "bytes": np.concatenate(proc_bytes)[order]})
    return run_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--interval-ms", type=float, default=50.0)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    write_fleet_run(args.out_dir, args.hosts, args.gpus, args.minutes, args.interval_ms)
    print(f"wrote {args.out_dir} ({2 * args.hosts * args.gpus} processes) in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
