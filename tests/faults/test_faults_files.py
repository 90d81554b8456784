"""Run files that are not what they claim: FIFOs, links to /dev/zero, endless lines, a garbage cell in a
large CSV, a sparse file. Each must cost about what an intact file costs: never a hang, never gigabytes.

Readers run in a child process where a hang is possible, so a regression fails on a timeout instead of
hanging the suite; memory is the child's peak RSS (VmHWM), time is measured inside the child."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import miles_profile as mp
from miles_profile.logdir.layout import new_run_dir
from miles_profile.logdir.tail import SamplesTail
from miles_profile.logdir.writer import EventWriter, SampleWriter, write_process_meta, write_run_meta

REPO = Path(__file__).resolve().parents[2]
MiB = 1024 ** 2
STEM = "h-7"


def make_run(base: Path, n_rows: int = 20) -> Path:
    run = new_run_dir(base)
    write_run_meta(run, {"interval_ms": 20.0, "start_time": 1000.0})
    write_process_meta(run, STEM, {"pid": 7, "role": "in_process", "stem": STEM, "end_time": 1000.0 + n_rows})
    samples = SampleWriter(run, STEM, ["rss", "rss_peak"])
    for k in range(n_rows):
        samples.append(1000.0 + k, "train" if k % 2 else "", [k + 10, k + 12])
    samples.close()
    events = EventWriter(run, STEM)
    events.write("begin", "train", {"rollout_id": 0}, t=1001.0, id=1, parent=None)
    events.write("end", "train", {"status": "ok"}, t=1003.0, id=1, parent=None)
    events.close()
    return run


def child(code: str, timeout: float = 60) -> dict:
    """Run `code` (which sets `result`, a dict) in a fresh interpreter; its result plus peak RSS bytes."""
    # Peak RSS from VmHWM, this process image's own high-water mark: ru_maxrss after exec also counts the
    # parent's RSS at the fork (seen in the full suite: every child "peaked" at pytest's 500 MB).
    script = textwrap.dedent(code) + textwrap.dedent("""
        import json
        with open("/proc/self/status") as status:
            hwm = next(line for line in status if line.startswith("VmHWM:"))
        result["maxrss"] = int(hwm.split()[1]) * 1024
        print("RESULT " + json.dumps(result))
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO), MILES_PROFILE_CACHE="0")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def visualize(run: Path, out: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(run), "-o", str(out / "r.html")],
                          env=env, capture_output=True, text=True, timeout=timeout)


# -- FIFOs and devices ---------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["samples.csv", "events.jsonl", "meta.json"])
def test_a_fifo_as_a_run_file_is_skipped_with_a_warning_not_waited_on(tmp_path, which):
    run = make_run(tmp_path / "logs")
    write_process_meta(run, "h-8", {"pid": 8, "role": "in_process"})  # a second process, intact
    other = SampleWriter(run, "h-8", ["rss", "rss_peak"])
    other.append(1000.5, "", [1, 2])
    other.close()
    path = run / f"{STEM}.{which}"
    path.unlink()
    os.mkfifo(path)  # nobody ever writes to it: a read would wait forever
    done = visualize(run, tmp_path)  # was: no answer at all (killed by the timeout)
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr
    assert f"{path.name}: a FIFO, not a regular file" in done.stdout + done.stderr


@pytest.mark.parametrize("which", ["samples.csv", "events.jsonl", "meta.json"])
def test_a_link_to_dev_zero_is_refused_in_memory_bounded(tmp_path, which):
    run = make_run(tmp_path / "logs")
    path = run / f"{STEM}.{which}"
    path.unlink()
    path.symlink_to("/dev/zero")  # endless zeros: the events reader grew to 13.9 GB in 15 s
    result = child(f"""
        import miles_profile as mp
        run = mp.load({str(run)!r})
        result = {{"warnings": run.warnings, "rows": len(run.samples), "phases": len(run.phases)}}
    """, timeout=60)
    assert any(f"{path.name}: a character device, not a regular file" in w for w in result["warnings"])
    assert result["maxrss"] < 400 * MiB


