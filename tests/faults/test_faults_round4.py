"""Issue 33 (reliability round 4): the recorder never harms the job, a report never lies about broken
data. Each test builds the damaged input for real (files, links, FIFOs, a real HTTP server, real
processes) and failed before its fix."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.test_faults_files import make_run

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# -- item 3: a report.html link in a log dir someone sent you ----------------------------------------
@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_visualize_never_writes_through_a_link_or_into_a_fifo(tmp_path, kind):
    run = make_run(tmp_path / "logs")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    if kind == "link":
        (run / "report.html").symlink_to(victim)
    else:
        os.mkfifo(run / "report.html")
    done = cli("-m", "miles_profile.visualize", str(run), timeout=60)  # a FIFO hung here before
    line = one_line_error(done)
    assert "refusing to write" in line and str(run / "report.html") in line, line  # one line, naming the file
    assert victim.read_text() == "precious"
    if kind == "fifo":
        return
    # an explicit --json link is refused too, and the report itself is still written
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "v.json").symlink_to(victim)
    done = cli("-m", "miles_profile.visualize", str(run), "-o", str(tmp_path / "out" / "r.html"),
               "--json", str(tmp_path / "out" / "v.json"))
    assert done.returncode == 2 and "refusing to write" in done.stderr and "Traceback" not in done.stderr
    assert victim.read_text() == "precious" and (tmp_path / "out" / "r.html").stat().st_size > 0


# -- a real recorded run, copied per test -------------------------------------------------------------
@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """The integrated trainer (tiny preset, every offload) recorded by `record`: about 4 s, once."""
    logs = tmp_path_factory.mktemp("recorded")
    done = cli("-m", "miles_profile.record", "--log-dir", str(logs), "--", "--preset", "tiny", "--num-rollout", "3",
               "--offload-train", "--offload-rollout", timeout=120)
    assert done.returncode == 0, done.stderr
    (run,) = logs.glob("run-*")
    return run


@pytest.fixture(scope="module")
def intact_checks(recorded, tmp_path_factory) -> list[tuple[str, str]]:
    """The checks of the intact recorded run, as --json gives them (what a damaged copy is held to)."""
    base = tmp_path_factory.mktemp("intact")
    done = report(copy_of(recorded, base), base / "out")
    assert done.returncode in (0, 1), done.stderr
    return checks_of(base / "out")


def checks_of(out: Path) -> list[tuple[str, str]]:
    return [(c["name"], c["status"]) for c in json.loads((out / "v.json").read_text())["runs"][0]["checks"]]


def copy_of(run: Path, base: Path) -> Path:
    import shutil
    return Path(shutil.copytree(run, base / run.name, ignore=shutil.ignore_patterns("*.arrow", "*.lock")))


def stem_of(run: Path) -> str:
    (meta,) = [p for p in run.glob("*.meta.json") if p.name != "meta.json"]
    return meta.name[: -len(".meta.json")]


def report(run: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    out.mkdir(exist_ok=True)
    return cli("-m", "miles_profile.visualize", str(run), "-o", str(out / "r.html"), "--json", str(out / "v.json"),
               *extra, timeout=120)


# -- item 5: duplicated event lines -------------------------------------------------------------------
@pytest.mark.slow
def test_duplicated_event_lines_are_dropped_with_a_warning(recorded, intact_checks, tmp_path):
    run = copy_of(recorded, tmp_path)
    events = run / f"{stem_of(run)}.events.jsonl"
    lines = events.read_bytes()
    events.write_bytes(lines + lines)  # cat E E > E
    done = report(run, tmp_path / "out")
    assert done.returncode in (0, 1), done.stderr  # before: "could not report this log (InvalidIndexError)", 2
    n = lines.count(b"\n")
    assert f"{events.name}: dropped {n} duplicated event lines" in done.stdout, done.stdout
    assert checks_of(tmp_path / "out") == intact_checks


# -- item 1: record --calibrate trusts its cache --------------------------------------------------------
def _cache_file(cache: Path) -> Path:
    from miles_profile.identity import host_name
    cache.mkdir(exist_ok=True)
    return cache / f"calibration-{host_name()}.json"


@pytest.mark.parametrize("damage", ["null-link", "huge-link", "list", "fifo", "dev-zero"])
def test_a_damaged_calibration_cache_is_said_and_measured_again(tmp_path, damage):
    from miles_profile import calibrate
    from miles_profile.identity import host_name
    from tests.faults.test_faults_files import child
    cache = _cache_file(tmp_path / "cache")
    good = {"version": calibrate.VERSION, "host": host_name(), "disk_dir": str(tmp_path.resolve()),
            "links": {"host_copy": 1e10}}
    if damage == "fifo":
        os.mkfifo(cache)
    elif damage == "dev-zero":
        cache.symlink_to("/dev/zero")
    else:
        links = {"null-link": {"host_copy": None}, "huge-link": {"host_copy": 1e300}}.get(damage)
        cache.write_text(json.dumps({**good, "links": links} if links else [good]))
    result = child(f"""
        from miles_profile import calibrate
        lines = []
        found = calibrate.for_this_host({str(tmp_path)!r}, cache_dir={str(cache.parent)!r}, nbytes=1024 ** 2,
                                        warn=lines.append)
        result = {{"cached": found["cached"], "links": found["links"], "lines": lines}}
    """, timeout=60)  # a FIFO hung here before; /dev/zero was a MemoryError, a null link a TypeError in record
    assert result["cached"] is False and result["links"]["host_copy"] > 0
    assert len(result["lines"]) == 1 and f"ignoring the calibration cache {cache}" in result["lines"][0], result
    assert json.loads(cache.read_text())["links"] == result["links"]  # replaced by the new measurement


@pytest.mark.slow  # two real calibrations of 256 MiB: their disk link measured on tmpfs (ram_dir), not ext4
def test_record_with_a_null_link_in_its_cache_runs_the_job_and_recalibrate_measures_again(tmp_path, ram_dir):
    from miles_profile import calibrate
    from miles_profile.identity import host_name
    logs = ram_dir / "logs"
    logs.mkdir()
    cache = _cache_file(tmp_path / "cache")
    cache.write_text(json.dumps({"version": calibrate.VERSION, "host": host_name(), "disk_dir": str(logs.resolve()),
                                 "links": {"host_copy": None}}))
    env = {calibrate.CACHE_ENV: str(cache.parent)}
    job = [sys.executable, "-c", "print('job ran')"]
    done = cli("-m", "miles_profile.record", "--calibrate", "--log-dir", str(logs), "--exec", "--", *job,
               env=env, timeout=120)
    assert done.returncode == 0 and "job ran" in done.stdout, done.stderr  # before: TypeError, rc 1, no job
    assert "Traceback" not in done.stderr and "ignoring the calibration cache" in done.stderr, done.stderr
    assert "link ceilings: host_copy" in done.stderr, done.stderr
    again = cli("-m", "miles_profile.record", "--calibrate", "--log-dir", str(logs), "--exec", "--", *job, env=env)
    assert "link ceilings (cached)" in again.stderr, again.stderr
    measured_at = json.loads(cache.read_text())["measured_at"]
    fresh = cli("-m", "miles_profile.record", "--recalibrate", "--log-dir", str(logs), "--exec", "--", *job,
                env=env, timeout=120)
    assert fresh.returncode == 0 and "link ceilings: host_copy" in fresh.stderr, fresh.stderr
    assert json.loads(cache.read_text())["measured_at"] > measured_at


# -- item 6: stacks snapshots of the wrong shape, or longer than the recorder keeps -------------------
@pytest.mark.parametrize("shape", ["segments-as-ints", "trace-a-number", "blocks-a-string", "fifo"])
def test_a_snapshot_of_the_wrong_shape_is_unreadable_not_an_error(recorded, tmp_path, shape):
    import pickle

    from miles_profile.logdir.reader import load_run
    from miles_profile.runmodel.stacks import stacks_of
    from tests.faults.sweep import _add_calibration_and_stacks, snapshot
    run = copy_of(recorded, tmp_path)
    _add_calibration_and_stacks(run)
    (path,) = run.glob("*.stacks.pickle")
    snap = snapshot()
    if shape == "segments-as-ints":
        snap["segments"] = [1, 2]
    elif shape == "trace-a-number":
        snap["device_traces"] = [7.5]
    elif shape == "blocks-a-string":
        snap["segments"][0]["blocks"] = "abc"
    if shape == "fifo":
        path.unlink()
        os.mkfifo(path)  # before: said "missing", as if never copied
    else:
        path.write_bytes(pickle.dumps(snap))
    (found,) = stacks_of(load_run(run))  # before: AttributeError, TypeError
    assert found.status == "unreadable" and path.name in found.reason, found


def test_a_snapshot_of_the_wrong_shape_loses_its_section_only(recorded, tmp_path):
    import pickle
    from tests.faults.sweep import _add_calibration_and_stacks, snapshot
    run = copy_of(recorded, tmp_path)
    _add_calibration_and_stacks(run)
    (path,) = run.glob("*.stacks.pickle")
    path.write_bytes(pickle.dumps({**snapshot(), "segments": [1, 2]}))
    done = report(run, tmp_path / "out")  # before: exit 2 "could not report this log (AttributeError ...)"
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stdout + done.stderr
    (found,) = json.loads((tmp_path / "out" / "v.json").read_text())["runs"][0]["stacks"]
    assert found["status"] == "unreadable" and path.name in found["reason"], found


def test_a_snapshot_longer_than_its_history_bound_replays_only_the_entries_kept(tmp_path):
    from miles_profile.runmodel.stacks import peak_sites
    from tests.faults.sweep import snapshot
    snap = snapshot(200_000)
    (peak,) = peak_sites(snap, max_entries=1000)
    assert peak.entries == 1000  # before: all 200,000 replayed (2M entries: 214 s and 2 GB)


# -- item 7: numbers out of range ---------------------------------------------------------------------
def _set_cell(csv: Path, line: int, column: str, value: str) -> None:
    rows = csv.read_text().split("\n")
    header = rows[0].split(",")
    cells = rows[line - 1].split(",")
    cells[header.index(column)] = value
    rows[line - 1] = ",".join(cells)
    csv.write_text("\n".join(rows))


@pytest.mark.parametrize("value", ["-999624704000", str(2 ** 60)])
def test_an_impossible_byte_cell_is_dropped_with_a_warning_naming_file_and_line(recorded, intact_checks, tmp_path,
                                                                                value):
    run = copy_of(recorded, tmp_path)
    samples = run / f"{stem_of(run)}.samples.csv"
    _set_cell(samples, 12, "rss", value)
    done = report(run, tmp_path / "out")
    assert done.returncode in (0, 1), done.stderr
    assert f"{samples.name}: dropped 1 byte value out of range" in done.stdout and "line 12, rss" in done.stdout
    assert checks_of(tmp_path / "out") == intact_checks


def test_a_calibration_link_of_10_to_the_30_is_dropped_with_a_warning(recorded, tmp_path):
    run = copy_of(recorded, tmp_path)
    meta = json.loads((run / "meta.json").read_text())
    meta["calibration"] = {"version": 1, "host": "h", "disk_dir": "/tmp", "links": {"host_copy": 10 ** 30,
                                                                                     "disk_write": 1e9}}
    (run / "meta.json").write_text(json.dumps(meta))
    done = report(run, tmp_path / "out")
    assert done.returncode in (0, 1), done.stderr  # before: exit 2, "could not report this log (TypeError ...)"
    assert "meta.json: dropped 1 calibration link" in done.stdout and "host_copy" in done.stdout, done.stdout


def test_a_negative_phase_summary_is_set_absent_with_a_warning(recorded, tmp_path):
    import re
    run = copy_of(recorded, tmp_path)
    events = run / f"{stem_of(run)}.events.jsonl"
    events.write_text(re.sub(r'"peak":(\d+)', r'"peak":-\1', events.read_text(), count=1))
    done = report(run, tmp_path / "out")
    assert done.returncode in (0, 1), done.stderr
    assert "summary.rss.peak=-" in done.stdout, done.stdout


# -- item 4: --rollout-engine-url answers that are no answer ------------------------------------------
class _BadServer:
    """A real HTTP server on a free port whose every answer is `answer(handler)`."""

    def __init__(self, answer):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                answer(self)

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _send(handler, status: int, body: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _trickle(handler) -> None:
    import time
    handler.send_response(200)
    handler.send_header("Content-Length", "1000000")
    handler.end_headers()
    try:
        for _ in range(100):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.2)
    except OSError:
        pass


ANSWERS = {
    "garbage-bytes": (lambda h: _send(h, 200, b"\xff\xfe\x00garbage"), "that are no JSON"),
    "bad-json": (lambda h: _send(h, 200, b'{"pid": 1,'), "that are no JSON"),
    "a-list": (lambda h: _send(h, 200, b"[1, 2]"), "answered no JSON object"),
    "empty-500": (lambda h: _send(h, 500, b""), "answered HTTP 500"),
    "slow": (_trickle, "no complete answer within 1 s"),
}


@pytest.mark.parametrize("answer", sorted(ANSWERS))
def test_an_engine_url_answering_garbage_slowly_or_nothing_is_one_error_naming_the_url(answer, monkeypatch):
    import time

    import torch

    from trainer import engine_client, engine_http
    from trainer.errors import EngineError
    monkeypatch.setitem(engine_client.ANSWER_TIMEOUT_S, engine_http.SERVER_INFO, 1.0)
    respond, says = ANSWERS[answer]
    server = _BadServer(respond)
    try:
        start = time.monotonic()
        with pytest.raises(EngineError) as info:  # before: UnicodeDecodeError, ValueError, AttributeError, 600 s
            engine_client.RemoteEngine.connect(server.url, torch.device("cpu"))
        assert time.monotonic() - start < 10
    finally:
        server.close()
    message = str(info.value)
    assert server.url in message and says in message, message


@pytest.mark.parametrize("url", ["http://[::1", "http://h:port/"])
def test_an_engine_url_that_is_no_url_is_one_line_and_exit_2(url, capsys):
    from trainer.args import parse_args
    with pytest.raises(SystemExit) as exc:  # before: ValueError traceback
        parse_args(["--preset", "tiny", "--rollout-engine-url", url], cuda_available=False)
    assert exc.value.code == 2 and "is not a valid URL" in capsys.readouterr().err


# -- found by the sweep: destroyed host and events files were silent ---------------------------------
@pytest.mark.parametrize("damage", ["host.csv-missing", "host.csv-empty", "host.json-missing", "events-emptied"])
def test_a_destroyed_host_or_events_file_is_said(recorded, tmp_path, damage):
    from miles_profile.logdir.reader import load_run
    run = copy_of(recorded, tmp_path)
    stem = stem_of(run)
    if damage == "host.csv-missing":
        (run / f"{stem}.host.csv").unlink()
    elif damage == "host.csv-empty":
        (run / f"{stem}.host.csv").write_bytes(b"")
    elif damage == "host.json-missing":
        (run / f"{stem}.host.json").unlink()
    else:
        (run / f"{stem}.events.jsonl").write_bytes(b"")
    loaded = load_run(run)
    loaded.host_samples  # noqa: B018 - host files are read on first use
    expected = {"host.csv-missing": f"{stem}.host.json: no {stem}.host.csv beside it",
                "host.csv-empty": f"{stem}.host.csv: empty; not read",
                "host.json-missing": f"{stem}.host.csv: no {stem}.host.json beside it",
                "events-emptied": "no events, while the samples name phases"}[damage]
    assert any(expected in w for w in loaded.warnings), loaded.warnings  # before: no warning at all


def test_a_miles_csv_cell_that_is_no_amount_of_memory_is_dropped_with_a_warning(tmp_path):
    from miles_profile.importers.miles_csv import load_miles_csv
    path = tmp_path / "cpu.csv"
    path.write_text("time_s,used_gb,available_gb,percent,marker\n0.0,10.0,50.0,20,step_0/train_start\n"
                    "0.5,1e308,50,20,\n1.0,-3,x,20,step_0/train_end\n")
    run = load_miles_csv(path)  # before: 1e308 GB overflowed silently (a RuntimeWarning on the terminal)
    assert run.samples["rss"].isna().tolist() == [False, True, True]
    assert "cpu.csv: dropped 2 used_gb values that are no amount of memory (first: line 3, '1e308')" in run.warnings


def test_a_miles_csv_cut_mid_row_drops_that_row_with_a_warning(tmp_path):
    from miles_profile.importers.miles_csv import load_miles_csv
    path = tmp_path / "cpu.csv"
    path.write_text("time_s,used_gb,available_gb,percent,marker\n0.0,10.0,50.0,20,\n0.5,12.0,48.0,20,\n1.0,1")
    run = load_miles_csv(path)  # before: the cut row read as used 1 GB, silently
    assert run.samples["t"].tolist() == [0.0, 0.5] and "cpu.csv: dropped a truncated last line (line 4)" in run.warnings


@pytest.mark.parametrize("gpus", [[""], [1.5]])
def test_a_miles_phase_whose_gpus_are_no_indices_is_placed_on_no_gpu_with_a_warning(tmp_path, gpus):
    from miles_profile.importers.miles_dashboard import load_miles_dashboard
    from tests.unit.test_miles_dashboard_import import write_miles_dashboard
    root = write_miles_dashboard(tmp_path / "dump" / "dashboard", iterations=2)
    (part,) = sorted((root / "phases").glob("*.jsonl"))[-1:]
    lines = part.read_text().splitlines()
    row = json.loads(lines[-1])
    lines[-1] = json.dumps({**row, "gpus": gpus})
    part.write_text("\n".join(lines) + "\n")
    run = load_miles_dashboard(root)  # before: ValueError: invalid literal for int() (the report exited 2)
    assert any("`gpus` that are no GPU indices" in w for w in run.warnings), run.warnings
