"""The figures show where (issue 18): the timeline's peak marker, every phase reachable in its lane, a
palette by phase family, y axes fitted to the data, the ledger over time on the timeline's x axis,
phase bands in a fleet lane, and the comparison's peak matrix in loop order."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from miles_profile.report import figures
from miles_profile.report.compare import peak_matrix
from miles_profile.report.fleet_figures import gpu_process_stack
from miles_profile.runmodel.ledger import ledger
from miles_profile.report.ledger_figures import COMPARISON_CATEGORIES_MAX, ledger_area_figure, merge_rare_categories
from miles_profile.report.ledger_html import alignment
from miles_profile.report.phase_style import LOOP_ORDER, PHASE_FAMILIES, hls, phase_color, phase_family
from test_report_fakes import GiB, MiB, make_run, steps

T = np.round(np.arange(0.0, 20.0, 0.01), 6)
H200 = 150_754_820_096


def _loop_run(name="loop", gpu_peak=3 * GiB, total=H200):
    """Setup, then two iterations of the RL loop; the GPU peaks once, in iteration 1's train; a 2 ms
    offload_kv and a 5 ms offload_weights per iteration."""
    gpu = steps(T, [(0, GiB), (2, 2 * GiB), (4, GiB), (14.0, gpu_peak), (14.1, 2 * GiB), (15, GiB)])
    rss = steps(T, [(0, GiB // 2), (3, GiB)])
    phases = [dict(name="update_weights", start=0.2, end=0.9)]
    for it, base in ((0, 1.0), (1, 10.0)):
        phases += [dict(name="generate", start=base + 1, end=base + 3, rollout_id=it),
                   dict(name="offload_kv", start=base + 3, end=base + 3.002, rollout_id=it),
                   dict(name="offload_weights", start=base + 3.01, end=base + 3.015, rollout_id=it),
                   dict(name="train", start=base + 3.1, end=base + 5, rollout_id=it),
                   dict(name="offload_train", start=base + 5, end=base + 5.2, rollout_id=it),
                   dict(name="onload_weights", start=base + 5.3, end=base + 5.5, rollout_id=it)]
    devices = [dict(index=0, name="NVIDIA H200", uuid="GPU-0", total=total)]
    return make_run({"t": T, "rss": rss, "rss_peak": rss, "host_available": 60 * GiB - rss,
                     "gpu0_used": gpu + 500 * MiB, "gpu0_alloc": gpu, "gpu0_alloc_peak": gpu},
                    phases, devices=devices, name=name)


def test_the_peak_marker_sits_on_the_runs_highest_true_peak_and_names_its_phase_and_iteration():
    run = _loop_run()
    fig = figures.timeline_figure(run)
    markers = [t for t in fig.data if t.name == "highest peak"]
    assert len(markers) == 2  # the GPU plot and the host plot
    gpu_marker = next(m for m in markers if m.yaxis == "y")
    used = run.samples["gpu0_used"].to_numpy(float)  # the highest series drawn on the GPU plot
    t0 = figures.run_start(run)
    assert gpu_marker.y[0] * GiB == pytest.approx(used.max(), abs=1)
    assert gpu_marker.x[0] == pytest.approx(T[np.argmax(used)] - t0)
    label = next(a.text for a in fig.layout.annotations if a.text.startswith("peak "))
    assert label == f"peak {used.max() / GiB:.2f} GiB · phase train · iteration 1"


def test_every_phase_instance_has_a_bar_at_least_the_minimum_width_and_its_peak_on_hover():
    run = _loop_run()
    fig = figures.timeline_figure(run)
    lo, hi = figures.time_range(run)
    least = (hi - lo) * figures.MIN_BAR_PX / figures._LANE_WIDTH_PX
    bars = [t for t in fig.data if t.mode == "lines" and t.legendgroup == "phases"]
    widths, names = [], []
    for trace in bars:
        x = np.asarray(trace.x, dtype=float).reshape(-1, 4)  # start, middle, end, gap
        widths += list(x[:, 2] - x[:, 0])
        names += [trace.name] * len(x)
    assert sorted(names) == sorted(run.phases["name"])  # every instance, the 2 ms ones included
    assert min(widths) >= least * 0.999
    train = next(t for t in bars if t.name == "train")
    assert "iteration 1" in train.hovertext[4] and "GPU 0 allocated peak 3.000 GiB" in train.hovertext[4]
    offload_kv = next(t for t in bars if t.name == "offload_kv")  # 2 ms: no sample of 10 ms inside
    assert "iteration 1" in offload_kv.hovertext[4] and "shorter than the sampling interval" in offload_kv.hovertext[4]
    assert [t.name for t in bars] == [n for n in LOOP_ORDER if n in set(names)]  # legend in loop order


def test_phase_families_have_their_hue_and_members_told_apart_by_lightness():
    hue_ranges = {"offload": (0, 50), "onload": (95, 180), "train": (250, 290), "generate": (200, 225)}
    for family, members in PHASE_FAMILIES.items():
        for name in members:
            hue, _, saturation = hls(phase_color(name))
            if family == "neutral":
                assert saturation < 0.2, name
            else:
                lo, hi = hue_ranges[family]
                assert lo <= hue <= hi, (name, hue)
            assert phase_family(name) == family
        for a, b in itertools.combinations(members, 2):  # same family: at least 0.1 apart in lightness
            assert abs(hls(phase_color(a))[1] - hls(phase_color(b))[1]) >= 0.1, (a, b)
    assert len({phase_color(n) for n in LOOP_ORDER}) == len(LOOP_ORDER)
    assert phase_family("offload_optimizer") == "offload" and hls(phase_color("offload_optimizer"))[0] <= 50


def test_y_axes_fit_the_data_and_the_total_is_a_line_only_when_near_it():
    far = figures.timeline_figure(_loop_run(gpu_peak=3 * GiB, total=H200))
    top = far.layout.yaxis.range[1]
    assert 3 * GiB / GiB < top < 5  # about the data's 3.5 GiB, not the device's 140 GiB
    assert "device total 140.4 GiB (above the plotted range)" in far.layout.annotations[0].text
    near = figures.timeline_figure(_loop_run(gpu_peak=3 * GiB, total=5 * GiB))
    lines = [s for s in near.layout.shapes if s.type == "line" and s.yref == "y"]
    assert [s.y0 for s in lines] == [5.0] and near.layout.yaxis.range[1] == pytest.approx(5 * 1.08)


def test_host_available_has_its_own_small_plot_not_a_second_axis():
    fig = figures.timeline_figure(_loop_run())
    titles = [a.text for a in fig.layout.annotations]
    assert "Host available (GiB)" in titles
    available = next(t for t in fig.data if t.name == "host available")
    rss = next(t for t in fig.data if t.name == "RSS")
    assert available.yaxis != rss.yaxis and not any(getattr(fig.layout, k).overlaying
                                                     for k in fig.layout if k.startswith("yaxis"))


def test_the_ledger_over_time_takes_the_timelines_x_range_and_margins():
    run = _loop_run()
    timeline = figures.timeline_figure(run)
    area = ledger_area_figure(ledger(run), figures.run_start(run), **alignment(timeline))
    assert tuple(area.layout.xaxis.range) == tuple(timeline.layout.xaxis.range) == figures.time_range(run)
    assert (area.layout.margin.l, area.layout.margin.r) == (timeline.layout.margin.l, timeline.layout.margin.r)


def test_a_fleet_lane_shades_its_phases_and_fits_its_y_axis():
    t = np.arange(0.0, 10.0, 0.5)
    phases = __import__("pandas").DataFrame({"start": [1.0, 4.0], "end": [3.0, 8.0], "name": ["generate", "train"]})
    fig = gpu_process_stack({"actor": (t, np.full(len(t), 0.4 * GiB))}, device_total=25 * GiB, phases=phases)
    bands = [s for s in fig.layout.shapes if s.type == "rect" and s.layer == "below"]
    assert [(b.x0, b.x1, b.fillcolor) for b in bands] == [(1.0, 3.0, phase_color("generate")),
                                                         (4.0, 8.0, phase_color("train"))]
    assert fig.layout.yaxis.range[1] == pytest.approx(0.4 * 1.08)  # 0.4 GiB of data, not 0-25 GiB
    assert "total 25.0 GiB (above the plotted range)" in fig.layout.title.text


def test_the_peak_matrix_has_runs_as_rows_and_phases_in_loop_order():
    a, b = _loop_run("a"), _loop_run("b", gpu_peak=4 * GiB)
    matrix = peak_matrix([a, b], "device")
    assert list(matrix.index) == ["a", "b"]
    # the 2 and 5 ms offloads hold no sample: columns without a value are left out
    assert list(matrix.columns) == ["generate", "train", "offload_train", "onload_weights", "update_weights"]
    assert int(matrix.loc["b", "train"]) == 4 * GiB  # its highest iteration's true peak (allocator: no NVML per process)
    assert matrix.attrs["iteration"].loc["b", "train"] == 1


def test_rare_ledger_categories_merge_into_other():
    import pandas as pd
    frame = pd.DataFrame({"category": [f"c{k}" for k in range(15)], "bytes": [(k + 1) * GiB for k in range(15)]})
    merged = merge_rare_categories(frame)
    assert merged["category"].nunique() == COMPARISON_CATEGORIES_MAX
    assert merged.loc[merged["category"] == "other", "bytes"].sum() == sum((k + 1) * GiB for k in range(6))


def test_the_dashboards_clicked_gpu_timeline_shades_that_gpus_phases(tmp_path):
    import miles_profile as mp
    from bench.make_fleet_log import write_fleet_run
    from dashboards.panels import fleet as panel
    run = mp.load(write_fleet_run(tmp_path / "run", hosts=1, gpus=2, minutes=0.2))
    view = panel.compute(run)
    lane = view.matrix.lanes["lane"].iloc[0]
    figure = panel.gpu_figure(run, view, panel._gpu_index(run), lane, None)
    bands = [s for s in figure.layout.shapes if s.type == "rect" and s.layer == "below"]
    rows = view.table[view.table["lane"] == lane]
    # every process on the GPU: the actor's train and the engine's generate alike
    on_gpu = run.phases[(run.phases["depth"] == 0) & run.phases["pid"].isin(rows["pid"])]
    assert len(bands) == len(on_gpu) > 0
    assert {b.fillcolor for b in bands} == {phase_color(n) for n in set(on_gpu["name"])}
    assert [t.name for t in figure.data if t.mode == "markers"] == [n for n in LOOP_ORDER if n in set(on_gpu["name"])]
