"""Phase summaries computed from the samples files (logdir/sample_summaries.py) for a log whose `end`
events carry none: the same numbers as the report's window statistics over the loaded samples, the
same after a cached read, and a cache that is never trusted when stale or damaged, never needed in a
read-only directory and never read as a log file."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

from miles_profile.logdir import sample_summaries as ss
from miles_profile.logdir.reader import load_run
from miles_profile.runmodel.phase_table import phase_table, window_stats

ROWS = 3000
# (id, name, begin, end or None for a phase still open): nested, one too short for any row, one open
PHASES = [(1, "train", 1000.005, 1012.005), (2, "offload_train", 1002.0005, 1003.0005),
          (3, "onload_kv", 1013.0001, 1013.0002), (4, "generate", 1014.0, 1029.99), (5, "eval", 1029.995, None)]


def _write_run(root, rows: int = ROWS, seed: int = 0):
    """One finished process: rss with its true peak, NVML used read every other row (empty between),
    allocator allocated with its true peak and an absent stretch, disk never known."""
    run = root / "run"
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"format_version": 1, "start_time": 1000.0}))
    (run / "h-7.meta.json").write_text(json.dumps({"format_version": 1, "pid": 7, "host": "h", "role": "in_process",
                                                   "end_time": 1031.0}))
    rng = np.random.default_rng(seed)
    t = 1000.0 + np.arange(rows) * 0.01
    rss = rng.integers(1 << 30, 2 << 30, rows)
    alloc = rng.integers(0, 8 << 30, rows)
    lines = ["t,phase,rss,rss_peak,gpu0_used,gpu0_alloc,gpu0_alloc_peak,disk"]
    for k in range(rows):
        used = str(alloc[k] + 5) if k % 2 else ""
        a = "" if 1000 <= k < 1100 else str(alloc[k])  # an absent stretch inside train
        lines.append(f"{t[k]:.6f},train,{rss[k]},{rss[k] + int(rng.integers(0, 1 << 20))},{used},{a},"
                     f"{alloc[k] + int(rng.integers(0, 1 << 24))},")
    (run / "h-7.samples.csv").write_text("\n".join(lines) + "\n")
    events = []
    for phase_id, name, begin, end in PHASES:
        parent = 1 if phase_id == 2 else None
        events.append({"t": begin, "kind": "begin", "name": name, "pid": 7, "id": phase_id, "parent": parent, "attrs": {}})
        if end is not None:
            events.append({"t": end, "kind": "end", "name": name, "pid": 7, "id": phase_id, "attrs": {"status": "ok"}})
    (run / "h-7.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in sorted(events, key=lambda e: e["t"])))
    return run


@pytest.fixture
def cache_on(monkeypatch):
    monkeypatch.setattr(ss, "CACHE_MIN_BYTES", 1)  # the test files are small
    monkeypatch.delenv("MILES_PROFILE_CACHE", raising=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Each finished phase's numbers from the loaded samples (the report's window_stats), {(id, series): stats}."""
    run = load_run(_write_run(tmp_path_factory.mktemp("ref")))
    samples = run.samples
    phases = run.phases[run.phases["status"] != "open"]
    out = {}
    for series in ("rss", "gpu0_used", "gpu0_alloc", "disk"):
        peak = samples[f"{series}_peak"].to_numpy(float) if f"{series}_peak" in samples else None
        y = samples[series].to_numpy(float, na_value=np.nan)
        stats = window_stats(samples["t"].to_numpy(float), y, phases["start"], phases["end"], peak)
        for k, phase_id in enumerate(phases["id"]):
            if np.isfinite(stats[0][k]):
                out[(int(phase_id), series)] = tuple(float(s[k]) for s in stats)
    return out


def _as_dict(frame: pd.DataFrame) -> dict:
    return {(int(r.id), r.series): tuple(float(getattr(r, s)) for s in ("peak", "floor", "first", "last"))
            for r in frame.itertuples()}


