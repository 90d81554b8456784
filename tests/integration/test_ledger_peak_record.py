"""The ledger at a phase's peak on a real recording (issue 18 item 3): a train phase whose peak is
activations freed before it ends shows them at its peak, not at its end; in the report, --json and
the dashboard's ledger panel alike."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import miles_profile as mp
from miles_profile.runmodel.ledger import AT_END, AT_PEAK, add_up, ledger
from miles_profile.report.ledger_html import peak_rise

MiB = 1024 ** 2
ACTIVATIONS = 128 * MiB


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """One recorded process: weights declared, a train phase that allocates and frees activations,
    then an offload phase."""
    with mp.Recorder(tmp_path_factory.mktemp("ledger-peak"), interval_ms=50) as rec:
        weights = torch.ones(32 * MiB // 4)
        mp.account_tensors("weights", [weights])
        with mp.phase("train", rollout_id=0):
            activations = torch.ones(ACTIVATIONS // 4)  # touched: resident, anonymous
            time.sleep(0.3)  # several samples see it, whether or not VmHWM can be reset here
            del activations
            time.sleep(0.15)
        with mp.phase("offload_train", rollout_id=0):
            pass
        return rec.run_dir


def _host(frame, at: str, category: str) -> float:
    rows = frame[(frame["phase"] == "train") & (frame["at"] == at) & (frame["device"] == "host")
                 & (frame["category"] == category)]
    assert len(rows) == 1, rows
    return float(rows["bytes"].iloc[0])


def test_activations_freed_before_the_end_show_at_the_peak_not_at_the_end(run_dir):
    frame = ledger(mp.load(run_dir), peaks=True)
    peak, end = _host(frame, AT_PEAK, "other_anonymous"), _host(frame, AT_END, "other_anonymous")
    assert peak - end >= 0.9 * ACTIVATIONS, (peak / MiB, end / MiB)
    assert _host(frame, AT_PEAK, "weights") == _host(frame, AT_END, "weights") == 32 * MiB
    train = frame[(frame["phase"] == "train") & (frame["device"] == "host")]
    t_peak = train.loc[train["at"] == AT_PEAK, "t"].iloc[0]
    assert t_peak < train.loc[train["at"] == AT_END, "t"].iloc[0]  # an instant inside the phase
    assert ledger(mp.load(run_dir))["at"].eq(AT_END).all()  # asked for ends only, ends only
    assert add_up(frame, "host").boundaries == 2  # judged at the two phase ends, not at the peaks
    rise = peak_rise(frame)
    assert (rise["phase"], rise["category"]) == ("train", "other_anonymous")
    assert rise["category_peak"] - rise["category_end"] >= 0.9 * ACTIVATIONS


def test_report_json_and_dashboard_show_the_peak(run_dir, tmp_path):
    from miles_profile.report.build import VisualizeOptions, visualize
    out, data = tmp_path / "r.html", tmp_path / "r.json"
    assert visualize(VisualizeOptions([str(run_dir)], output=str(out), json=str(data)), echo=lambda _: None) == 0
    html = out.read_text()
    assert "0:train ▲ peak" in html or "0:train \\u25b2 peak" in html  # a bar at the peak, in the figure's JSON
    assert "Most held at a phase&#x27;s peak beyond its end: other anonymous, " in html
    rows = [r for r in json.loads(data.read_text())["runs"][0]["ledger"]
            if r["phase"] == "train" and r["category"] == "other_anonymous"]
    by = {r["at"]: r["bytes"] for r in rows}
    assert set(by) == {AT_PEAK, AT_END} and by[AT_PEAK] - by[AT_END] >= 0.9 * ACTIVATIONS
    assert all(isinstance(r["bytes"], int) for r in rows)

    from dashboards.panels.ledger import compute
    frame, bars, _area, text = compute(mp.load(run_dir))
    assert "0:train ▲ peak" in set(bars.data[0].customdata) and text[0].startswith("Most held at a phase's peak beyond its end: other anonymous")
