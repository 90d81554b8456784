"""The offload what-if (runmodel/whatif.py) against the committed H200 configurations: the peak an
offloading configuration says it would have had, had it kept what it offloaded, must match the measured
peak of the configuration that kept it, within 5% (issue 20 item 2)."""
from __future__ import annotations

import pytest

from miles_profile.logdir.reader import load_run
from miles_profile.runmodel.series import GiB
from miles_profile.runmodel.whatif import ALL, DOES_NOT_FIT, FITS, NO_HEADROOM, whatif
from miles_profile.verdicts.types import Thresholds
from tests.conftest import REPO

LOGS = REPO / "sample_logs"
TOLERANCE = 0.05

# (configuration that offloads, the offloads undone, the configuration that kept them): the same
# trainer, preset and rollouts (scripts/h200_configs.sh), one flag apart
PAIRS = [
    ("3-offload-rollout", ["offload_rollout"], "1-no-offload"),
    ("2-offload-train", ["offload_train"], "1-no-offload"),
    ("4-both", ["offload_rollout", "offload_train"], "1-no-offload"),
    ("4-both", ["offload_rollout"], "2-offload-train"),
    ("4-both", ["offload_train"], "3-offload-rollout"),
    ("5-both-gpu-peak", ["offload_kv", "offload_weights"], "2-offload-train"),
    ("5-both-gpu-peak", ["offload_train"], "3-offload-rollout"),
]


@pytest.fixture(scope="module")
def results() -> dict:
    found = {}
    def result(path: str):
        if path not in found:
            found[path] = whatif(load_run(LOGS / path))
        return found[path]
    return result


@pytest.mark.parametrize("logs", ["h200", "h200-tms"])
@pytest.mark.parametrize("offloading, undone, keeping", PAIRS)
def test_whatif_of_an_offload_matches_the_configuration_that_kept_it(results, logs, offloading, undone, keeping):
    offloads, kept = results(f"{logs}/{offloading}"), results(f"{logs}/{keeping}")
    assert offloads.series == kept.series == "NVML used"
    # the run's device peak
    assert abs(offloads.peak_if_kept(undone) / kept.measured_peak - 1) <= TOLERANCE
    # and the peaks of the phases the offloads are about: generate (the training state kept) and train
    # (the rollout's memory kept), which the offloading configuration measured far lower
    predicted, measured, as_run = offloads.peaks_by_phase(undone), kept.peaks_by_phase(), offloads.peaks_by_phase()
    for phase in ("generate", "train"):
        assert abs(predicted[phase] / measured[phase] - 1) <= TOLERANCE, (phase, predicted[phase] / GiB,
                                                                           measured[phase] / GiB)
    assert any(as_run[p] < measured[p] * (1 - TOLERANCE) for p in ("generate", "train"))  # it had to add something


def test_per_category_rows_add_up_to_the_offload_and_say_what_brought_them_back(results):
    table = results("h200/3-offload-rollout").table.set_index("category")
    assert set(table.index) == {"kv_cache", "weights", "cuda_graph", ALL}
    assert table.loc[ALL, "freed"] == pytest.approx(table.drop(ALL)["freed"].sum())
    assert table.loc["kv_cache", "onload"] == "onload_kv" and table.loc["weights", "onload"] == "onload_weights"
    assert abs(table.loc["kv_cache", "freed"] - 12 * GiB) < 0.01 * GiB
    assert (table["peak_phase"] == "train").all()
    # kept kv_cache: the train peak plus the 12 GiB pool
    assert table.loc["kv_cache", "whatif_peak"] == pytest.approx(table.loc["kv_cache", "measured_peak"]
                                                                 + table.loc["kv_cache", "freed"])


def test_round_trip_is_the_offload_plus_the_onload_that_brought_it_back(results):
    run = load_run(LOGS / "h200" / "5-both-gpu-peak")
    row = results("h200/5-both-gpu-peak").table.set_index(["offload", "category"]).loc[("offload_kv", "kv_cache")]
    phases = run.phases[run.phases["name"].isin(["offload_kv", "onload_kv"])]
    offload_s = phases[phases["name"] == "offload_kv"]["duration"].mean()
    onload_s = phases[phases["name"] == "onload_kv"]["duration"].mean()
    assert row["offload_s"] == pytest.approx(offload_s) and row["onload_s"] == pytest.approx(onload_s)
    assert row["round_trip_s"] == pytest.approx(offload_s + onload_s)


def test_fits_against_the_headroom_threshold_and_the_total():
    run = load_run(LOGS / "h200" / "8-critic-both")
    default = whatif(run).table.set_index(["offload", "category"])
    assert (default["fits"] == FITS).all()  # 55.7 GiB at most on a 140 GiB H200
    # the same run judged with a threshold of 30% of the device: keeping the rollout's 14 GiB no longer
    # leaves the headroom, keeping everything the critic's training state freed does not fit at all
    tight = whatif(run, thresholds=Thresholds(headroom_max_share=0.3)).table.set_index(["offload", "category"])
    assert tight.loc[("offload_rollout", ALL), "fits"] == NO_HEADROOM  # 55.7 GiB > 42 GiB, < 140 GiB
    assert tight.loc[("offload_train", "gradients"), "fits"] == FITS  # 24.4 GiB < 42 GiB
    assert DOES_NOT_FIT not in set(tight["fits"])


def test_cpu_run_is_judged_on_rss_against_the_host_total(results):
    result = results("cpu")
    assert result.series == "RSS, true peak" and result.total and result.total > 1 * GiB
    assert set(result.table["offload"]) == {"offload_kv", "offload_weights", "offload_train"}
