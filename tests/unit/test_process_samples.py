"""A run read from its files keeps its samples per process (logdir.samples_reader.ProcessSamples), and
`visualize` of a multi-process run without summaries never builds the merged frame (issue 35, the rows
case: that frame was most of the report's memory). Each process's frame holds what its rows of the merged
frame hold, so every view reads the same numbers either way."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from bench.bench_fleet_visualize import write_run
from miles_profile import visualize
from miles_profile.logdir import samples_reader
from miles_profile.logdir.reader import load_run
from miles_profile.runmodel import series


@pytest.fixture(scope="module")
def rows_run(tmp_path_factory):
    """16 processes on 8 GPUs of one host, 1 minute at 50 ms, no phase summaries (the rows case, small)."""
    return write_run(tmp_path_factory.mktemp("rows"), 16, minutes=1.0, summaries=False)


def test_each_process_frame_is_its_rows_of_the_merged_frame(rows_run):
    stored = load_run(rows_run)
    merged = load_run(rows_run)
    merged.samples = merged.samples  # the merged frame as the source: series takes each process's rows from it
    assert stored.process_samples is not None and merged.process_samples is None
    before = samples_reader.merges_built
    assert series.pids(stored) == series.pids(merged) and len(series.pids(stored)) == 16
    assert series.sample_columns(stored) == list(merged.samples.columns)
    assert series.sample_count(stored) == len(merged.samples)
    assert series.first_and_last_t(stored) == series.first_and_last_t(merged)
    for pid in series.pids(stored):
        assert series.own_columns(stored, pid) == series.own_columns(merged, pid)
        pd.testing.assert_frame_equal(series.process_samples(stored, pid), series.process_samples(merged, pid))
        for column in ("rss", "gpu0_proc", "gpu3_proc"):
            for a, b in zip(series.series_arrays(stored, pid, column), series.series_arrays(merged, pid, column)):
                assert a.tobytes() == b.tobytes()
    assert samples_reader.merges_built == before  # none of the above merged
    # the merged frame, built on first use, is the one the reader gave before the store
    pd.testing.assert_frame_equal(stored.samples, merged.samples)
    assert samples_reader.merges_built == before + 1


@pytest.mark.slow  # a whole visualize of 16 processes: about 5 CPU s
def test_visualize_never_merges_the_samples(rows_run, tmp_path, capsys):
    before = samples_reader.merges_built
    code = visualize.main([str(rows_run), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json")])
    assert code in (0, 1), capsys.readouterr()
    assert samples_reader.merges_built == before, "a view read run.samples: convert it to runmodel/series"
    checks = {c["name"]: c for c in json.loads((tmp_path / "r.json").read_text())["runs"][0]["checks"]}
    assert checks["leak"]["status"] == "fail"  # the bench run's creeping rank is still found
