"""Where the peak is: the highest true peak, its device, time, phase and iteration."""
from __future__ import annotations

import numpy as np

from miles_profile.logdir.reader import load_run
from miles_profile.runmodel.peak import highest_peak, iteration_text
from test_report_fakes import GiB, make_run, steps

DEVICE = [{"index": 0, "name": "fake", "uuid": "GPU-0", "total": 80 * GiB}]


def _gpu_run(spike_at: float):
    t = np.arange(0.0, 10.0, 0.1)
    alloc = steps(t, [(0, 2 * GiB), (4, 6 * GiB), (6, 2 * GiB)])
    peak = alloc.copy()
    peak[np.searchsorted(t, spike_at)] = 9 * GiB  # a spike between two samples, kept by the true peak
    phases = [{"name": "generate", "start": 1.0, "end": 3.0, "rollout_id": 0},
              {"name": "train", "start": 3.5, "end": 7.0, "rollout_id": 0},
              {"name": "generate", "start": 7.5, "end": 9.0, "rollout_id": 1}]
    return make_run({"t": t, "gpu0_alloc": alloc, "gpu0_alloc_peak": peak}, phases, devices=DEVICE)


def test_the_highest_true_peak_is_located_in_its_phase_and_iteration():
    run = _gpu_run(spike_at=5.0)
    peak = highest_peak(run)
    assert peak.bytes == 9 * GiB and peak.where == "GPU 0"
    assert abs(peak.t - 5.0) < 1e-9
    assert (peak.phase, peak.iteration) == ("train", 0)
    assert peak.span == (3.5, 7.0)
    assert "peak 9.00 GiB of 80.0 GiB" in peak.text() and "in train of iteration 0" in peak.text()


def test_a_peak_between_phases_says_between_which():
    run = _gpu_run(spike_at=7.2)
    peak = highest_peak(run)
    assert peak.phase is None
    assert peak.outside == "between train and generate of iteration 1"


def test_host_runs_use_rss_true_peak_and_the_setup_word():
    t = np.arange(0.0, 4.0, 0.1)
    rss = steps(t, [(0, 1 * GiB), (1, 3 * GiB), (2, 1 * GiB)])
    run = make_run({"t": t, "rss": rss, "rss_peak": rss}, [{"name": "offload_train", "start": 0.5, "end": 2.5}])
    peak = highest_peak(run)
    assert peak.where == "host" and peak.bytes == 3 * GiB
    assert peak.phase == "offload_train"
    assert peak.total == 64 * GiB


def test_committed_cpu_log_peak_is_in_a_train_phase():
    peak = highest_peak(load_run("sample_logs/cpu"))
    assert peak.phase == "train" and peak.where == "host"
    assert peak.bytes > 0.5 * GiB


def test_one_word_for_iterations():
    assert iteration_text(-1) == "setup" and iteration_text(3) == "iteration 3" and iteration_text(None) == "the run"