def test_a_run_meta_that_is_a_fifo_is_no_run(tmp_path):
    run = make_run(tmp_path / "logs")
    (run / "meta.json").unlink()
    os.mkfifo(run / "meta.json")
    done = visualize(run, tmp_path)
    assert done.returncode == 2 and "no miles-profile run" in done.stderr, done.stderr


def test_an_oversized_process_meta_is_skipped(tmp_path):
    run = make_run(tmp_path / "logs")
    meta = run / f"{STEM}.meta.json"
    meta.write_text(json.dumps({"format_version": 1, "pid": 7, "pad": "x" * (5 * MiB)}))
    loaded = mp.load(run)
    assert loaded.processes == [] and len(loaded.samples) == 20
    assert any("over the 4,194,304 a meta file may have" in w for w in loaded.warnings)


# -- events: a line's cost is bounded --------------------------------------------------------------
def test_an_events_line_over_one_mib_is_dropped_without_being_held(tmp_path):
    run = make_run(tmp_path / "logs")
    events = run / f"{STEM}.events.jsonl"
    good = events.read_bytes()
    with open(events, "wb") as file:  # 32 MiB without a newline between two good halves
        file.write(good.splitlines(keepends=True)[0])
        file.write(b'{"t": 1.0, "junk": "' + b"z" * (32 * MiB))
        file.write(b'"}\n' + good.splitlines(keepends=True)[1])
    tracemalloc.start()
    try:
        loaded = mp.load(run)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert loaded.phases["name"].tolist() == ["train"] and loaded.phases["status"].tolist() == ["ok"]
    assert any("1 event lines over 1,048,576 bytes" in w for w in loaded.warnings)
    assert peak < 8 * MiB  # was: the whole 32 MiB line (and its decoding) in memory


# -- samples: a damaged file costs about what an intact one does ------------------------------------
def write_samples(path: Path, rows: int) -> None:
    """A samples CSV as the writer makes it: t, phase and eight byte columns, `rows` rows."""
    rng = np.random.default_rng(0)
    columns = {f"c{k}": rng.integers(0, 1 << 40, rows) for k in range(8)}
    table = pa.table({"t": np.round(1000.0 + np.arange(rows) * 0.02, 6),
                      "phase": pa.array(np.where(np.arange(rows) % 100 < 50, "train", "generate")), **columns})
    with open(path, "wb") as file:
        file.write((",".join(table.column_names) + "\n").encode())  # the writer's header: no quotes
        pacsv.write_csv(table, file, pacsv.WriteOptions(include_header=False, quoting_style="none"))


def _damage_one_cell(path: Path, line: int, column: int, junk: bytes) -> None:
    lines = path.read_bytes().split(b"\n")
    cells = lines[line].split(b",")
    cells[column] = junk
    lines[line] = b",".join(cells)
    path.write_bytes(b"\n".join(lines))


LOAD = """
    import miles_profile as mp
    run = mp.load({path!r})
    result = {{"rows": len(run.samples), "warnings": run.warnings,
              "c3": [None if v != v else int(v) for v in run.samples["c3"].iloc[{line} - 2:{line}+ 1]]}}
"""


@pytest.mark.slow
@pytest.mark.parametrize("junk", [b"12x4", b"\xff\xfe", b"1e999"], ids=["letters", "not-utf8", "float"])
def test_one_garbage_cell_in_300k_rows_is_set_absent_said_and_costs_no_more_memory(tmp_path, junk):
    rows, line = 300_000, 150_000  # line 150,000 of the file is row 149,999 (after the header)
    intact, damaged = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    for run in (intact, damaged):
        write_samples(run / f"{STEM}.samples.csv", rows)
    _damage_one_cell(damaged / f"{STEM}.samples.csv", line, 5, junk)  # column c3
    # side by side, each in a fresh process (its own peak RSS); the intact one before and after
    first = child(LOAD.format(path=str(intact), line=line))
    bad = child(LOAD.format(path=str(damaged), line=line))
    second = child(LOAD.format(path=str(intact), line=line))
    intact_rss = max(first["maxrss"], second["maxrss"])
    assert bad["rows"] == rows and first["rows"] == rows
    assert bad["c3"][0] == first["c3"][0] and bad["c3"][1] is None and bad["c3"][2] == first["c3"][2]
    assert any("1 unreadable values set to absent" in w for w in bad["warnings"])
    # was 54.9 s and 6.1 GB for 3M rows (a line-by-line fallback); the time is a ratio printed side by side
    # by bench/read_damaged_cell.py (a 3x bound here failed CI at 6.1x on a loaded machine, 1.5-2.3x idle)
    assert bad["maxrss"] <= 1.5 * intact_rss + 64 * MiB, (bad["maxrss"], intact_rss)


