"""Diagnoses that match the numbers (issue 21, items 2 and 5): too small to judge below a series'
resolution, both footprints only when the excess is the other footprint's size, a rank judged against
its peers' spread, host lanes called what they are, a CPU host's headroom judged, and an open phase of a
stopped process said to be one. Each case is a synthetic run built to show the difference."""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile.verdicts.checks import (
    Thresholds, check_headroom, check_host_weight_copies, check_serialized_peaks, check_transition_spikes,
)
from miles_profile.verdicts.fleet_checks import (
    FleetThresholds, check_rank_imbalance, check_serialized_peaks_per_gpu,
)
from miles_profile.verdicts.types import CAUSES, TOO_SMALL
from test_fleet import peers, row, table
from test_report_fakes import GiB, MiB, make_run, steps

TH = Thresholds()
FTH = FleetThresholds()
T = np.round(np.arange(0.0, 20.0, 0.1), 6)
H200 = [{"index": 0, "name": "H200", "total": 140 * GiB}]


def _failing_findings_are_diagnosed(result):
    failed = [f for f in result.findings if f.status == "fail"]
    assert failed, result.summary
    for f in failed:
        assert f.cause in CAUSES and f.series and f.resolution and f.resolution > 0, f


# -- serialized_peaks --------------------------------------------------------------------------
def _tiny_cuda_run():
    """The shape of the H200 tiny preset (--offload-train --offload-rollout, colocated on the GPU): the
    CUDA context grows from 0.60 to 0.80 GiB through the first iteration (lazily loaded kernels), the
    footprints are 1.6 MiB (train) and 72 MiB (KV cache), and generate holds 156 MiB reserved."""
    phases = [dict(name="generate", start=1.0, end=2.9, rollout_id=0),
              dict(name="offload_kv", start=2.9, end=3.1, rollout_id=0, expected_bytes=72 * MiB, tags=["kv_cache"]),
              dict(name="train", start=4.0, end=5.9, rollout_id=0),
              dict(name="offload_train", start=5.9, end=6.1, rollout_id=0, expected_bytes=1.6 * MiB, target="cpu")]
    reserved = steps(T, [(0, 2 * MiB), (1.0, 156 * MiB), (3.0, 2 * MiB), (4.2, 62 * MiB), (6.0, 2 * MiB)])
    context = steps(T, [(0, 0.6 * GiB), (1.0, 0.75 * GiB), (3.0, 0.8 * GiB)])
    samples = {"t": T, "gpu0_proc": context + reserved, "gpu0_reserved": reserved, "gpu0_alloc": reserved,
               "gpu0_alloc_peak": reserved, "rss": np.full(len(T), GiB)}
    return make_run(samples, phases, devices=H200)


def test_tiny_footprints_on_cuda_are_too_small_not_both_footprints():
    # before: judged on NVML from the run's first floor, every phase failed ("0.688 GiB resident >=
    # 0.669 GiB: both footprints held at once"): context growth and activations taken for a footprint
    result = check_serialized_peaks(_tiny_cuda_run(), TH)
    assert result.status != "fail", result.summary
    by_phase = {f.phase: f for f in result.findings}
    generate = by_phase["generate"]
    assert generate.status == TOO_SMALL
    assert "too small to judge (50% of the train footprint" in generate.message
    assert "below the resolution" in generate.message and "gpu0_alloc" in generate.series  # allocated, not cached (issue 30, class 2)
    assert generate.resolution == 2 * MiB  # allocated rounds to 2 MiB blocks (reserved: 20 MiB segments)
    assert by_phase["train"].status == "pass"  # entering train, reserved held the train state only


def _colocated(train_bytes: float, rollout_bytes: float, held_in_train: float):
    """Floor 1 GiB; generate holds the rollout footprint, train holds `held_in_train` above the floor."""
    levels = [(0, GiB), (1, GiB + rollout_bytes), (3, GiB), (4, GiB + held_in_train), (6, GiB)]
    level = steps(T, levels)
    phases = [dict(name="generate", start=1, end=2.9, rollout_id=0),
              dict(name="offload_rollout", start=2.9, end=3.1, rollout_id=0, expected_bytes=rollout_bytes),
              dict(name="train", start=4, end=5.9, rollout_id=0),
              dict(name="offload_train", start=5.9, end=6.1, rollout_id=0, expected_bytes=train_bytes, target="cpu")]
    return make_run({"t": T, "gpu0_alloc": level, "gpu0_alloc_peak": level, "rss": np.full(len(T), GiB)}, phases,
                    devices=H200)