@pytest.mark.parametrize("chunk", [None, 1500])  # one chunk, and ~25 chunks merged in order
def test_numbers_equal_the_window_statistics_of_the_loaded_samples(tmp_path, reference, monkeypatch, chunk):
    if chunk:
        monkeypatch.setattr(ss, "CHUNK_BYTES", chunk)
    run = load_run(_write_run(tmp_path), sample_pids=set())
    found = ss.summaries_from_samples(run)
    assert _as_dict(found) == reference
    assert set(found["id"]) == {1, 2, 4}  # no row in phase 3, phase 5 still open: no summary, as recorded
    assert "disk" not in set(found["series"])  # never known: no row, as in a recorded summary
    assert list(found.columns) == ["host", "pid", "id", "name", "series", "peak", "floor", "first", "last", "rows",
                                   "t_first", "t_last"]
    row = found[(found["id"] == 2) & (found["series"] == "rss")].iloc[0]
    assert row["rows"] == 100 and row["name"] == "offload_train" and row["host"] == "h"
    assert row["t_first"] == 1002.01 and row["t_last"] == 1003.0
    # phase_table takes them for the phases without summaries, samples never loaded
    table = phase_table(run).set_index("phase_id")
    assert table.loc[2, "rss_peak"] == reference[(2, "rss")][0]
    assert table.loc[1, "alloc_last"] == reference[(1, "gpu0_alloc")][3]


def test_cached_read_equals_the_csv_read_exactly(tmp_path, cache_on):
    run_dir = _write_run(tmp_path)
    first_run = load_run(run_dir, sample_pids=set())
    first = ss.summaries_from_samples(first_run)
    cache = ss.cache_path(run_dir / "h-7.samples.csv")
    assert cache.is_file()
    cached_run = load_run(run_dir, sample_pids=set())
    os.rename(run_dir / "h-7.samples.csv", tmp_path / "moved")  # the cache alone must serve
    os.rename(tmp_path / "moved", run_dir / "h-7.samples.csv")
    cached = ss.summaries_from_samples(cached_run)
    pd.testing.assert_frame_equal(first, cached)
    pd.testing.assert_frame_equal(phase_table(first_run), phase_table(cached_run))


def test_a_cached_read_does_not_parse_the_csv(tmp_path, cache_on, monkeypatch):
    run_dir = _write_run(tmp_path)
    ss.summaries_from_samples(load_run(run_dir, sample_pids=set()))

    def parse(*_args, **_kwargs):
        raise AssertionError("parsed although the cache is valid")
    monkeypatch.setattr(ss, "_parse_chunk", parse)
    assert len(ss.summaries_from_samples(load_run(run_dir, sample_pids=set())))


def test_a_stale_cache_is_ignored(tmp_path, cache_on):
    run_dir = _write_run(tmp_path)
    ss.summaries_from_samples(load_run(run_dir, sample_pids=set()))
    with open(run_dir / "h-7.samples.csv", "a") as f:  # the CSV grew: a new peak inside phase 4
        f.write("1029.985000,train,9999999999999,9999999999999,,1,1,\n")
    found = ss.summaries_from_samples(load_run(run_dir, sample_pids=set()))
    assert found[(found["id"] == 4) & (found["series"] == "rss")]["peak"].item() == 9999999999999
    events = (run_dir / "h-7.events.jsonl").read_text().replace('"t": 1003.0005', '"t": 1002.5005')
    (run_dir / "h-7.events.jsonl").write_text(events)  # phase 2 ends earlier: other windows, same CSV
    found = ss.summaries_from_samples(load_run(run_dir, sample_pids=set()))
    assert found[(found["id"] == 2) & (found["series"] == "rss")]["rows"].item() == 50


def _valid_arrow_of_another_kind(path):
    import pyarrow as pa
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("x", pa.int64())])) as w:
        w.write_table(pa.table({"x": [1, 2]}))


