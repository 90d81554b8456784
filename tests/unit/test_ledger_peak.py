"""The ledger at each phase's peak (issue 18 item 3), as a pure function of a Run: the allocator's true
peak stands for allocated at its instant, the other categories are read in the same row."""
from __future__ import annotations

import numpy as np

from miles_profile.runmodel.ledger import AT_END, AT_PEAK, add_up, ledger
from miles_profile.report.ledger_figures import ledger_area_figure, ledger_bar_figure
from test_ledger import T, UUID, _gpu_run
from test_report_fakes import GiB


def _with_peak(peak: float):
    """The fake GPU run (allocated 6, reserved 8, NVML per-process 9, used 10 GiB) with allocated's true
    peak at `peak` GiB in the sample at t=2.5 (inside train [1.7, 3.2])."""
    run = _gpu_run([(0.0, "cuda:0", "weights", 2 * GiB)])
    run.samples["gpu0_alloc_peak"] = np.where(T == 2.5, peak * GiB, 6 * GiB)
    return run


def _at(frame, at, category):
    rows = frame[(frame["phase"] == "train") & (frame["at"] == at) & (frame["device"] == UUID)
                 & (frame["category"] == category)]
    return None if rows.empty else float(rows["bytes"].iloc[0])


def test_the_true_peak_is_activations_at_the_peak_and_not_at_the_end():
    frame = ledger(_with_peak(7.5), peaks=True)
    assert _at(frame, AT_PEAK, "activations") == 5.5 * GiB and _at(frame, AT_END, "activations") == 4 * GiB
    assert _at(frame, AT_PEAK, "allocator_cache") == 0.5 * GiB  # reserved 8, read in the same row
    assert _at(frame, AT_PEAK, "weights") == 2 * GiB
    peak = frame[(frame["phase"] == "train") & (frame["at"] == AT_PEAK) & (frame["device"] == UUID)]
    assert set(peak["t"]) == {2.5} and peak["bytes"].sum() == peak["total"].iloc[0] == 10 * GiB
    assert add_up(frame, "gpu").boundaries == 2  # ends only


def test_a_peak_above_reserved_was_reserved_and_on_the_device_too():
    frame = ledger(_with_peak(9.0), peaks=True)
    assert _at(frame, AT_PEAK, "activations") == 7 * GiB
    assert _at(frame, AT_PEAK, "allocator_cache") == 0  # reserved grew to the peak
    assert _at(frame, AT_PEAK, "non_pytorch") == 1 * GiB and _at(frame, AT_PEAK, "other_processes") == 1 * GiB
    peak = frame[(frame["phase"] == "train") & (frame["at"] == AT_PEAK) & (frame["device"] == UUID)]
    assert peak["bytes"].sum() == peak["total"].iloc[0] == 11 * GiB  # adds up to the raised NVML used


def test_figures_draw_a_bar_at_each_peak_beside_its_end_and_a_step_over_time():
    frame = ledger(_with_peak(7.5), peaks=True)
    bars = {}  # hover name -> (x, GiB, pattern): the peaks are one trace, the ends another
    for t in ledger_bar_figure(frame).data:
        if t.name == "activations and temporaries":
            for x, y, name in zip(t.x, np.asarray(t.y, float), t.customdata):
                bars[name] = (x, y, t.marker.pattern.shape, t.showlegend)
    assert bars["0:train ▲ peak"][0] + 1 == bars["0:train end"][0]  # side by side, the peak first
    assert bars["0:train ▲ peak"][2] == "." and not bars["0:train end"][2]  # the peak's bar is dotted
    assert bars["0:train ▲ peak"][1] == 5.5 and bars["0:train end"][1] == 4.0
    assert bars["0:train end"][3] and not bars["0:train ▲ peak"][3]  # the legend shows the solid swatch
    area = next(t for t in ledger_area_figure(frame, 0.0).data if t.name == "activations and temporaries")
    steps = dict(zip(np.asarray(area.x, float), np.asarray(area.y, float)))
    assert steps[2.5] == 5.5 and steps[3.2] == 4.0  # up at the peak, down at the end


def test_on_the_committed_h200_log_activations_stand_at_train_peaks_and_nvml_moves_with_reserved():
    """sample_logs/h200/4-both reads NVML every few allocator samples: a peak's row carries NVML
    forward from reserved, so no category goes below zero and no finished generate stays on the GPU."""
    import miles_profile as mp
    from miles_profile.report.ledger_html import peak_rise
    from tests.conftest import REPO
    frame = ledger(mp.load(REPO / "sample_logs" / "h200" / "4-both"), peaks=True)
    gpu = frame[(frame["device"] != "host") & (frame["depth"] == 0)]
    wide = gpu.pivot_table(index=["phase", "iteration", "category"], columns="at", values="bytes", aggfunc="sum")
    train = wide.loc["train"].xs("activations", level="category")
    assert (train[AT_PEAK] > 3 * GiB).all() and (train[AT_END] < 0.1 * GiB).all()
    assert wide[AT_PEAK].min() > -0.01 * GiB
    assert wide.xs("other_processes", level="category")[AT_PEAK].max() < GiB
    rise = peak_rise(frame)
    assert (rise["phase"], rise["category"]) == ("train", "activations")


def test_an_actor_and_its_engine_server_at_their_peaks_keep_nvml_in_step_with_the_allocator():
    """sample_logs/h200/9-dist-engine-server: NVML is read at phase boundaries, the allocator at every
    sample. A peak's NVML from the boundary before it, moved by what the allocator and the other process
    on the GPU changed since: taken as read, an onload's peak showed -10.6 GiB of non-PyTorch memory, an
    offload's +14 GiB, the engine's freed KV cache 13 GiB of "other processes"."""
    import miles_profile as mp
    from tests.conftest import REPO
    frame = ledger(mp.load(REPO / "sample_logs" / "h200" / "9-dist-engine-server"), peaks=True)
    peaks = frame[(frame["device"] != "host") & (frame["at"] == AT_PEAK)]
    outside = peaks[peaks["category"].isin(["non_pytorch", "other_processes"])]["bytes"]
    assert len(outside) > 100 and outside.abs().max() < 2 * GiB  # 6.8-14 GiB before