def test_an_excess_the_size_of_the_other_footprint_is_both_footprints():
    result = check_serialized_peaks(_colocated(8 * GiB, 6 * GiB, held_in_train=14 * GiB), TH)
    assert result.status == "fail"
    (train,) = [f for f in result.findings if f.phase == "train"]
    assert train.cause == "both_footprints" and "both footprints held at once" in train.message
    _failing_findings_are_diagnosed(result)


def test_an_excess_unlike_the_other_footprint_is_a_residual():
    # gradients kept referenced across offload_train: 2 GiB more than the 8 GiB training state, while
    # the rollout footprint is 1 GiB. Before: "both footprints held at once"
    result = check_serialized_peaks(_colocated(8 * GiB, 1 * GiB, held_in_train=10 * GiB), TH)
    assert result.status == "fail"
    (train,) = [f for f in result.findings if f.phase == "train"]
    assert train.cause == "residual"
    assert "2.000 GiB above one footprint" in train.message and "a residual, see offload_drop" in train.message
    assert "both footprints" not in train.message
    _failing_findings_are_diagnosed(result)


def _iterations(n: int, creep: float, both_in: int | None = None):
    """n colocated iterations of 8 s: generate holds the rollout footprint (1 GiB), train the training state
    (4 GiB); the floor creeps up by `creep` per iteration (a leak); in iteration `both_in` train holds both."""
    t = np.round(np.arange(0.0, 8.0 * n + 1, 0.05), 6)
    levels, phases = [(0, GiB)], []
    for k in range(n):
        s, base = 8.0 * k, GiB + k * creep
        held = 4 * GiB + (GiB if k == both_in else 0)
        levels += [(s + 1, base + GiB), (s + 3, base), (s + 4, base + held), (s + 6, base)]
        phases += [dict(name="generate", start=s + 1, end=s + 2.9, rollout_id=k),
                   dict(name="offload_rollout", start=s + 2.9, end=s + 3.1, rollout_id=k, expected_bytes=GiB),
                   dict(name="train", start=s + 4, end=s + 5.9, rollout_id=k),
                   dict(name="offload_train", start=s + 5.9, end=s + 6.1, rollout_id=k, expected_bytes=4 * GiB,
                        target="cpu")]
    level = steps(t, levels)
    return make_run({"t": t, "gpu0_alloc": level, "gpu0_alloc_peak": level, "rss": np.full(len(t), GiB)}, phases,
                    devices=H200)


def test_a_floor_that_creeps_up_is_the_leak_checks_not_both_footprints():
    # A leaking HF loop on the H200: once the leak reached the rollout footprint's size, its train phases
    # read "both footprints held at once" against the run's first floor
    result = check_serialized_peaks(_iterations(8, creep=0.3 * GiB), TH)
    assert result.status == "pass", result.summary
    # a footprint held through one train phase is still found, with its story
    held = check_serialized_peaks(_iterations(8, creep=0.3 * GiB, both_in=5), TH)
    (failed,) = [f for f in held.findings if f.status == "fail"]
    assert (failed.iteration, failed.cause) == (5, "both_footprints"), failed.message


# -- host_weight_copies, transition_spikes -----------------------------------------------------
def _weight_move_run(weights: float, rss_growth: float):
    rss = steps(T, [(0, GiB), (3.2, GiB + rss_growth), (3.8, GiB)])
    phases = [dict(name="offload_weights", start=1, end=2, tags=["weights"], expected_bytes=weights, target="cpu"),
              dict(name="update_weights", start=3, end=4)]
    return make_run({"t": T, "rss": rss, "rss_peak": rss, "gpu0_alloc": np.full(len(T), GiB)}, phases, devices=H200)


def test_a_few_kib_of_weights_against_rss_noise_are_too_small_to_judge():
    # before: "host RSS grew 0.016 GiB, weights 0.000 GiB" failed
    result = check_host_weight_copies(_weight_move_run(200 * 1024, 16 * MiB), TH)
    assert result.status == TOO_SMALL, result.summary
    (finding,) = result.findings
    assert "too small to judge (90% of the weights, 0.2 MiB below the resolution" in finding.message
    assert finding.series.startswith("host RSS") and finding.resolution > 180 * 1024


def test_a_whole_host_copy_of_large_weights_still_fails_with_its_cause():
    result = check_host_weight_copies(_weight_move_run(8 * GiB, 8 * GiB), TH)
    assert result.status == "fail"
    assert result.findings[0].cause == "host_weight_copy"
    _failing_findings_are_diagnosed(result)


