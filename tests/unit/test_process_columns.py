"""A process's view of a multi-process run holds only the columns it wrote (issue 35): the run's merged
frame carries every process's GPU columns, empty but for their owner's rows, and copying them all per
process was most of the checks' and the ledger's time at fleet scale."""
import json

import numpy as np

from miles_profile.logdir.reader import load_run
from miles_profile.runmodel.process_view import process_view
from miles_profile.runmodel.series import own_columns, pids_with, process_rows, process_samples, series_arrays


def _two_processes(root):
    """Two finished processes on one host, on GPUs 0 and 1, sampled at interleaved times."""
    run = root / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"format_version": 1, "start_time": 1000.0}))
    for pid, gpu in ((7, 0), (8, 1)):
        (run / f"h-{pid}.meta.json").write_text(json.dumps(
            {"format_version": 1, "pid": pid, "host": "h", "role": "actor", "rank": gpu, "end_time": 1010.0}))
        t = 1000.0 + np.arange(200) * 0.05 + gpu * 0.01
        lines = [f"t,phase,gpu{gpu}_proc,rss"] + [f"{x:.3f},train,{(gpu + 1) << 30},{k + pid}" for k, x in enumerate(t)]
        (run / f"h-{pid}.samples.csv").write_text("\n".join(lines) + "\n")
        events = [{"t": 1000.0, "kind": "begin", "name": "train", "pid": pid, "id": 1, "attrs": {}},
                  {"t": 1009.0, "kind": "end", "name": "train", "pid": pid, "id": 1, "attrs": {"status": "ok"}}]
        (run / f"h-{pid}.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


def test_a_process_view_holds_only_the_columns_the_process_wrote(tmp_path):
    run = load_run(_two_processes(tmp_path))
    assert {"gpu0_proc", "gpu1_proc"} <= set(run.samples.columns)  # merged: both GPUs' columns
    assert own_columns(run, 7) == ["t", "phase", "pid", "gpu0_proc", "rss"]
    assert pids_with(run, "gpu1_proc") == [8] and pids_with(run, "rss") == [7, 8]
    rows_of = {p: process_rows(run, p) for p in (7, 8)}
    view = process_view(run, "h", 8, rows_of)
    assert list(view.samples.columns) == ["t", "phase", "pid", "rss", "gpu1_proc"]  # the run's order
    assert (view.samples["pid"] == 8).all() and view.samples["t"].is_monotonic_increasing
    assert view.samples["rss"].tolist() == list(range(8, 208))  # its own rows, in time order, exact
    own = process_samples(run, 7)
    assert "gpu1_proc" not in own and own["gpu0_proc"].eq(1 << 30).all()
    t7, rss7 = series_arrays(run, 7, "rss")
    t7b, gpu7 = series_arrays(run, 7, "gpu0_proc")
    assert t7 is t7b and len(t7) == 200 and rss7[0] == 7  # one copy of a process's times for its columns
