"""Importing what Miles' `--use-miles-dashboard` writes (miles_profile/importers/miles_dashboard.py).

The fixture is NOT from a real Miles run: `write_miles_dashboard` below writes a dashboard directory
from the schema in radixark/miles `miles/dashboard/store.py` at commit
0e33f812698c0ddaa4d43ae0e0da1d3c8679eabe (PhaseEvent, GpuSample, TopologySnapshot, Meta; hourly
partitions `<stream>/<YYYYMMDD_HH>.jsonl`, phases keyed by their END hour, open markers by their start)
and the writers `gpu_sampler.py` (mem_mb = NVML used >> 20, one sample per GPU per second) and
`hooks.py` (a training rank's intervals carry its node, GPUs and rank; the rollout manager's carry no
GPUs and rank -1). Phase names are those of Miles' timeline palette (static/views_timeline.js).
Shape: 2 hosts x 4 GPUs, 8 training ranks, 4 colocated rollout engines of 2 GPUs each, 1 s samples.
Opt-in: the `gpu_processes` stream of a later store.py (GpuProcessSample), written as gpu_sampler.py
at commit 3e08b1bf writes it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from miles_profile import names
from miles_profile.importers.miles_dashboard import load_miles_dashboard
from miles_profile.verdicts.checks import run_checks

HOSTS = ("10.0.0.1", "10.0.0.2")
GPUS = 4
START = 1_767_225_540.0  # 2025-12-31 23:59:00 UTC: the run crosses an hour (and day) partition boundary
ITER_S = 30


def _hour(ts: float) -> str:
    return time.strftime("%Y%m%d_%H", time.gmtime(ts))


def _append(root: Path, stream: str, key_ts: float, record: dict) -> None:
    folder = root / stream
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{_hour(key_ts)}.jsonl", "a") as f:
        f.write(json.dumps(record, separators=(",", ":")) + "\n")


def _level_mib(t: float, iterations: int, creep_mib: int) -> int:
    """NVML used on every GPU: engine weights + KV during rollout, the actor's state while training."""
    k = int((t - START - 5) // ITER_S)
    into = (t - START - 5) - k * ITER_S
    floor = 3_000 + creep_mib * max(k, 0)
    if k < 0 or k >= iterations:
        return floor
    if into < 12:
        return floor + 60_000  # rollout: weights + KV cache
    if into < 14:
        return floor + 2_000  # engine released, actor waking up
    if into < 24:
        return floor + 48_000  # training
    return floor + 8_000  # update_weights


def write_miles_dashboard(root: Path, iterations: int = 4, creep_mib: int = 0, uuid_host2: bool = False,
                          gpu_processes: bool = False) -> Path:
    """A Miles dashboard directory (see the module docstring); returns it. `gpu_processes` adds the
    per-process stream of a later store.py (GpuProcessSample {ts, node, gpu, pid, name, mem_mb}, every
    5 s, `(usedGpuMemory or 0) >> 20`): an actor and an engine process on each GPU of host 1."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "meta.json").write_text(json.dumps({"run_name": "fixture", "start_ts": START,
                                                "args": {"use_miles_dashboard": True}, "schema_version": 1}, indent=1))
    engines = []
    for h, node in enumerate(HOSTS):
        for e in range(GPUS // 2):
            pairs = [[node, 2 * e], [node, 2 * e + 1]]
            uuids = [f"GPU-{h}{g[1]:03d}aaaa-0000-0000-0000-000000000000" if h == 0 or uuid_host2 else None
                     for g in pairs]
            engines.append({"addr": f"http://{node}:{30000 + e}", "worker_type": "regular",
                            "engine_rank": len(engines), "gpus": pairs, "gpu_uuids": uuids})
    with open(root / "topology.jsonl", "w") as f:
        f.write(json.dumps({"ts": START + 2, "engines": engines}, separators=(",", ":")) + "\n")

    def phase(name, t0, t1, node, gpus, rank, role):
        _append(root, "phases", t0, dict(name=name, t0=t0, t1=-1.0, node=node, gpus=gpus, rank=rank, role=role))
        _append(root, "phases", t1, dict(name=name, t0=t0, t1=t1, node=node, gpus=gpus, rank=rank, role=role))

    for k in range(iterations):
        t = START + 5 + k * ITER_S
        phase("rollout", t, t + 12, HOSTS[0], [], -1, "rollout_manager")
        for h, node in enumerate(HOSTS):
            for g in range(GPUS):
                rank = h * GPUS + g
                phase("train_wait", t, t + 12, node, [g], rank, "train")
                phase("wake_up", t + 12.2, t + 13.8, node, [g], rank, "train")
                phase("log_probs", t + 14, t + 16, node, [g], rank, "train")
                phase("data_preprocess", t + 14.2, t + 14.8, node, [g], rank, "train")  # nested in log_probs
                phase("actor_train", t + 16, t + 23.8, node, [g], rank, "train")
                phase("update_weights", t + 24, t + 28, node, [g], rank, "train")
                phase("sleep", t + 28.1, t + 29.5, node, [g], rank, "train")
    end = START + 5 + iterations * ITER_S + 3
    for ts in np.arange(START, end, 5.0) if gpu_processes else []:
        for g in range(GPUS):
            level = _level_mib(float(ts), iterations, creep_mib)
            _append(root, "gpu_processes", ts, dict(ts=float(ts), node=HOSTS[0], gpu=g, pid=4000 + g,
                                                    name="ray::TrainActor", mem_mb=level // 3))
            _append(root, "gpu_processes", ts, dict(ts=float(ts), node=HOSTS[0], gpu=g, pid=5000 + g // 2,
                                                    name="sglang::scheduler", mem_mb=0 if g == 3 else level // 2))
    for ts in np.arange(START, end, 1.0):
        for node in HOSTS:
            for g in range(GPUS):
                _append(root, "gpu_util", ts, dict(ts=float(ts), node=node, gpu=g, util=50,
                                                   mem_mb=_level_mib(float(ts), iterations, creep_mib), power_w=400))
    return root


@pytest.fixture
def dashboard(tmp_path) -> Path:
    return write_miles_dashboard(tmp_path / "dump" / "dashboard")


def test_import_gives_ranks_engines_phases_and_gpu_samples(dashboard):
    assert len(list((dashboard / "gpu_util").glob("*.jsonl"))) == 2  # the fixture crosses an hour
    run = load_miles_dashboard(dashboard.parent)  # <dump-details> works as well as <dump-details>/dashboard
    actors = [p for p in run.processes if p["role"] == "actor"]
    engines = [p for p in run.processes if p["role"] == "engine"]
    assert sorted(p["rank"] for p in actors) == list(range(8))
    assert len(engines) == 8 and {p["rank"] for p in engines} == set(range(8))  # each serves its GPU's rank
    assert {p["host"] for p in actors} == set(HOSTS)
    # GPU identity: the topology's UUID on host 1, the stable <node>:<index> where Miles gave none.
    uuid_of = {(p["host"], p["gpu_index"]): p["gpu_uuid"] for p in actors}
    assert uuid_of[(HOSTS[0], 2)] == "GPU-0002aaaa-0000-0000-0000-000000000000"
    assert uuid_of[(HOSTS[1], 3)] == f"{HOSTS[1]}:3"
    assert {p["gpu_uuid"] for p in engines} == set(uuid_of.values())

    # Phases: canonical names, one instance per interval (the open markers superseded), iterations from rollouts.
    phases = run.phases
    rank3 = next(p["pid"] for p in actors if p["rank"] == 3)
    mine = phases[phases["pid"] == rank3]
    assert mine["name"].value_counts().to_dict() == {
        "train_wait": 4, names.ONLOAD_TRAIN: 4, "log_probs": 4, "data_preprocess": 4, names.TRAIN: 4,
        names.UPDATE_WEIGHTS: 4, names.OFFLOAD_TRAIN: 4}
    assert (mine["status"] == "ok").all()
    inner = mine[mine["name"] == "data_preprocess"].iloc[0]
    outer = mine[(mine["name"] == "log_probs") & (mine["rollout_id"] == inner["rollout_id"])].iloc[0]
    assert (inner["depth"], inner["parent"]) == (1, outer["id"]) and outer["depth"] == 0
    assert sorted(mine.loc[mine["name"] == names.TRAIN, "rollout_id"]) == [0, 1, 2, 3]
    generate = phases[phases["name"] == names.GENERATE]
    assert len(generate) == 4 * 8 and set(generate["pid"]) == {p["pid"] for p in engines}

    # NVML samples: MiB x 2**20 bytes, per (host, GPU); every process on a GPU carries its level.
    gpu = run.gpu_samples
    assert len(gpu) == 8 * len(np.arange(START, START + 5 + 4 * ITER_S + 3, 1.0))
    first = gpu[(gpu["host"] == HOSTS[1]) & (gpu["gpu_uuid"] == f"{HOSTS[1]}:3")].iloc[10]
    assert first["used"] == _level_mib(first["t"], 4, 0) * 1_048_576  # MiB (used >> 20), not 10**6
    own = run.samples[run.samples["pid"] == rank3]
    assert own["gpu3_used"].notna().all() and own[["gpu0_used", "gpu1_used", "gpu2_used"]].isna().all().all()
    engine3 = next(p["pid"] for p in engines if p["rank"] == 3)
    theirs = run.samples[run.samples["pid"] == engine3]
    assert theirs["gpu3_used"].tolist() == own["gpu3_used"].tolist() and set(theirs["phase"]) >= {names.GENERATE}
    assert run.samples["t"].is_monotonic_increasing
    assert not any(c.endswith(("_alloc", "_reserved", "_proc")) or c.startswith("rss") for c in run.samples)
    assert run.host_samples.empty and run.gpu_procs.empty  # absent, not zero
    assert [h["host"] for h in run.hosts] == list(HOSTS) and all(g["total"] is None for h in run.hosts for g in h["gpus"])
    assert run.phase_summaries.empty


def test_checks_judge_what_nvml_allows_and_say_na_for_the_rest(dashboard, tmp_path):
    results = {r.name: r for r in run_checks(load_miles_dashboard(dashboard))}
    assert results["offload_drop"].status == "n/a"  # Miles' sleep carries no expected_bytes
    assert results["serialized_peaks"].status == "n/a"
    assert results["headroom"].status == "n/a" and "totals not recorded" in results["headroom"].summary
    assert results["disk_offload_host_flat"].status == "n/a" and results["host_weight_copies"].status == "n/a"
    assert results["leak"].status == "n/a"  # 4 iterations: warm-up + 3, below the 5 a leak trend needs
    flat = write_miles_dashboard(tmp_path / "flat" / "dashboard", iterations=7)
    assert {r.name: r for r in run_checks(load_miles_dashboard(flat))}["leak"].status == "pass"
    leaky = write_miles_dashboard(tmp_path / "leaky" / "dashboard", iterations=7, creep_mib=3 * 1024)
    assert {r.name: r for r in run_checks(load_miles_dashboard(leaky))}["leak"].status == "fail"


def test_damaged_lines_are_dropped_and_named(dashboard):
    part = sorted((dashboard / "gpu_util").glob("*.jsonl"))[-1]
    with open(part, "a") as f:
        f.write("not json\n{\"ts\": 1")  # a garbage line, then a writer killed mid-append
    run = load_miles_dashboard(dashboard)
    assert any("truncated last line" in w for w in run.warnings)
    assert any("malformed" in w for w in run.warnings)
    assert len(run.gpu_samples) == 8 * len(np.arange(START, START + 5 + 4 * ITER_S + 3, 1.0))


def test_visualize_and_dashboard_list_it(dashboard, tmp_path):
    from dashboards.paths import LogRoot
    from dashboards.runs import list_runs
    from miles_profile.report.build import VisualizeOptions, visualize

    out = tmp_path / "report.html"
    lines: list[str] = []
    code = visualize(VisualizeOptions([str(dashboard.parent)], output=str(out)), echo=lines.append)
    assert code == 0, lines
    assert any("leak" in line and "N/A" in line for line in lines)  # 4 iterations: below the 5 a trend needs
    html = out.read_text()
    assert "sampled levels only" in html and "true peaks between samples are kept" not in html
    assert "2 hosts: 10.0.0.1, 10.0.0.2" in html and "total unknown" in html
    root = LogRoot(dashboard.parent)
    runs = list_runs(root)
    assert [r.run_id for r in runs] == ["dashboard"] and runs[0].start_time == START and not runs[0].problem
    assert runs[0].command == "Miles dashboard: fixture"
    from dashboards.live_run import RunCache
    opened = RunCache(root).get("dashboard").current  # what the dashboard's pages read
    assert {p["role"] for p in opened.processes} == {"actor", "engine"} and len(opened.gpu_samples)
    from dashboards.panels import checks as checks_panel, phases as phases_panel, timeline as timeline_panel
    assert len(timeline_panel.build_figure(opened, "dashboard", None).data)
    assert {r.name for r in checks_panel.compute(opened)[0]} >= {"leak", "headroom"}
    table, _ = phases_panel.compute(opened, by_iteration=True)
    assert {names.TRAIN, names.GENERATE, names.OFFLOAD_TRAIN} <= set(table["name"])


def test_links_out_of_the_directory_are_not_followed(dashboard, tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps(dict(ts=START, node="evil", gpu=0, util=0, mem_mb=1, power_w=0)) + "\n")
    (dashboard / "gpu_util" / "20260101_05.jsonl").symlink_to(outside)
    assert "evil" not in set(load_miles_dashboard(dashboard).gpu_samples["host"])


@pytest.mark.slow
def test_visualize_cli_leak_fails_without_traceback(tmp_path):
    from tests.conftest import python_env
    leaky = write_miles_dashboard(tmp_path / "dump" / "dashboard", iterations=7, creep_mib=3 * 1024)
    proc = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(leaky), "-o", str(tmp_path / "r.html")],
                          capture_output=True, text=True, env=python_env(), timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "FAIL  leak" in proc.stdout


def test_phases_are_what_the_reader_makes_of_the_events(dashboard):
    """The importer builds the phases table directly (the reader's loop costs seconds on a fleet): it
    must equal what logdir.reader makes of the same events, and each sample's phase the reader's label."""
    from miles_profile.logdir.reader import PHASE_COLUMNS, phase_timeline, phases_from_events
    run = load_miles_dashboard(dashboard)
    expected = phases_from_events(run.events, run.samples)
    columns = [c for c in PHASE_COLUMNS if c != "attrs"] + ["rollout_id", "miles_name"]
    key = ["pid", "id"]
    got = run.phases[columns].sort_values(key).reset_index(drop=True)
    want = expected[columns].sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)  # the reader builds by columns (string dtype)
    for pid in run.samples["pid"].unique()[:3]:
        own = run.samples[run.samples["pid"] == pid]
        times, labels = phase_timeline(run.events[run.events["pid"] == pid])
        at = np.searchsorted(times, own["t"].to_numpy(), side="right") - 1
        want_labels = [labels[k] if k >= 0 else "" for k in at]
        assert own["phase"].astype(str).tolist() == want_labels


def test_gpu_samples_alone_and_an_empty_directory(dashboard, tmp_path, capsys):
    import shutil
    from miles_profile.visualize import main
    shutil.rmtree(dashboard / "phases")
    (dashboard / "topology.jsonl").unlink()
    run = load_miles_dashboard(dashboard)  # no phase, no engine: each GPU its own lane
    assert sorted(p["role"] for p in run.processes) == ["gpu"] * 8 and len(run.samples) == len(run.gpu_samples)
    assert main([str(dashboard), "-o", str(tmp_path / "a.html")]) == 0
    empty = tmp_path / "empty" / "dashboard"
    empty.mkdir(parents=True)
    (empty / "meta.json").write_text(json.dumps({"run_name": "x", "start_ts": START, "args": {}, "schema_version": 1}))
    capsys.readouterr()
    assert main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no gpu_util samples and no phases" in err
    no_nvml = write_miles_dashboard(tmp_path / "no_nvml" / "dashboard", iterations=1)
    shutil.rmtree(no_nvml / "gpu_util")
    assert main([str(no_nvml)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NVML was unavailable" in err


def test_a_run_that_died_mid_phase(dashboard):
    """Miles wrote open markers (t1 = -1) for the phases running when it died: they are open phases,
    drawn to the last sample, and their iteration is not judged by the leak check."""
    t = START + 5 + 4 * ITER_S
    for rank in range(8):
        node, gpu = HOSTS[rank // GPUS], rank % GPUS
        _append(dashboard, "phases", t, dict(name="actor_train", t0=t, t1=-1.0, node=node, gpus=[gpu], rank=rank,
                                             role="train"))
    _append(dashboard, "phases", t - 1, dict(name="rollout", t0=t - 1, t1=-1.0, node=HOSTS[0], gpus=[], rank=-1,
                                             role="rollout_manager"))
    run = load_miles_dashboard(dashboard)
    died = run.phases[run.phases["status"] == names.OPEN]
    assert len(died) == 8 + 8 and set(died["name"]) == {names.TRAIN, names.GENERATE}
    assert (died["end"] == run.meta["end_time"]).all() and (died["rollout_id"] == 4).all()
    leak = {r.name: r for r in run_checks(run)}["leak"]
    # 0 is warm-up, 4 unfinished: 3 floors judged (below the 5 a trend needs)
    assert leak.status == "n/a" and "has 3" in leak.summary


def test_a_log_directory_with_several_dashboards(tmp_path):
    from miles_profile.report.build import load_inputs
    write_miles_dashboard(tmp_path / "logs" / "dashboard", iterations=2)
    write_miles_dashboard(tmp_path / "logs" / "run2" / "dashboard", iterations=3)
    runs, notes = load_inputs([str(tmp_path / "logs")])
    assert not notes and sorted(r.phases["rollout_id"].max() for r in runs) == [1, 2]


def test_per_process_gpu_memory_of_a_later_miles(tmp_path):
    run = load_miles_dashboard(write_miles_dashboard(tmp_path / "dashboard", gpu_processes=True))
    procs = run.gpu_procs
    assert set(procs["pid"]) == {4000, 4001, 4002, 4003, 5000, 5001}  # the host's pids, as Miles saw them
    gpu2 = procs[(procs["gpu_uuid"] == "GPU-0002aaaa-0000-0000-0000-000000000000") & (procs["pid"] == 4002)]
    assert len(gpu2) == len(np.arange(START, START + 5 + 4 * ITER_S + 3, 5.0))
    assert gpu2["bytes"].iloc[3] == _level_mib(gpu2["t"].iloc[3], 4, 0) // 3 * 1_048_576
    unreported = procs[(procs["pid"] == 5001) & (procs["gpu_uuid"].astype(str).str.endswith("0003aaaa-0000-0000-0000-000000000000"))]
    assert len(unreported) and unreported["bytes"].isna().all()  # Miles wrote None as 0: absent, not zero