def test_a_transition_spike_names_its_cause_series_and_resolution():
    level = steps(T, [(0, GiB), (1, 2 * GiB)])
    peak = level.copy()
    peak[np.isclose(T, 3.5)] = 6 * GiB
    phases = [dict(name="generate", start=1, end=3.0), dict(name="train", start=4.0, end=6.0)]
    result = check_transition_spikes(make_run({"t": T, "rss": level, "rss_peak": peak}, phases), TH)
    assert result.findings[0].cause == "transition_spike"
    _failing_findings_are_diagnosed(result)


# -- rank_imbalance ----------------------------------------------------------------------------
def test_a_rank_far_above_its_peers_fails_only_when_it_matters_against_the_total():
    # +300 MiB (+90 %) on an 80 GiB GPU, in every iteration: above the peers, but under 2 % of the device's
    # total: unsure (WARN), never a FAIL (issue 30: an imbalance must matter against the total)
    small = check_rank_imbalance(peers({"G0": 333 * MiB, "G1": 333 * MiB, "G2": 633 * MiB, "G3": 333 * MiB}), FTH)
    assert small.status == "warn", small.summary
    # the same rank 3 GiB above its peers in every iteration fails, named, with its cause
    result = check_rank_imbalance(peers({"G0": 3 * GiB, "G1": 3 * GiB, "G2": 6 * GiB, "G3": 3 * GiB}), FTH)
    assert result.status == "fail", result.summary
    failed = [f for f in result.findings if f.status == "fail"]
    assert {f.numbers["gpu_uuid"] for f in failed} == {"G2"}
    assert {f.cause for f in failed} == {"rank_outlier"}
    _failing_findings_are_diagnosed(result)


def _noisy_peers(hot: float) -> pd.DataFrame:
    """Eight GPUs whose peaks differ by up to 2 GiB around 10 GiB; G7 peaks at `hot`."""
    values = {f"G{i}": 10 * GiB + v * GiB for i, v in enumerate([-1.0, -0.5, 0.0, 0.5, 1.0, -1.0, 0.5])}
    values["G7"] = hot
    return peers(values)


def test_a_rank_within_its_peers_spread_passes_and_one_far_outside_it_fails():
    # +1.35 GiB over the median (13 %) is more than 10 % of it, but the peers themselves spread by +-1 GiB
    # (3.5 scaled deviations: 3.9 GiB)
    assert check_rank_imbalance(_noisy_peers(11.6 * GiB), FTH).status == "pass"
    result = check_rank_imbalance(_noisy_peers(16 * GiB), FTH)
    assert result.status == "fail" and result.worst["gpu_uuid"] == "G7"
    assert "peers' spread" in result.worst["message"] or "peers' spread" in result.findings[0].message


def test_an_outlier_below_the_series_resolution_is_too_small_to_judge():
    # 30 MiB above identical peers: an outlier by spread and share, but under twice NVML's 20 MiB
    result = check_rank_imbalance(peers({"G0": 100 * MiB, "G1": 100 * MiB, "G2": 130 * MiB, "G3": 100 * MiB}), FTH)
    assert result.status != "fail", result.summary
    small = [f for f in result.findings if f.status == TOO_SMALL]
    assert small and all("too small to judge" in f.message and f.resolution for f in small)


def _host_lanes(values: dict[int, float]) -> pd.DataFrame:
    """One actor per rank on a CPU host (no GPU: a host lane each), peaking at values[rank] RSS."""
    rows = [row("n0", "", 100 + r, r, "actor", "train", it, 10.0 * it, 10.0 * it + 5, total=64 * GiB,
                rss=(v, v / 2, v / 2, v / 2))
            for r, v in values.items() for it in range(2)]
    return table(rows)


def test_host_lanes_are_called_ranks_host_memory_not_gpus():
    # 2 GiB above its peers: more than 2 % of the 64 GiB host, in both iterations
    result = check_rank_imbalance(_host_lanes({0: 300 * MiB, 1: 300 * MiB, 2: 2348 * MiB, 3: 300 * MiB}), FTH)
    assert result.status == "fail"
    lane_findings = [f for f in result.findings if f.numbers.get("pid") is None]
    assert lane_findings and all("ranks' host memory" in f.message and "GPUs" not in f.message
                                 for f in lane_findings)
    assert "GPUs" not in result.summary


