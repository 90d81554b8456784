"""What a Miles dashboard import shows besides memory, and why a view of it is empty (issue 18 item 6):
GPU utilization and power, the SGLang engine series as lanes of their own, a heatmap in GiB where Miles
recorded no device totals, and a reason instead of a blank view. The dump is the schema fixture of
test_miles_dashboard_import.py (not a real Miles run) plus the `engine_series` stream as Miles'
EngineSample writes it (store.py at 0e33f812: {ts, addr, metric, labels, value}, hourly partitions)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from miles_profile.importers.miles_dashboard import load_miles_dashboard
from miles_profile.importers.miles_dashboard_series import engine_series, gpu_series, series_note
from miles_profile.report.miles_series import LINES_MAX, miles_series_figure, miles_series_html
from test_miles_dashboard_import import GPUS, HOSTS, START, _append, write_miles_dashboard

ENGINES = [f"http://{HOSTS[h]}:{30000 + e}" for h in range(2) for e in range(GPUS // 2)]


def write_engine_series(root: Path, samples: int = 60) -> None:
    """Every 2 s per engine, three whitelisted metrics as the router's aggregation names them (sglang_x)."""
    for k in range(samples):
        ts = START + 5 + 2 * k
        for e, addr in enumerate(ENGINES):
            for metric, value in (("sglang_num_running_reqs", (k + e) % 7), ("sglang_token_usage", 0.1 * (e + 1)),
                                  ("sglang_gen_throughput", 1000.0 + 10 * k)):
                _append(root, "engine_series", ts, dict(ts=ts, addr=addr, metric=metric,
                                                        labels={"engine_type": "decode"} if e == 0 else {}, value=value))


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    root = write_miles_dashboard(tmp_path_factory.mktemp("miles") / "dump" / "dashboard")
    write_engine_series(root)
    return root


@pytest.fixture(scope="module")
def run(dump):
    return load_miles_dashboard(dump)


def test_utilization_power_and_engine_series_are_read_as_miles_wrote_them(run):
    gpus = gpu_series(run)
    assert len(gpus) == len(run.gpu_samples) and set(gpus["util"]) == {50.0} and set(gpus["power_w"]) == {400.0}
    assert set(zip(gpus["host"], gpus["gpu"])) == {(h, g) for h in HOSTS for g in range(GPUS)}
    engines = engine_series(run)
    assert set(engines["metric"]) == {"num_running_reqs", "token_usage", "gen_throughput"}  # prefix dropped
    assert set(engines["engine"]) == set(ENGINES) and len(engines) == 60 * len(ENGINES) * 3
    assert set(engines.loc[engines["engine"] == ENGINES[0], "engine_type"]) == {"decode"}
    assert series_note(run) == ""  # it holds both: nothing to explain


def test_each_series_is_a_lane_with_a_line_per_gpu_or_engine(run):
    from miles_profile.report.figures import run_start
    fig = miles_series_figure(gpu_series(run), engine_series(run), run_start(run))
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["GPU utilization (%)", "GPU power (W)", "SGLang: running requests",
                      "SGLang: generation throughput (tokens/s)", "SGLang: KV cache token usage (share)"]
    by_lane = {}
    for trace in fig.data:
        by_lane.setdefault(trace.yaxis, []).append(trace.name)
    assert sorted(by_lane["y"]) == sorted(f"{h}:gpu{g}" for h in HOSTS for g in range(GPUS))
    assert f"{ENGINES[0][7:]} (decode)" in by_lane["y3"] and len(by_lane["y3"]) == len(ENGINES)
    running = next(t for t in fig.data if t.yaxis == "y3" and t.name == ENGINES[1][7:])
    assert np.asarray(running.y, float)[:3].tolist() == [1.0, 2.0, 3.0]  # (k + e) % 7, engine 1
    assert np.asarray(running.x, float)[0] == pytest.approx(5.0)  # seconds since the run started


def test_past_the_line_limit_a_lane_draws_the_median_and_range(run):
    gpus = gpu_series(run)
    many = gpus.assign(gpu=np.arange(len(gpus)) % (LINES_MAX + 4))  # 2 hosts x 20 GPUs
    fig = miles_series_figure(many, None, START)
    names = [t.name for t in fig.data if t.yaxis == "y"]
    assert "median of 40" in names and "min-max of 40" in names and len(names) == 3


def test_an_empty_view_says_why(dump, tmp_path):
    from dashboards.panels.fleet import empty_reason
    from miles_profile.runmodel.fleet import gpu_matrix, normalize
    from miles_profile.report.fleet_figures import fleet_heatmap
    from miles_profile.runmodel.ledger import ledger
    from miles_profile.report.ledger_html import ledger_html
    from miles_profile.runmodel.phase_table import phase_table
    bare = tmp_path / "bare" / "dashboard"
    shutil.copytree(dump, bare)
    shutil.rmtree(bare / "phases")
    shutil.rmtree(bare / "engine_series")
    (bare / "topology.jsonl").unlink()
    run = load_miles_dashboard(bare)
    assert "no phase events" in empty_reason(run) and "heatmap has no columns" in empty_reason(run)
    assert "no SGLang engine series (no engine_series stream" in series_note(run)
    assert "GPU utilization and SGLang engine series" in miles_series_html(run)  # utilization still drawn
    # with phases: a heatmap in GiB where Miles recorded no totals, not a blank share of an unknown total
    full = load_miles_dashboard(dump)
    heat = fleet_heatmap(gpu_matrix(normalize(phase_table(full))))
    z = np.asarray(heat.data[0].z, float)
    assert np.isfinite(z).mean() > 0.8 and np.nanmax(z) == pytest.approx(61.523, abs=1e-3)
    assert "GiB" in heat.layout.title.text and "peak GiB" in heat.data[0].colorbar.title.text
    # the ledger has nothing to split (NVML used only): it says so instead of one grey category
    page = ledger_html(ledger(full, peaks=True), START, "")
    assert "Nothing to split here" in page and "ledger-bars" not in page


def test_our_own_logs_have_no_such_section(tmp_path):
    import miles_profile as mp
    from tests.conftest import REPO
    own = mp.load(REPO / "sample_logs" / "cpu")
    assert gpu_series(own) is None and engine_series(own) is None and miles_series_html(own) == ""


def test_the_report_draws_the_lanes(dump, tmp_path):
    from miles_profile.report.build import VisualizeOptions, visualize
    out = tmp_path / "r.html"
    assert visualize(VisualizeOptions([str(dump)], output=str(out)), echo=lambda _: None) == 0
    html = out.read_text()
    assert 'id="miles-series-1"' in html or 'id="miles-series' in html
    assert "SGLang: running requests" in html and "peak GiB" in html