def test_a_garbage_phase_name_that_is_not_utf8_is_kept_readable(tmp_path):
    run = make_run(tmp_path / "logs")
    with open(run / f"{STEM}.samples.csv", "ab") as file:
        file.write(b"1100.0,tr\xffin,5,6\n1101.0,train,7,8\n")
    loaded = mp.load(run)
    assert loaded.samples["phase"].astype(str).tolist()[-2:] == ["tr\ufffdin", "train"]
    assert loaded.samples["rss"].tolist()[-2:] == [5, 7]


# -- a sparse file: read cheaply, its hole skipped ---------------------------------------------------
@pytest.mark.parametrize("rows_after", [True, False], ids=["rows-after-the-hole", "hole-at-the-end"])
def test_a_sparse_samples_file_is_read_without_reading_its_hole(tmp_path, rows_after):
    run = make_run(tmp_path / "logs")
    path = run / f"{STEM}.samples.csv"
    load = """
        import time
        import miles_profile as mp
        started = time.perf_counter()
        run = mp.load({run!r})
        result = {{"seconds": time.perf_counter() - started, "t": run.samples["t"].tolist(),
                  "warnings": run.warnings}}
    """
    intact = child(load.format(run=str(run)), timeout=120)  # the same interpreter and load, no hole
    os.truncate(path, 8 * 1024 ** 3)  # an 8 GiB hole of zeros after the 20 rows (was: 14.8 GB for 2 GB)
    if rows_after:
        with open(path, "ab") as file:
            file.write(b"\n2000.0,train,1,2\n2001.0,train,3,4\n")
    result = child(load.format(run=str(run)), timeout=120)
    assert result["t"][:20] == [1000.0 + k for k in range(20)]
    assert result["t"][20:] == ([2000.0, 2001.0] if rows_after else [])
    text = " ".join(result["warnings"])
    assert ("dropped 1 lines over 65,536 bytes" in text) if rows_after else ("truncated last line" in text)
    # beside the intact read in the same conditions (a loaded machine's interpreters vary by 100s of MiB)
    assert result["maxrss"] < intact["maxrss"] + 256 * MiB and result["seconds"] < 10, (result, intact["maxrss"])


