"""The fleet view in `visualize`, on real recorded runs: 2 ranks, each an actor and an engine process
(real Recorders in subprocesses, MILES_PROFILE_HOST/ROLE and RANK in their environment), rank 1's
actor leaking 64 MiB an iteration (bench/record_fleet_run.py)."""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import miles_profile as mp
from bench.record_fleet_run import record_fleet_run
from miles_profile import visualize
from miles_profile.report import fleet_report
from miles_profile.report.build import load_inputs
from miles_profile.report.html import build_run_report
from miles_profile.runmodel.phase_table import phase_table, window_stats

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    # 7 iterations: the leak trend needs 5 after the warm-up one
    return record_fleet_run(tmp_path_factory.mktemp("fleet"), ranks=2, iterations=7, leak_rank=1)


def test_phase_table_identity_from_the_metas(fleet_run):
    run = mp.load(fleet_run)
    table = phase_table(run)
    metas = {(p["host"], p["pid"]): p for p in run.processes}
    assert set(zip(table["host"], table["pid"])) == set(metas)  # every process with phases
    for (host, pid), rows in table.groupby(["host", "pid"]):
        meta = metas[(host, pid)]
        assert set(rows["rank"]) == {meta["rank"]} and set(rows["role"]) == {meta["role"]}
    # the engine carries the rank it serves (its RANK env), so each rank's lane holds both processes
    assert sorted(table.drop_duplicates("pid")[["rank", "role"]].itertuples(index=False)) == \
        [(0, "actor"), (0, "engine"), (1, "actor"), (1, "engine")]
    assert (table["gpu_uuid"] == "").all() and np.isfinite(table["gpu_total"]).all()  # CPU: host lanes
    assert table["rss_peak"].notna().all() and (table["iteration"] >= 0).all()


def test_summaries_equal_samples(fleet_run):
    """The table from the end events' summaries equals the one computed from the samples (the
    version-1 fallback: a log without summaries)."""
    run = mp.load(fleet_run)
    from_summaries = phase_table(run)
    assert len(run.phase_summaries)
    old = mp.load(fleet_run)
    old.__dict__["phase_summaries"] = run.phase_summaries.iloc[:0]  # as a log written before summaries
    from_samples = phase_table(old)
    columns = [f"rss_{s}" for s in ("peak", "floor", "first", "last")]
    pd.testing.assert_frame_equal(from_summaries[columns], from_samples[columns])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 100)), min_size=0, max_size=30),
       st.lists(st.tuples(st.floats(-2, 32), st.floats(0, 10)), min_size=1, max_size=8))
def test_window_stats_against_brute_force(values, windows):
    y = np.array([np.nan if v is None else float(v) for v in values])
    t = np.arange(len(y), dtype=float)
    starts = np.array([w[0] for w in windows])
    ends = starts + np.array([w[1] for w in windows])
    got = window_stats(t, y, starts, ends)
    for k, (a, b) in enumerate(zip(starts, ends)):
        inside = y[(t > a) & (t <= b)]
        inside = inside[np.isfinite(inside)]
        want = (inside.max(), inside.min(), inside[0], inside[-1]) if len(inside) else (np.nan,) * 4
        np.testing.assert_array_equal([g[k] for g in got], want)


def test_visualize_fleet_verdicts_and_html(fleet_run, tmp_path, capsys):
    out = tmp_path / "r.html"
    code = visualize.main([str(fleet_run), "-o", str(out)])
    printed = capsys.readouterr().out
    assert code == 1, printed  # rank 1 leaks
    leak = next(line for line in printed.splitlines() if re.search(r"^\s+(PASS|FAIL|WARN|N/A|SMALL)\s+leak\b", line))
    assert "FAIL" in leak and "judged 4 processes" in leak and "actor rank 1" in leak
    for name in ("rank_imbalance", "floor_trend_leak", "serialized_peaks_per_gpu"):
        assert name in printed
    page = out.read_text()
    assert 'id="fleet"' in page and "fleet-heatmap-0" in page and "lane-fig-0-1" in page
    assert page.index('id="fleet"') < page.index("<h3>Checks</h3>")  # the Fleet section comes first
    assert re.search(r'class="lane-link" data-target="lane-fig-0-\d" data-t0="[\d.]+" data-t1="[\d.]+"', page)
    assert "Plotly.relayout" in page and not re.search(r"<script[^>]*\bsrc=", page)  # offline: all inlined
    assert 'id="timeline-0"' not in page  # no figure with a line per process of the whole run
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', page).group(1))
    assert data["fleet"][0]["lanes"] == 2


