"""The ledger as a pure function of a Run: each derived category is the residual of the next larger
measure, a negative residual is kept (never clipped) and counted by add_up, old logs still work."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from miles_profile.runmodel.ledger import add_up, ledger
from miles_profile.runmodel.ledger_sampling import LEDGER_MAX_INSTANCES, sampled_iterations, sampled_text
from miles_profile.report.ledger_figures import ledger_area_figure, ledger_bar_figure, ledger_comparison_figure
from test_report_fakes import GiB, MiB, PID, make_run

T = np.round(np.arange(0.0, 4.0, 0.5), 6)
UUID = "GPU-0000aaaa-1111"


def _gpu_run(declared: list[tuple[float, str, str, int]], alloc=6 * GiB, name="gpu-run"):
    """One process on one GPU: used 10, NVML per-process 9, reserved 8, allocated `alloc` GiB; RSS
    3 GiB split 2 anon + 0.75 file + 0.25 shmem; phases generate [0.2, 1.2] and train [1.7, 3.2]."""
    n = len(T)
    run = make_run({"t": T, "rss": np.full(n, 3 * GiB), "rss_anon": np.full(n, 2 * GiB),
                    "rss_file": np.full(n, 3 * GiB // 4), "rss_shmem": np.full(n, GiB // 4),
                    "gpu0_used": np.full(n, 10 * GiB), "gpu0_proc": np.full(n, 9 * GiB),
                    "gpu0_alloc": np.full(n, alloc), "gpu0_reserved": np.full(n, 8 * GiB)},
                   [dict(name="generate", start=0.2, end=1.2, rollout_id=0),
                    dict(name="train", start=1.7, end=3.2, rollout_id=0)],
                   devices=[{"index": 0, "uuid": UUID, "name": "fake", "total": 80 * GiB}], name=name)
    rows = [{"t": t, "kind": "account", "name": category, "pid": PID, "id": None, "parent": None,
             "attrs": {"device": device, "bytes": nbytes}} for t, device, category, nbytes in declared]
    run.events = pd.concat([run.events, pd.DataFrame(rows, columns=run.events.columns)]).sort_values("t").reset_index(drop=True)
    return run


def _at(frame, phase, device, category):
    rows = frame[(frame["phase"] == phase) & (frame["device"] == device) & (frame["category"] == category)]
    return None if rows.empty else float(rows["bytes"].iloc[0])


def test_gpu_categories_are_residuals_that_add_up_to_nvml_used():
    run = _gpu_run([(0.0, "cuda:0", "weights", 2 * GiB), (1.5, "cuda:0", "kv_cache", 3 * GiB)])
    frame = ledger(run)
    assert _at(frame, "generate", UUID, "weights") == 2 * GiB
    assert _at(frame, "generate", UUID, "kv_cache") is None  # declared after generate ended
    assert _at(frame, "train", UUID, "kv_cache") == 3 * GiB
    assert _at(frame, "train", UUID, "activations") == (6 - 2 - 3) * GiB  # allocated - declared
    assert _at(frame, "train", UUID, "allocator_cache") == 2 * GiB  # reserved - allocated
    assert _at(frame, "train", UUID, "non_pytorch") == 1 * GiB  # NVML per-process - reserved
    assert _at(frame, "train", UUID, "other_processes") == 1 * GiB  # NVML used - recorded processes
    gpu = frame[(frame["device"] == UUID) & (frame["phase"] == "train")]
    assert gpu["bytes"].sum() == gpu["total"].iloc[0] == 10 * GiB
    result = add_up(frame, "gpu")
    assert result.worst_error == 0.0 and result.boundaries == 2 and result.passes()


def test_a_process_that_declares_nothing_shows_its_allocation_as_undeclared_not_activations():
    # Logs recorded before account() existed (the committed H200 logs): weights and KV cache are in there.
    frame = ledger(_gpu_run([]))
    assert _at(frame, "train", UUID, "activations") is None
    assert _at(frame, "train", UUID, "allocated_undeclared") == 6 * GiB
    assert _at(frame, "train", UUID, "allocator_cache") == 2 * GiB
    assert add_up(frame, "gpu").worst_error == 0.0
    assert "allocated (nothing declared)" in {t.name for t in ledger_bar_figure(frame).data}


def test_host_categories_split_rss_and_subtract_declared_host_memory():
    run = _gpu_run([(0.0, "host", "offloaded_state", 512 * MiB)])
    frame = ledger(run)
    assert _at(frame, "train", "host", "offloaded_state") == 512 * MiB
    assert _at(frame, "train", "host", "other_anonymous") == 2 * GiB - 512 * MiB
    assert _at(frame, "train", "host", "file_backed") == 3 * GiB // 4
    assert _at(frame, "train", "host", "shared_memory") == GiB // 4
    assert add_up(frame, "host").worst_error == 0.0


def test_declared_host_bytes_beyond_the_anonymous_pages_come_out_of_shared_memory():
    # torch_memory_saver's pinned CPU backup was RssShmem on the H200, not RssAnon
    run = _gpu_run([(0.0, "host", "pinned_buffers", 2 * GiB + 128 * MiB)])  # 2 GiB anon, 0.25 GiB shmem
    frame = ledger(run)
    assert _at(frame, "train", "host", "other_anonymous") == 0
    assert _at(frame, "train", "host", "shared_memory") == GiB // 4 - 128 * MiB
    assert add_up(frame, "host").worst_error == 0.0
    over = ledger(_gpu_run([(0.0, "host", "pinned_buffers", 3 * GiB)]))  # more than anon + shmem
    assert _at(over, "train", "host", "shared_memory") == -(3 * GiB // 4)
    assert not add_up(over, "host").passes(0.02)


def test_declaring_more_than_allocated_is_a_negative_residual_and_fails_the_add_up():
    run = _gpu_run([(0.0, "cuda:0", "weights", 7 * GiB)])  # 7 GiB declared, 6 allocated
    frame = ledger(run)
    assert _at(frame, "train", UUID, "activations") == -1 * GiB  # shown, not clipped to 0
    result = add_up(frame, "gpu")
    assert np.isclose(result.worst_error, 1 / 10) and not result.passes(0.02)
    assert result.worst["negative"] == GiB
    fig = ledger_bar_figure(frame)
    assert "activations and temporaries (negative)" in {t.name for t in fig.data}


def test_a_log_without_rss_split_or_declarations_still_has_a_ledger():
    run = make_run({"t": T, "rss": np.full(len(T), 2 * GiB)}, [dict(name="train", start=0.2, end=1.2)])
    frame = ledger(run)
    assert set(frame["category"]) == {"rss_unsplit"} and set(frame["device"]) == {"host"}
    assert add_up(frame, "gpu").worst_error is None  # no GPU: nothing to judge


def test_figures_carry_every_category():
    frame = ledger(_gpu_run([(0.0, "cuda:0", "weights", 2 * GiB), (0.0, "host", "pinned_buffers", GiB)]))
    names = {t.name for t in ledger_bar_figure(frame).data}
    assert {"weights", "activations and temporaries", "allocator cache", "non-PyTorch (context, NCCL, ...)",
            "other processes and driver", "pinned buffers", "other anonymous", "file-backed"} <= names
    area = ledger_area_figure(frame, 0.0)
    assert {t.stackgroup for t in area.data if t.stackgroup} == {"lane1", "lane2"}  # a GPU lane and a host lane
    weights = next(t for t in area.data if t.name == "weights")
    assert np.allclose(np.asarray(weights.y, float), 2.0)  # GiB at both phase ends


def test_comparison_is_one_stacked_bar_per_phase_and_configuration():
    runs = [_gpu_run([(0.0, "cuda:0", "weights", k * GiB)], name=f"config-{k}") for k in (1, 2, 3)]
    frames = [ledger(r) for r in runs]
    fig = ledger_comparison_figure(frames, [r.name for r in runs], [PID] * 3, ["generate", "train"])
    weights = [t for t in fig.data if t.name == "weights"]
    assert len(weights) == 2  # one per phase column, in the GPU row only (declared on cuda:0)
    runs = {tuple(t.y) for t in weights}  # horizontal bars since issue 18: run names read left to right
    assert runs == {("config-1", "config-2", "config-3")}
    assert sorted({tuple(np.asarray(t.x, float)) for t in weights}) == [(1.0, 2.0, 3.0)]
    assert fig.layout.barmode == "relative"


def test_paused_bytes_are_taken_out_of_the_allocator_counters_not_shown_as_memory():
    # torch_memory_saver: 5 of the 6 GiB allocated are paused (unmapped); NVML per-process sees 4 GiB
    run = _gpu_run([(0.0, "cuda:0", "paused", 5 * GiB), (0.0, "cuda:0", "weights", 0)])
    run.samples["gpu0_proc"] = 4 * GiB
    run.samples["gpu0_used"] = 5 * GiB
    frame = ledger(run)
    assert _at(frame, "train", UUID, "paused") is None
    assert _at(frame, "train", UUID, "activations") == 1 * GiB  # 6 - 5 paused
    assert _at(frame, "train", UUID, "allocator_cache") == 2 * GiB  # (8 - 5) - (6 - 5)
    assert _at(frame, "train", UUID, "non_pytorch") == 1 * GiB  # 4 - (8 - 5)
    assert add_up(frame, "gpu").worst_error == 0.0


def test_a_loop_with_a_phase_per_step_shows_some_iterations_the_peaks_among_them(tmp_path):
    # 1,000 iterations of train + generate (2,000 phase instances); iteration 613 holds the run's peak
    n = 1000
    t = np.round(np.arange(0.0, n * 0.02 + 0.02, 0.005), 6)
    rss = np.full(len(t), 2 * GiB)
    rss[(t > 613 * 0.02) & (t < 613 * 0.02 + 0.01)] = 5 * GiB
    phases = [dict(name=name, start=k * 0.02 + off, end=k * 0.02 + off + 0.009, rollout_id=k)
              for k in range(n) for name, off in (("train", 0.0), ("generate", 0.01))]
    run = make_run({"t": t, "rss": rss, "rss_peak": rss}, phases)
    chosen = sampled_iterations(run)
    assert {0, 1, 613, 998, 999} <= chosen and len(chosen) <= LEDGER_MAX_INSTANCES // 2 + 8
    frame = ledger(run, peaks=True, iterations=chosen)
    assert set(frame["iteration"]) == chosen - {-1}
    assert frame.attrs["sampled"] == (len(chosen - {-1}), n)
    assert sampled_text(frame).startswith(f"{len(chosen - {-1})} of 1,000 iterations shown")
    assert frame["bytes"].max() == 5 * GiB  # the peak's iteration is among them
    from miles_profile.report.ledger_html import ledger_html
    assert 'id="ledger-sampled">' in ledger_html(frame, 0.0, "")
    from miles_profile.report.export import write_json
    from miles_profile.report.html import build_run_report
    written = json.loads(write_json([build_run_report(run)], tmp_path / "r.json").read_text())["runs"][0]
    assert written["ledger_sampled"] == [len(chosen - {-1}), n]
    assert {r["iteration"] for r in written["ledger"]} == chosen - {-1}
    small = make_run({"t": t, "rss": rss, "rss_peak": rss}, phases[:LEDGER_MAX_INSTANCES])
    assert sampled_iterations(small) is None and sampled_text(ledger(small)) is None


def test_a_comparison_takes_each_runs_ledger_from_its_report_not_a_second_pass(tmp_path, monkeypatch, capsys):
    """`visualize` of several runs: each run's section makes its ledger with peaks, the comparison asks for
    the same without them, which is the end rows of the first (equal to a pass of its own): made once."""
    from miles_profile.logdir import find_runs
    from miles_profile.logdir.reader import load_run
    from miles_profile.runmodel import ledger as ledger_module
    from miles_profile.visualize import main
    from tests.conftest import REPO
    runs = find_runs(REPO / "sample_logs" / "h200")[:2]
    made = []
    real = ledger_module._ledger
    monkeypatch.setattr(ledger_module, "_ledger", lambda run, *a: made.append(Path(run.path).name) or real(run, *a))
    assert main([str(runs[0]), "--compare", str(runs[1]), "-o", str(tmp_path / "r.html")]) == 0, capsys.readouterr()
    assert sorted(made) == sorted(r.name for r in runs), made  # one ledger a run
    run = load_run(runs[1])
    with_peaks = ledger(run, peaks=True)
    pd.testing.assert_frame_equal(ledger(run).reset_index(drop=True), real(run, None, False, None).reset_index(drop=True))
    assert len(with_peaks) > len(ledger(run))