# -- the dashboard: a FIFO run never holds a request thread ------------------------------------------
def _callback(url: str, output_prefix: str, values: dict, timeout: float) -> tuple[int, str]:
    """POST the Dash callback whose output starts with `output_prefix`, as the page does."""
    import urllib.error
    import urllib.request
    with urllib.request.urlopen(url + "_dash-dependencies", timeout=timeout) as response:
        callback = next(c for c in json.load(response) if c["output"].lstrip(".").startswith(output_prefix))

    def arg(spec):
        return [] if isinstance(spec["id"], dict) else {**spec, "value": values.get(f"{spec['id']}.{spec['property']}")}

    outputs = [dict(zip(("id", "property"), o.rsplit(".", 1))) for o in callback["output"].strip(".").split("...")]
    body = {"output": callback["output"], "outputs": outputs if len(outputs) > 1 else outputs[0],
            "inputs": [arg(s) for s in callback["inputs"]], "state": [arg(s) for s in callback["state"]],
            "changedPropIds": [f"{callback['inputs'][0]['id']}.{callback['inputs'][0]['property']}"]}
    request = urllib.request.Request(url + "_dash-update-component", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.slow
def test_dashboard_requests_for_fifo_runs_answer_and_leave_no_thread_behind(tmp_path):
    import psutil

    from dashboards.serve import dashboard_process
    logs = tmp_path / "logs"
    runs = {}
    for which in ("samples.csv", "events.jsonl", "meta.json"):
        run = make_run(logs)
        (run / f"{STEM}.{which}").unlink()
        os.mkfifo(run / f"{STEM}.{which}")
        runs[which] = run.name
    requests = [("runs-list.children", {"page-poll.n_intervals": 1})]
    for run_id in runs.values():
        requests += [("timeline-graph.figure", {"runs-selected.data": run_id}),
                     ("checks-list.children", {"runs-selected.data": run_id})]
    with dashboard_process(logs) as url:
        server = next(p for p in psutil.Process().children(recursive=True) if "dashboards" in _cmdline(p))
        _callback(url, "runs-list.children", {"page-poll.n_intervals": 0}, timeout=30)  # warm
        threads_before = server.num_threads()
        started = time.monotonic()
        answers = [_callback(url, output, values, timeout=30) for output, values in (requests * 3)[:20]]
        elapsed = time.monotonic() - started
        time.sleep(1.0)  # request threads that finished have exited
        threads_after = server.num_threads()
    assert all(status in (200, 204) for status, _ in answers), answers
    assert "Traceback" not in "".join(text for _, text in answers)
    assert threads_after <= threads_before + 2, (threads_before, threads_after)  # was 4 -> 29 after 20 requests
    assert elapsed < 120, elapsed
    listed = answers[0][1]
    assert all(run_id in listed for run_id in runs.values())  # each run listed, none waited on


def _cmdline(process) -> str:
    """A child's command line; "" for one that has exited (a zombie left by another test on this worker)."""
    import psutil
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def test_live_tails_read_nothing_from_a_fifo_and_drop_overlong_event_lines(tmp_path):
    from miles_profile.logdir.tail import EventsTail
    fifo = tmp_path / "h-9.samples.csv"
    os.mkfifo(fifo)
    assert SamplesTail(fifo).read() is None and EventsTail(fifo, 9).read() is None  # at once, no wait
    events = tmp_path / "h-9.events.jsonl"
    events.write_bytes(b'{"t": 1.0, "junk": "' + b"z" * (2 * MiB) + b'"}\n'
                       b'{"t": 2.0, "kind": "mark", "name": "ok", "attrs": {}}\n')
    tail = EventsTail(events, 9)
    assert tail.read()["name"].tolist() == ["ok"] and tail.skipped_lines == 1


def test_a_live_samples_tail_reads_a_garbage_cell_as_absent(tmp_path):
    path = tmp_path / "h-9.samples.csv"
    path.write_bytes(b"t,phase,rss\n1.0,train,10\n2.0,tr\xffin,1x1\n3.0,train,30\n")
    tail = SamplesTail(path)
    frame = tail.read()
    assert frame["t"].tolist() == [1.0, 2.0, 3.0] and frame["rss"].tolist()[::2] == [10, 30]
    assert np.isnan(frame["rss"][1]) and frame["phase"].tolist()[1] == "tr\ufffdin"


_PIECES = [b"\x00", b"\n", b",", b'"', b"\xff", b"x", b"1", b".", b"-", b"e", b"\r", b" ", b"z" * 70_000]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 3), st.lists(st.sampled_from(_PIECES), max_size=4)),
                      min_size=1, max_size=6))
def test_any_byte_damage_to_a_samples_file_is_read_without_an_error(tmp_path_factory, edits):
    # Found by this test: a header or malformed row that is not UTF-8 made pyarrow fail inside its own
    # invalid-row handler; a header naming a column twice; a header without phase (live tail).
    run = make_run(tmp_path_factory.mktemp("fuzz"))
    path = run / f"{STEM}.samples.csv"
    data = bytearray(path.read_bytes())
    for where, cut, pieces in edits:
        at = int(where * len(data))
        data[at:at + cut] = b"".join(pieces)
    path.write_bytes(bytes(data))
    loaded = mp.load(run)  # never raises: damage is dropped and named in warnings
    assert loaded.samples["t"].is_monotonic_increasing
    SamplesTail(path).read()