def test_lanes_option_and_lazy_samples(fleet_run, tmp_path, monkeypatch, capsys):
    # as if the run were large: samples are read for the picked lanes only
    monkeypatch.setattr(fleet_report, "FULL_READ_MAX_PROCESSES", 2)
    (run,), _ = load_inputs([str(fleet_run)], lazy=True)
    assert run.sample_pids == frozenset() and run.samples.empty
    report = build_run_report(run, lanes="rank:1")
    ranks = {p["pid"]: p["rank"] for p in report.run.processes}
    assert {ranks[p] for p in report.run.samples["pid"].unique()} == {1}
    assert report.fleet.picked == [lane for lane in report.fleet.lanes["lane"] if lane.endswith("rank1")]
    leak = next(c for c in report.checks if c.name == "leak")
    assert "judged 2 processes" in leak.summary and "2 more not judged" in leak.summary
    # the fleet checks still judge all four processes, from the summaries
    trend = next(c for c in report.checks if c.name == "floor_trend_leak")
    assert trend.judged.get("processes") == 4
    assert visualize.main([str(fleet_run), "-o", str(tmp_path / "r.html"), "--lanes", "rank:7"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "matches no lane" in err


@pytest.mark.browser
def test_outlier_link_zooms_its_lane_offline(fleet_run, tmp_path, open_report):
    out = tmp_path / "r.html"
    visualize.main([str(fleet_run), "-o", str(out)])
    page, requests, errors = open_report(out, width=1300)
    page.wait_for_selector("#lane-fig-0-1 .main-svg", timeout=30_000)
    link = page.locator("a.lane-link").first
    target, t0, t1 = (link.get_attribute(a) for a in ("data-target", "data-t0", "data-t1"))
    link.click()
    page.wait_for_timeout(300)
    shown = page.evaluate(f"() => document.getElementById('{target}').layout.xaxis.range")
    assert shown[0] < float(t0) < float(t1) < shown[1] and shown[1] - shown[0] < 3 * (float(t1) - float(t0)) + 1.1
    assert page.evaluate("() => location.hash") == "#" + target.replace("lane-fig-", "lane-")
    assert not errors and not requests


def test_used_from_host_samples_and_proc_from_gpu_procs(tmp_path):
    """A GPU run in the real format (bench writer: 1 host x 8 GPUs, actor + engine each): NVML used per
    phase window comes from host.csv, and proc from gpu_procs.csv once the summaries lack it."""
    from bench.bench_fleet_visualize import write_run
    run_dir = write_run(tmp_path, 16, minutes=4.0)
    run = mp.load(run_dir)
    table = phase_table(run)
    assert len(set(table["gpu_uuid"])) == 8 and (table["gpu_total"] == 80 * 1024 ** 3).all()
    gpus = run.gpu_samples
    for row in table.sample(40, random_state=0).itertuples():
        mine = gpus[(gpus["gpu_uuid"] == row.gpu_uuid) & (gpus["t"] > row.t0) & (gpus["t"] <= row.t1)]
        np.testing.assert_equal([row.used_peak, row.used_floor], [mine["used"].max(), mine["used"].min()])
    # without summaries and samples of their own, proc comes from NVML's per-process rows
    from miles_profile.logdir.reader import load_run
    bare = load_run(run_dir, sample_pids=set())
    bare.__dict__["phase_summaries"] = bare.phase_summaries.iloc[:0]
    nvml = phase_table(bare)
    procs = run.gpu_procs
    for row in nvml.sample(40, random_state=1).itertuples():
        mine = procs[(procs["pid"] == row.pid) & (procs["t"] > row.t0) & (procs["t"] <= row.t1)]
        np.testing.assert_equal([row.proc_peak, row.proc_last],
                                [mine["bytes"].max(), mine["bytes"].iloc[-1] if len(mine) else np.nan])
    assert table["used_peak"].notna().mean() > 0.5 and nvml["proc_peak"].notna().mean() > 0.5
    # no summaries and no samples loaded: RSS comes from the samples files, streamed (sample_summaries.py)
    np.testing.assert_array_equal(nvml["rss_peak"], table["rss_peak"])


def test_a_fleet_gets_the_ledger_of_the_gpus_it_draws(tmp_path):
    """Past 16 processes the report accounts for the processes of the lanes drawn, not the fleet: one
    ledger lane per drawn GPU, each with both of its processes, adding up to NVML used."""
    from bench.bench_fleet_visualize import write_run
    from miles_profile.runmodel.ledger import add_up
    run = mp.load(write_run(tmp_path, 32, minutes=2.0))
    report = build_run_report(run, lanes="rank:0-2")
    frame, view = report.ledger, report.fleet
    drawn = view.lanes[view.lanes["lane"].isin(view.picked)]
    assert len(drawn) == 3 and set(frame["device"]) == set(drawn["gpu_uuid"])
    assert set(zip(frame["host"], frame["pid"])) == fleet_report.drawn_processes(view)
    assert len(fleet_report.drawn_processes(view)) == 6 < len(run.processes)
    result = add_up(frame, "gpu")
    assert result.boundaries > 0 and result.passes(0.02)


def test_one_process_runs_report_as_before(tmp_path, capsys):
    """sample_logs/h200: the one-process runs have no fleet section and their verdicts as they were; the
    one run of an actor and its engine server on the GPU (9-dist-engine-server) is judged per process and
    across the GPU, and passes; exit 0."""
    from tests.conftest import REPO
    h200 = REPO / "sample_logs" / "h200"
    assert visualize.main([str(h200), "-o", str(tmp_path / "r.html")]) == 0
    printed = capsys.readouterr().out
    blocks = dict(re.findall(r"^(\S[^\n]*):\n((?:  [^\n]*\n?)+)", printed, re.M))
    fleet_runs = {"9-dist-engine-server"}
    assert set(blocks) == {d.name for d in h200.iterdir() if d.is_dir()}
    per_process = re.compile(r"judged \d+ process")  # the fleet's aggregate; "not judged" is any check's n/a
    for name, lines in blocks.items():
        if name in fleet_runs:
            assert per_process.search(lines) and "rank_imbalance" in lines and "FAIL" not in lines, lines
        else:
            assert not per_process.search(lines) and "rank_imbalance" not in lines, (name, lines)
    page = (tmp_path / "r.html").read_text()
    assert page.count('id="fleet-heatmap-') == len(fleet_runs) and 'id="timeline-0"' in page
