"""Issue 33, what the first sweep left open: false FAILs and silent PASSes on damaged data. Each test builds
the damaged input for real (a log dir written by the project's writers, a Miles CSV, a Miles dump) and
failed before its fix; unit-level and fast."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from miles_profile.logdir.layout import new_run_dir
from miles_profile.logdir.reader import load_run
from miles_profile.logdir.writer import EventWriter, SampleWriter, write_process_meta, write_run_meta
from miles_profile.runmodel.fleet_synthetic import GiB, synthetic_table
from miles_profile.runmodel.phase_table import phase_table
from miles_profile.verdicts.fleet_checks import FleetThresholds, check_rank_imbalance

REPO = Path(__file__).resolve().parents[2]

MiB = 1024 ** 2


# -- item 9: one unreadable process meta is not an imbalanced rank -------------------------------------
def _host_lanes(ranks: int, hot=None):
    """A CPU fleet (host-memory lanes: one rank's actor and engine share one) of `ranks` ranks."""
    t = synthetic_table(hosts=1, gpus=ranks, iterations=6, with_used=False, hot_rank=hot)
    t["gpu_uuid"], t["gpu_total"], t["identified"] = "", float(200 * GiB), True
    for k in ("peak", "floor", "first", "last"):
        t[f"rss_{k}"], t[f"proc_{k}"] = t[f"proc_{k}"], np.nan
    return t


def _lose_meta(t, pids):
    """What the phase table holds for a process whose meta was unreadable: no rank, no role."""
    lost = t["pid"].isin(pids)
    t.loc[lost, "rank"], t.loc[lost, "role"], t.loc[lost, "identified"] = -1, "", False
    return t


def test_processes_without_a_readable_meta_are_left_out_of_rank_imbalance_not_failed():
    # three ranks, rank 0's engine and rank 1's actor unreadable: ranks 0 and 1 each lack a process, and
    # rank 2 (complete) stood out as "+100 %" over the median: a FAIL before
    t = _lose_meta(_host_lanes(3), [10_001, 10_002])
    result = check_rank_imbalance(t, FleetThresholds())
    assert result.status != "fail", result.summary
    assert "without a readable meta (pid 10001, 10002" in result.summary, result.summary
    assert "node0:rank0, node0:rank1" in result.summary, result.summary  # the lanes that may lack them


def test_a_real_imbalance_among_the_readable_ranks_still_fails():
    # four ranks, rank 0 trains 30 GiB over its peers; rank 3's actor meta is unreadable
    t = _lose_meta(_host_lanes(4, hot=(0, 30 * GiB)), [10_006])
    result = check_rank_imbalance(t, FleetThresholds())
    assert result.status == "fail", result.summary
    assert "node0:rank0" in result.summary and "pid 10006" in result.summary, result.summary


def _write_process(run: Path, pid: int, rank: int, role: str, level: int) -> None:
    stem = f"h-{pid}"
    write_process_meta(run, stem, {"pid": pid, "rank": rank, "role": role, "host": "h", "stem": stem,
                                   "end_time": 1100.0})
    samples = SampleWriter(run, stem, ["rss"])
    events = EventWriter(run, stem, pid=pid, host="h")
    name = "train" if role == "actor" else "generate"
    for it in range(4):
        t0 = 1000.0 + 10 * it + (0 if role == "actor" else 5)
        events.write("begin", name, {"rollout_id": it}, t=t0, id=it + 1, parent=None)
        for k in range(5):
            samples.append(t0 + 0.5 + k * 0.5, name, [level + k * MiB])
        events.write("end", name, {"status": "ok"}, t=t0 + 3, id=it + 1, parent=None)
    samples.close()
    events.close()


def test_a_run_whose_process_meta_is_unreadable_marks_that_process_unidentified(tmp_path):
    run = new_run_dir(tmp_path)
    write_run_meta(run, {"interval_ms": 500.0, "start_time": 1000.0})
    for r in range(3):
        _write_process(run, 100 + r, r, "actor", 2 * GiB)
        _write_process(run, 200 + r, r, "engine", 1 * GiB)
    (run / "h-101.meta.json").write_text("")  # rank 1's actor: an emptied meta
    loaded = load_run(run)
    assert any("h-101.meta.json" in w for w in loaded.warnings), loaded.warnings
    table = phase_table(loaded)
    by_pid = table.groupby("pid")["identified"].all()
    assert not by_pid[101] and by_pid.drop(101).all(), by_pid
    result = check_rank_imbalance(table, FleetThresholds())
    assert result.status != "fail" and "pid 101" in result.summary, result.summary
    json.dumps(result.summary)  # plain text


# -- transition_spikes next to a phase the reader dropped; Miles CSV damage said ---------------------
def _miles_csv(path: Path) -> list[str]:
    """The sweep's Miles CPU CSV: 3 steps of generate then train (used 14 GB in train, 10 outside)."""
    lines = ["time_s,used_gb,available_gb,percent,marker"]
    for k in range(60):
        step, at = divmod(k, 20)
        marker = {0: f"step_{step}/generate_start", 6: f"step_{step}/generate_end",
                  8: f"step_{step}/train_start", 16: f"step_{step}/train_end"}.get(at, "")
        lines.append(f"{k * 0.5:.3f},{10 + (at > 8) * 4 + k * 0.001:.3f},{50 - (at > 8) * 4:.3f},20.0,{marker}")
    path.write_text("\n".join(lines) + "\n")
    return lines


def _spikes(run):
    from miles_profile.verdicts.engine import judge
    return next(c for c in judge(run).checks if c.name == "transition_spikes")


def test_a_boundary_next_to_a_miles_phase_the_reader_dropped_is_not_judged(tmp_path):
    from miles_profile.importers.miles_csv import load_miles_csv
    path = tmp_path / "cpu_memory.csv"
    lines = _miles_csv(path)
    assert _spikes(load_miles_csv(path)).status == "pass"
    # step 0's train_start row lost its time: the train phase is gone, its 14 GB sit between generate and
    # the next generate, and read as "held outside any phase" (a FAIL before)
    lines[9] = "x" + lines[9][lines[9].index(","):]
    path.write_text("\n".join(lines) + "\n")
    run = load_miles_csv(path)
    assert any("line 10" in w and "time_s" in w for w in run.warnings), run.warnings
    assert any("end markers without a start (first: line 18)" in w for w in run.warnings), run.warnings
    result = _spikes(run)
    assert result.status != "fail", result.summary
    assert any(f.status == "n/a" and "reader dropped" in f.message for f in result.findings), result.summary


@pytest.fixture(scope="module")
def miles_dump(tmp_path_factory) -> Path:
    """The sweep's Miles dashboard dump (8 GPUs on 2 hosts, 2 iterations), its transition_spikes PASS intact."""
    from miles_profile.importers.miles_dashboard import load_miles_dashboard
    from tests.unit.test_miles_dashboard_import import write_miles_dashboard
    root = write_miles_dashboard(tmp_path_factory.mktemp("miles") / "dashboard", iterations=2)
    assert _spikes(load_miles_dashboard(root)).status == "pass"
    return root


@pytest.mark.slow  # ~3 s: a 16-process import judged
def test_a_cut_miles_dashboard_phases_file_judges_no_boundary_it_may_have_held(miles_dump, tmp_path):
    import shutil
    from miles_profile.importers.miles_dashboard import load_miles_dashboard
    root = Path(shutil.copytree(miles_dump, tmp_path / "dashboard"))
    part = sorted((root / "phases").glob("*.jsonl"))[0]
    data = part.read_bytes()
    part.write_bytes(data[: len(data) * 2 // 3 + 7])  # cut mid-line: the rest of that hour's intervals lost
    run = load_miles_dashboard(root)
    assert any("dropped a truncated last line (line" in w for w in run.warnings), run.warnings
    result = _spikes(run)
    assert result.status != "fail", result.summary
    assert any(f.status == "n/a" and "reader dropped" in f.message for f in result.findings), result.summary


def test_miles_csv_garbage_lines_and_bad_cells_are_said_naming_the_line(tmp_path):
    from miles_profile.importers.miles_csv import load_miles_csv
    path = tmp_path / "cpu_memory.csv"
    lines = _miles_csv(path)
    lines.insert(5, '1,2,3,4,5,{x,"é')  # more cells than the header, and a stray quote
    lines[30] = lines[30].replace(",20.0,", ",x,")
    lines[40] = lines[40].replace(",20.0,", ",nan,")
    lines[51] = lines[51].replace(",20.0,", ",20.0,nan")
    path.write_text("\n".join(lines) + "\n")
    run = load_miles_csv(path)
    said = "\n".join(run.warnings)
    assert "malformed line (more cells than the header; first: line 6)" in said, said
    assert "2 percent value(s) that are no percentage, ignored (first: line 31, 'x')" in said, said
    assert "1 marker label(s) 'nan' (first: line 52)" in said, said
    assert len(run.samples) == 60  # the stray quote swallowed no row after it


# -- silent PASSes: damage skipped without a word ------------------------------------------------------
def test_an_account_of_10_to_the_20_bytes_is_dropped_with_a_warning_naming_file_and_line(tmp_path):
    from tests.faults.test_faults_files import make_run
    run = make_run(tmp_path)
    with open(run / "h-7.events.jsonl", "a") as f:  # line 3, after the train phase's two lines
        f.write(json.dumps({"t": 1002.0, "kind": "account", "name": "kv_cache", "pid": 7,
                            "attrs": {"device": "host", "bytes": 10 ** 20}}) + "\n")
    loaded = load_run(run)
    assert any("h-7.events.jsonl line 3: account bytes=100000000000000000000" in w for w in loaded.warnings), \
        loaded.warnings
    assert loaded.accounts.empty


def test_a_null_word_in_a_byte_cell_is_said_not_read_as_absent(tmp_path):
    from tests.faults.test_faults_files import make_run
    run = make_run(tmp_path)
    path = run / "h-7.samples.csv"
    lines = path.read_text().splitlines()
    lines[4] = lines[4].rsplit(",", 1)[0] + ",nan"  # pyarrow read "nan" (and "NULL", "N/A") as absent, silently
    path.write_text("\n".join(lines) + "\n")
    loaded = load_run(run)
    assert any("h-7.samples.csv: 1 unreadable values set to absent (first: line 5, column rss_peak)" in w
               for w in loaded.warnings), loaded.warnings


@pytest.mark.parametrize("cell", ["0x10", "0X10"])
def test_a_hexadecimal_byte_cell_is_said_not_read_as_a_number(tmp_path, cell):
    # pyarrow reads `0x10` in an int64 column as 16: the last silent PASS of the sweep (seed 3301087)
    from tests.faults.test_faults_files import make_run
    run = make_run(tmp_path)
    path = run / "h-7.samples.csv"
    lines = path.read_text().splitlines()
    lines[4] = lines[4].rsplit(",", 1)[0] + "," + cell
    path.write_text("\n".join(lines) + "\n")
    loaded = load_run(run)
    assert any("h-7.samples.csv: 1 unreadable values set to absent (first: line 5, column rss_peak)" in w
               for w in loaded.warnings), loaded.warnings
    assert loaded.samples["rss_peak"].isna().sum() == 1  # that cell absent, not 16


def test_a_hexadecimal_cell_in_a_host_csv_is_said_not_read_as_a_number(tmp_path):
    # the seed-34 sweep: a host.csv cell retyped to 0x10 read as 16 by pyarrow, silently
    from tests.faults.test_faults_files import make_run
    run = make_run(tmp_path)
    (run / "h-9.host.json").write_text(json.dumps({"format_version": 1, "host": "h"}))
    (run / "h-9.host.csv").write_text("t,host_available\n1000.5,5\n1001.5,0x10\n1002.5,7\n")
    loaded = load_run(run)
    hosts = loaded.host_samples
    assert any(w.startswith("h-9.host.csv: unreadable values set to absent") for w in loaded.warnings), loaded.warnings
    assert 16 not in set(hosts["host_available"].dropna().astype(int))


def test_a_host_meta_whose_stem_is_a_path_is_said(tmp_path):
    from tests.faults.test_faults_files import make_run
    run = make_run(tmp_path)
    (run / "h-9.host.json").write_text(json.dumps({"format_version": 1, "host": "h", "stem": "../../../etc/passwd"}))
    (run / "h-9.host.csv").write_text("t,host_available\n1000.5,5\n")
    loaded = load_run(run)
    loaded.hosts  # read on first use
    assert any("h-9.host.json: its stem '../../../etc/passwd' is not its file's name; read as 'h-9'" in w
               for w in loaded.warnings), loaded.warnings


# -- an actor whose engine server's meta is unreadable: its rollout offloads are not its own memory ---
def _actor_and_engine(run: Path) -> None:
    """A CPU run: rank 0's actor declares offload_kv (kv_cache, 1 GiB) that its engine server frees."""
    write_run_meta(run, {"interval_ms": 100.0, "start_time": 1000.0})
    for pid, role in ((10, "actor"), (20, "engine")):
        stem = f"h-{pid}"
        write_process_meta(run, stem, {"pid": pid, "rank": 0, "role": role, "host": "h", "stem": stem,
                                       "end_time": 1030.0})
        samples = SampleWriter(run, stem, ["rss", "heap_used"])  # the heap: what an offload on CPU is judged on
        events = EventWriter(run, stem, pid=pid, host="h")
        for it in range(3):
            t0 = 1000.0 + 10 * it
            if role == "engine":
                events.write("begin", "generate", {}, t=t0, id=2 * it + 1, parent=None)
                events.write("end", "generate", {"status": "ok"}, t=t0 + 4, id=2 * it + 1, parent=None)
            else:
                events.write("begin", "offload_kv", {"rollout_id": it, "tags": ["kv_cache"],
                                                     "expected_bytes": GiB}, t=t0 + 5, id=2 * it + 2, parent=None)
                events.write("end", "offload_kv", {"status": "ok"}, t=t0 + 7, id=2 * it + 2, parent=None)
            for k in range(100):
                t = t0 + k * 0.1
                held = role == "engine" and not 5.5 <= k * 0.1 < 9.9  # the engine frees its KV cache
                samples.append(t, "", [512 * MiB + (GiB if held else 0), 256 * MiB + (GiB if held else 0)])
        samples.close()
        events.close()


def test_an_actor_whose_engine_meta_is_unreadable_leaves_its_rollout_offloads_unjudged(tmp_path):
    from miles_profile.verdicts.engine import judge
    run = new_run_dir(tmp_path)
    _actor_and_engine(run)
    check = next(c for c in judge(load_run(run)).checks if c.name == "offload_drop")
    assert check.status == "pass" and "judged on the engine server" in " ".join(f.message for f in check.findings)
    (run / "h-20.meta.json").write_text("")  # the engine's meta emptied
    check = next(c for c in judge(load_run(run)).checks if c.name == "offload_drop")
    # before: judged on the actor's own memory, which never held the KV cache: "did not drop", a FAIL
    assert check.status != "fail", check.summary
    assert any("its engine server is unknown (pid 20" in f.message for f in check.findings), check.summary


@pytest.mark.slow  # ~3 s: a 16-process import judged
def test_a_miles_interval_that_ends_before_it_starts_is_dropped_said_and_its_gap_not_judged(miles_dump, tmp_path):
    import shutil
    from miles_profile.importers.miles_dashboard import load_miles_dashboard
    root = Path(shutil.copytree(miles_dump, tmp_path / "dashboard"))
    part = sorted((root / "phases").glob("*.jsonl"))[0]
    lines = part.read_text().splitlines()
    # a closed train_wait interval (it spans the rollout's 60 GB) with t1 retyped: found by the final sweep
    k = next(i for i, line in enumerate(lines) if '"train_wait"' in line and '"t1":-1.0' not in line
             and '"rank":5' in line and json.loads(line)["t0"] > json.loads(lines[0])["t0"])
    row = json.loads(lines[k])
    lines[k] = json.dumps({**row, "t1": -10 ** 12})
    part.write_text("\n".join(lines) + "\n")
    run = load_miles_dashboard(root)
    assert any("skipped 1 intervals that end before they start" in w for w in run.warnings), run.warnings
    result = _spikes(run)
    assert result.status != "fail", result.summary  # before: "peak 61.5 GiB ... held outside any phase"


def test_a_process_meta_whose_columns_or_devices_are_retyped_does_not_break_the_ledger(tmp_path):
    # found by the final sweep: `columns` holding a list or a bool -> "could not report this log
    # (AttributeError: 'list' object has no attribute 'startswith')", exit 2
    from miles_profile.runmodel.ledger import ledger
    run = new_run_dir(tmp_path)
    _actor_and_engine(run)
    meta = json.loads((run / "h-10.meta.json").read_text())
    meta.update(columns=["rss", ["x"], True], cuda_devices=[7, {"index": "0", "uuid": "GPU-1"}])
    (run / "h-10.meta.json").write_text(json.dumps(meta))
    ledger(load_run(run), peaks=True)  # raised before


@pytest.mark.slow  # ~3 s: a 16-process import judged
def test_a_cut_miles_gpu_util_partition_judges_no_boundary_in_its_hour(miles_dump, tmp_path):
    # found by the final sweep: the samples after the cut lost, a phase's peak read from what was left,
    # and a sample between two phases read as a 45 GiB spike
    import shutil
    from miles_profile.importers.miles_dashboard import load_miles_dashboard
    root = Path(shutil.copytree(miles_dump, tmp_path / "dashboard"))
    part = sorted((root / "gpu_util").glob("*.jsonl"))[0]
    data = part.read_bytes()
    part.write_bytes(data[: data.index(b"\n", len(data) // 3) + 9])
    run = load_miles_dashboard(root)
    assert any("gpu_util/" in w and "truncated last line" in w for w in run.warnings), run.warnings
    assert _spikes(run).status != "fail", _spikes(run).summary


@pytest.mark.parametrize("attrs", [
    {"expected_bytes": "lots", "target": 7}, {"expected_bytes": [1, 2], "tags": {"a": 1}},
    {"expected_bytes": -5, "target": None, "tags": 3}, {"expected_bytes": 1e308, "rollout_id": "x"},
], ids=["string", "list", "negative", "huge"])
@pytest.mark.slow
def test_damaged_offload_attributes_reach_the_transition_meter_and_what_if_without_an_internal_error(tmp_path, attrs):
    # issue 33 item 8: the report's transition meter and what-if read phase attributes; damaged ones lose
    # what they say, never the report
    run = new_run_dir(tmp_path)
    write_run_meta(run, {"interval_ms": 20.0, "start_time": 1000.0})
    write_process_meta(run, "h-7", {"pid": 7, "role": "in_process", "stem": "h-7", "end_time": 1012.0})
    samples = SampleWriter(run, "h-7", ["rss", "rss_peak"])
    for k in range(120):
        t = 1000.0 + k * 0.1
        level = 2 * GiB if (k // 10) % 2 == 0 else GiB
        samples.append(t, "", [level, level])
    samples.close()
    events = EventWriter(run, "h-7")
    for i in range(5):
        start = 1000.0 + 2 * i + 0.9
        events.write("begin", "offload_train", {"rollout_id": i, **attrs}, t=start, id=i + 1, parent=None)
        events.write("end", "offload_train", {"status": "ok"}, t=start + 0.3, id=i + 1, parent=None)
    events.close()
    done = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(run), "-o", str(tmp_path / "r.html")],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "could not report" not in done.stderr, done.stderr[-2000:]
    assert "moving memory cost" in (tmp_path / "r.html").read_text().lower()


@pytest.mark.slow
@pytest.mark.parametrize("which, field, value", [("h-7.meta.json", "columns", 5), ("h-7.meta.json", "devices", 1.5),
                                                 ("h-7.meta.json", "cuda_devices", [3, {"index": 0}]),
                                                 ("h-9.host.json", "gpus", 7)])
def test_a_retyped_list_in_a_meta_is_dropped_with_a_warning_not_an_internal_error(tmp_path, which, field, value):
    # found by the seed-34 sweep: `columns`, `devices` or a host's `gpus` written as a number stopped the report
    from tests.faults.test_faults_files import make_run
    run = make_run(tmp_path)
    (run / "h-9.host.json").write_text(json.dumps({"format_version": 1, "host": "h", "gpus": []}))
    (run / "h-9.host.csv").write_text("t,host_available\n1000.5,5\n")
    meta = json.loads((run / which).read_text())
    meta[field] = value
    (run / which).write_text(json.dumps(meta))
    done = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(run), "--json", str(tmp_path / "v.json")],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode in (0, 1) and "could not report" not in done.stderr, done.stderr[-2000:]
    loaded = load_run(run)
    loaded.hosts  # read on first use
    assert any(w.startswith(f"{which}: ") and repr(field) in w for w in loaded.warnings), loaded.warnings