def _flip_a_value(data: bytes) -> bytes:
    """One bit of a stored peak flipped: the file still opens and validates."""
    import pyarrow as pa
    peak = pa.ipc.open_file(pa.py_buffer(data)).read_all().column("peak").drop_null()[0].as_py()
    at = data.find(int(peak).to_bytes(8, "little"))
    assert at > 0
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "bit_flip", "empty", "other_schema", "fifo", "directory"])
def test_a_damaged_cache_is_never_trusted(tmp_path, cache_on, reference, damage, capfd):
    run_dir = _write_run(tmp_path)
    ss.summaries_from_samples(load_run(run_dir, sample_pids=set()))
    cache = ss.cache_path(run_dir / "h-7.samples.csv")
    data = cache.read_bytes()
    if damage in ("fifo", "directory"):
        cache.unlink()
        os.mkfifo(cache) if damage == "fifo" else cache.mkdir()
    elif damage == "other_schema":
        _valid_arrow_of_another_kind(cache)
    else:
        broken = {"truncated": data[: len(data) // 2], "garbage": os.urandom(len(data)), "empty": b"",
                  "bit_flip": _flip_a_value(data)}[damage]
        cache.write_bytes(broken)
    run = load_run(run_dir, sample_pids=set())
    assert _as_dict(ss.summaries_from_samples(run)) == reference
    assert not any("summaries" in w for w in run.warnings)
    assert "Traceback" not in capfd.readouterr().err


def test_a_read_only_directory_reads_without_a_cache_and_says_nothing(tmp_path, cache_on, reference):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a read-only bind mount needs root")
    source = _write_run(tmp_path / "src")
    view = tmp_path / "ro"
    view.mkdir()
    if subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True).returncode:
        pytest.skip("mount not permitted here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True).returncode:
            pytest.skip("read-only remount not permitted here")
        with pytest.raises(OSError):
            (view / "probe").write_text("x")  # really read-only, root or not
        run = load_run(view, sample_pids=set())
        assert _as_dict(ss.summaries_from_samples(run)) == reference
        assert not list(source.glob(".*")) and not any("cache" in w for w in run.warnings)
    finally:
        subprocess.run(["umount", str(view)], check=False)


def test_cache_files_are_never_read_as_log_files(tmp_path, cache_on):
    run_dir = _write_run(tmp_path)
    before = load_run(run_dir)
    ss.summaries_from_samples(before)
    assert ss.cache_path(run_dir / "h-7.samples.csv").is_file()
    after = load_run(run_dir)
    pd.testing.assert_frame_equal(before.samples, after.samples)
    assert after.warnings == before.warnings and [p["stem"] for p in after.processes] == ["h-7"]
    from miles_profile.logdir.tail import SamplesTail
    from dashboards.live_run import LiveRun
    assert [p.name for p in LiveRun(run_dir)._files(".samples.csv")] == ["h-7.samples.csv"]
    assert SamplesTail  # the live tail follows only the files LiveRun lists


def test_a_damaged_csv_goes_through_the_tolerant_path_with_the_same_numbers(tmp_path, reference):
    run_dir = _write_run(tmp_path)
    path = run_dir / "h-7.samples.csv"
    lines = path.read_text().splitlines()
    lines[2500] = lines[2500].replace(",train,", ",train,12x4,", 1).rsplit(",", 1)[0]  # a cell that is no number
    lines.append("1031.5,tr")  # and a truncated last line
    path.write_text("\n".join(lines))
    loaded = load_run(run_dir)
    bare = load_run(run_dir, sample_pids=set())
    found = ss.summaries_from_samples(bare)
    samples = loaded.samples
    phases = loaded.phases[loaded.phases["status"] != "open"]
    stats = window_stats(samples["t"].to_numpy(float), samples["rss"].to_numpy(float, na_value=np.nan),
                         phases["start"], phases["end"], samples["rss_peak"].to_numpy(float, na_value=np.nan))
    mine = found[found["series"] == "rss"].set_index("id")
    np.testing.assert_array_equal(mine["peak"].reindex(phases["id"]).to_numpy(float, na_value=np.nan), stats[0])
    assert [w for w in bare.warnings if "h-7.samples.csv" in w] == [w for w in loaded.warnings if "h-7.samples.csv" in w]
    assert any("truncated" in w for w in bare.warnings)


@pytest.mark.parametrize("rows", [(1200, 1202), (1290, 1350)])  # inside a phase; across chunks, outside any
def test_rows_out_of_time_order_are_sorted_as_the_reader_does(tmp_path, reference, monkeypatch, rows):
    monkeypatch.setattr(ss, "CHUNK_BYTES", 1500)  # about 20 rows a chunk
    run_dir = _write_run(tmp_path)
    path = run_dir / "h-7.samples.csv"
    lines = path.read_text().splitlines()
    lines[rows[0]:rows[1]] = lines[rows[0]:rows[1]][::-1]  # rows in reverse order (a clock step)
    path.write_text("\n".join(lines) + "\n")
    run = load_run(run_dir, sample_pids=set())
    assert _as_dict(ss.summaries_from_samples(run)) == reference
    assert any("out of time order" in w for w in run.warnings)


@pytest.mark.parametrize("damage", ["truncated", "other_schema"])
def test_a_damaged_columnar_samples_cache_is_never_trusted(tmp_path, monkeypatch, damage):
    """The reader's copy of a large file's samples (`.<name>.arrow`) is held to the same rule."""
    from miles_profile.logdir import samples_cache
    monkeypatch.setattr(samples_cache, "CACHE_MIN_BYTES", 1)
    monkeypatch.delenv("MILES_PROFILE_CACHE", raising=False)
    run_dir = _write_run(tmp_path)
    intact = load_run(run_dir).samples
    for thread in __import__("threading").enumerate():
        if thread.name == "miles_profile-cache":
            thread.join()
    cache = run_dir / ".h-7.samples.csv.arrow"
    assert cache.is_file()
    if damage == "truncated":
        cache.write_bytes(cache.read_bytes()[:-4000])
    else:  # opens, and even carries the right key, but holds other columns
        import pyarrow as pa
        key = pa.ipc.open_file(pa.memory_map(str(cache))).schema.metadata
        table = pa.table({"x": [1, 2]}).replace_schema_metadata(key)
        with pa.OSFile(str(cache), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    again = load_run(run_dir)
    pd.testing.assert_frame_equal(intact, again.samples, check_categorical=False)


def test_a_cache_left_by_reading_does_not_make_a_stopped_recording_look_live(tmp_path, cache_on):
    """A run that ended without a clean stop is cached (its files unchanged for 10 minutes); the cache
    file written by that read must not hide the 'stopped without a clean stop' warning next time."""
    run_dir = _write_run(tmp_path)
    meta = json.loads((run_dir / "h-7.meta.json").read_text())
    del meta["end_time"]
    (run_dir / "h-7.meta.json").write_text(json.dumps(meta))
    old = 1_700_000_000
    for path in run_dir.iterdir():
        os.utime(path, (old, old))
    first = load_run(run_dir, sample_pids=set())
    ss.summaries_from_samples(first)
    assert ss.cache_path(run_dir / "h-7.samples.csv").is_file()
    again = load_run(run_dir, sample_pids=set())
    assert any("without a clean stop" in w for w in first.warnings)
    assert any("without a clean stop" in w for w in again.warnings)


def test_samples_held_only_in_memory_still_fill_the_phase_table(tmp_path, reference):
    """An imported run has its samples in memory and no samples file: phase_table takes them there."""
    run_dir = _write_run(tmp_path)
    run = load_run(run_dir)
    (run_dir / "h-7.samples.csv").unlink()
    table = phase_table(run).set_index("phase_id")
    assert table.loc[2, "rss_peak"] == reference[(2, "rss")][0]
    assert table.loc[4, "alloc_floor"] == reference[(4, "gpu0_alloc")][1]
