"""The first screen's highest peak of a run read without its processes' samples (a fleet: visualize and
the dashboard read the samples of the lanes they draw only): the GPUs' NVML used from the host samplers'
files, where the report said "no memory samples" before."""
from __future__ import annotations

import numpy as np

from bench.bench_fleet_visualize import write_run
from miles_profile.logdir.reader import load_run
from miles_profile.report.summary import summarize
from miles_profile.runmodel.peak import device_peak, highest_peak
from miles_profile.runmodel.series import GiB


def test_a_fleet_read_without_samples_has_its_gpus_highest_used_on_the_first_screen(tmp_path):
    run = load_run(write_run(tmp_path, 32, minutes=0.1), sample_pids=[])  # 2 hosts x 8 GPUs x 2 processes
    assert highest_peak(run) is None  # what the summary had before: "no memory samples"
    tops = {key: float(np.nanmax(used)) for key, (_, used) in run.gpu_used.items()}
    (host, uuid), top = max(tops.items(), key=lambda kv: kv[1])
    peak = summarize(run, [], "pass").peak
    assert peak == device_peak(run) and peak.bytes == top and peak.series == "NVML used (device)"
    gpu = next(g for h in run.hosts if h["host"] == host for g in h["gpus"] if g["uuid"] == uuid)
    assert peak.where == f"GPU {gpu['index']} of {host}" and peak.total == gpu["total"]
    assert peak.pid in {p["pid"] for p in run.processes if p["host"] == host and p["gpu_uuid"] == uuid}
    # located in time: the synthetic fleet's GPUs peak in generate (KV cache beside the weights), where its
    # outliers put it too; the host sample that reads it is the one at generate's start
    assert (peak.phase, peak.outside) == ("generate", ""), peak
    assert f"peak {top / GiB:.2f} GiB of {gpu['total'] / GiB:.1f} GiB" in peak.text() and host in peak.text()
