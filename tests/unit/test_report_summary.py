"""The first screen's facts come from the verdicts, never from a second computation (report/summary.py)."""
from __future__ import annotations

import pytest

from miles_profile.logdir.reader import load_run
from miles_profile.report.summary import summarize
from miles_profile.verdicts.engine import judge


@pytest.mark.parametrize("log", ["sample_logs/cpu", "sample_logs/h200/4-both",
                                 "sample_logs/corpus/h200/llama-grads_kept-cuda"])
def test_the_summary_restates_the_verdicts(log):
    run = load_run(log)
    verdict = judge(run)
    summary = summarize(run, verdict.checks, verdict.status)
    assert summary.status == verdict.status
    by_name = {c.name: c for c in verdict.checks}
    # headroom: the check's own closest finding, its numbers, not the peak's series
    judged = [f for f in by_name["headroom"].findings if f.status in ("pass", "fail")]
    worst = max(judged, key=lambda f: f.numbers["share"])
    assert (summary.headroom.peak, summary.headroom.total) == (worst.numbers["peak"], worst.numbers["total"])
    # offloads: every offload_drop finding counted once, under its phase's name
    findings = [f for f in by_name["offload_drop"].findings if f.phase and f.phase.startswith("offload_")]
    assert sum(k.count for k in summary.offloads) == len(findings)
    assert sum(k.failed for k in summary.offloads) == sum(f.status == "fail" for f in findings)
    # failing checks, in the engine's order, each with its first failing finding
    assert [c.name for c, _ in summary.failing] == [c.name for c in verdict.checks if c.status == "fail"]
    assert all(f is not None and f.status == "fail" for _, f in summary.failing)
    lines = summary.lines()
    assert lines[0] == f"verdict: {verdict.status.upper()}" and any(line.startswith("headroom ") for line in lines)


def test_a_shared_gpus_headroom_is_judged_on_what_the_device_holds():
    # an actor and its engine server on one H200: per process each stayed under the 22.32 GiB their sum
    # reached, and the summary's 'GiB left' disagreed with its own peak by 2.2 GiB
    run = load_run("sample_logs/h200-tms-dist/9-dist-engine-server")
    verdict = judge(run)
    summary = summarize(run, verdict.checks, verdict.status)
    assert summary.peak.where == "GPU 0" and summary.headroom.peak == summary.peak.bytes
    assert summary.headroom.peak > 22 * 1024 ** 3
