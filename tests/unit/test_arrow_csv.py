"""pyarrow's CSV reader without a Python callable in its thread pool (miles_profile/logdir/arrow_csv.py): a
process that read a run then aborted at exit ("terminate called without an active exception") when a pool
thread released the malformed-row handler while the interpreter was finalizing."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import miles_profile as mp
from miles_profile.logdir.arrow_csv import read_csv
from miles_profile.logdir.layout import SAMPLES_SUFFIX, new_run_dir
from miles_profile.logdir.writer import EventWriter, SampleWriter, write_process_meta, write_run_meta

CSV = b"t,phase,rss\n1000.0,train,10\n1001.0,train,11,99\n1002.0,,12\n"  # the second row has a column too many


def test_malformed_rows_are_skipped_and_counted_and_other_damage_raises():
    skipped: list[int] = []
    clean = read_csv(pa.py_buffer(b"t,phase,rss\n1000.0,train,10\n"), skipped)
    assert clean.num_rows == 1 and skipped == []
    table = read_csv(pa.py_buffer(CSV), skipped)
    assert table.column("rss").to_pylist() == [10, 12] and len(skipped) == 1
    with pytest.raises(pa.ArrowInvalid):  # a cell that is no number: not a row the handler may skip
        read_csv(pa.py_buffer(b"t,rss\n1000.0,ten\n"), [],
                 convert_options=pacsv.ConvertOptions(column_types={"rss": pa.int64()}))


def test_loading_a_run_never_hands_pyarrows_threads_a_python_callable(tmp_path, monkeypatch):
    run = new_run_dir(tmp_path / "logs")
    write_run_meta(run, {"interval_ms": 20.0, "start_time": 1000.0})
    write_process_meta(run, "h-7", {"pid": 7, "role": "in_process", "stem": "h-7", "end_time": 1010.0})
    samples = SampleWriter(run, "h-7", ["rss", "rss_peak"])
    for k in range(10):
        samples.append(1000.0 + k, "train", [k + 10, k + 12])
    samples.close()
    events = EventWriter(run, "h-7")
    events.write("begin", "train", {"rollout_id": 0}, t=1001.0, id=1, parent=None)
    events.write("end", "train", {"status": "ok"}, t=1003.0, id=1, parent=None)
    events.close()
    with open(run / f"h-7{SAMPLES_SUFFIX}", "a") as f:
        f.write("1010.5,train,1,2,3\n1011.0,train,20,22\n")  # one malformed row, then an intact one

    reads = []
    real = pacsv.read_csv

    def recorded(source, read_options=None, parse_options=None, convert_options=None, **kw):
        threads = read_options is None or read_options.use_threads
        reads.append((threads, parse_options is not None and parse_options.invalid_row_handler is not None))
        return real(source, read_options=read_options, parse_options=parse_options, convert_options=convert_options,
                    **kw)

    monkeypatch.setattr(pacsv, "read_csv", recorded)
    loaded = mp.load(run)
    assert any("skipped 1 malformed rows" in w for w in loaded.warnings), loaded.warnings
    assert len(loaded.samples) == 11
    assert reads and not [r for r in reads if r == (True, True)], reads  # threaded and with a Python handler