def test_serialized_peaks_per_gpu_names_the_cause():
    c = GiB
    rows = []
    for it in range(2):
        t = 100.0 * it
        rows += [row("n0", "G0", 2, 0, "engine", "generate", it, t, t + 10, proc=(c + 24 * GiB,) * 4),
                 row("n0", "G0", 2, 0, "engine", "offload_kv", it, t + 11, t + 12, expected=24 * GiB,
                     proc=(c + 24 * GiB, c + 20 * GiB, c + 24 * GiB, c + 20 * GiB)),
                 row("n0", "G0", 1, 0, "actor", "train", it, t + 20, t + 40, proc=(c + 20 * GiB, c, c, c + 12 * GiB)),
                 row("n0", "G0", 1, 0, "actor", "offload_train", it, t + 41, t + 42, expected=12 * GiB,
                     proc=(c + 12 * GiB, c, c + 12 * GiB, c))]
    result = check_serialized_peaks_per_gpu(table(rows), FTH)
    assert result.status == "fail"
    _failing_findings_are_diagnosed(result)


# -- headroom on a CPU host ---------------------------------------------------------------------
def _cpu_rank(available: float, total: float = 64 * GiB):
    """One rank of a multi-process CPU run as the per-process view sees it: its own RSS, and the host
    sampler's rows (total, available) that the host's other ranks' memory shows in."""
    run = make_run({"t": T, "rss": np.full(len(T), GiB), "rss_peak": np.full(len(T), GiB)},
                   processes=[{"pid": 100, "role": "actor", "rank": 1, "devices": [],
                               "probes": [{"name": "host", "active": True, "total": None}]}])
    host = pd.DataFrame({"t": T, "host": "n0", "host_available": np.full(len(T), available),
                         "host_total": np.full(len(T), total), "cgroup_usage": np.nan, "cgroup_limit": np.nan})
    run.__dict__["_host_data"] = (host, pd.DataFrame(), pd.DataFrame())  # what host_reader reads from host.csv
    return run


def test_headroom_of_a_cpu_rank_is_judged_on_the_hosts_used_memory():
    # before: n/a ("host total unknown"): only the host sampler's meta holds the total
    ok = check_headroom(_cpu_rank(available=40 * GiB), TH)
    assert ok.status == "pass" and "host n0: used (total − available): peak 24.000 GiB" in ok.summary
    near = check_headroom(_cpu_rank(available=1 * GiB), TH)
    assert near.status == "fail" and near.findings[0].cause == "near_total"
    _failing_findings_are_diagnosed(near)


# -- an open phase ------------------------------------------------------------------------------
def _killed_rank(died: bool):
    level = steps(T, [(0, GiB), (1, 5 * GiB)])
    phases = [dict(name="generate", start=1, end=2.9, rollout_id=0),
              dict(name="offload_rollout", start=2.9, end=3.1, rollout_id=0, expected_bytes=4 * GiB),
              dict(name="train", start=4, end=None, rollout_id=0),
              dict(name="offload_train", start=5.9, end=6.1, rollout_id=0, expected_bytes=2 * GiB, target="disk")]
    meta = {"pid": 100, "role": "actor", "rank": 0, "devices": H200, "start_time": 0.0,
            "probes": [{"name": "host", "active": True, "total": 64 * GiB}]}
    if died:
        meta["died"] = True  # what the reader marks once the run's record process ended without this one
    return make_run({"t": T, "gpu0_alloc": level, "gpu0_alloc_peak": level, "rss": np.full(len(T), GiB)}, phases,
                    processes=[meta])


def test_an_open_phase_of_a_killed_process_never_ended_and_of_a_live_one_is_still_open():
    dead = [f for f in check_serialized_peaks(_killed_rank(died=True), TH).findings if f.phase == "train"]
    assert dead[0].status == "n/a" and "never ended: its process stopped during it" in dead[0].message
    live = [f for f in check_serialized_peaks(_killed_rank(died=False), TH).findings if f.phase == "train"]
    assert live[0].status == "n/a" and "still open, judged once it ends" in live[0].message


def test_an_offload_its_killed_process_never_ended_says_so():
    from miles_profile.verdicts.checks import check_offload_drop
    run = _killed_rank(died=True)
    killed = make_run({"t": T, "gpu0_alloc": run.samples["gpu0_alloc"].to_numpy(), "rss": np.full(len(T), GiB)},
                      [dict(name="generate", start=1, end=2.9, rollout_id=0),
                       dict(name="offload_rollout", start=2.9, end=None, rollout_id=0, expected_bytes=4 * GiB)],
                      processes=run.processes)
    (finding,) = check_offload_drop(killed, TH).findings
    assert finding.status == "n/a" and "never ended: its process stopped during it" in finding.message
