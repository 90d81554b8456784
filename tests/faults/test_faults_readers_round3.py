"""Issue 19 (items 4, 5, 7-13, 15): no input hangs or crashes a reader, and nothing is lost without a
word. Each test builds a damaged run for real (files, a full tmpfs, FIFOs, sparse files) and reads it
with the real reader or CLI, in a child process with a timeout where a hang is possible."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import miles_profile as mp
from miles_profile.logdir.reader import load_run
from miles_profile.logdir.writer import EventWriter, SampleWriter, write_process_meta
from tests.faults import test_faults_recorder as recorder_faults
from tests.faults.test_faults_files import child, make_run
from tests.faults.test_faults_recorder import IN_PROCESS_JOB, run_job

small_disk = recorder_faults.small_disk  # the fixture: a real 1 MiB tmpfs (root) or RLIMIT_FSIZE

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)


# -- item 4: a full disk ----------------------------------------------------------------------------
def test_a_full_disk_run_says_the_log_is_incomplete_and_how_much_was_lost(small_disk):
    done = run_job(IN_PROCESS_JOB, str(small_disk.path), "full", disk=small_disk)
    assert done.returncode == 7, done.stderr
    run_dir = Path(done.stdout.splitlines()[0])
    run = load_run(run_dir)
    lost = [w for w in run.warnings if "the log is incomplete" in w]
    assert len(lost) == 1, run.warnings
    assert "sample rows" in lost[0] and " 0 sample rows and 0 events" not in lost[0]
    process = run.processes[0]
    assert process["end_time"] and process["dropped"]["samples"] + process["dropped"]["events"] > 0


RANK_JOB = """
from miles_profile import Recorder, phase
run_dir, ready, rank = sys.argv[1], sys.argv[2], int(os.environ["RANK"])
filler = os.path.join(os.environ.get("FILL_DIR", ""), "filler")
def wait_for(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
done = 0
with Recorder(run_dir=run_dir, interval_ms=1):
    open(os.path.join(ready, str(rank)), "w").close()  # recording (off the small disk)
    for i in range(150):
        with phase("train", rollout_id=i):
            time.sleep(0.01)
        done += 1
        if i == 0 and rank == 0:
            wait_for(os.path.join(ready, "1"))
            fill()  # another writer takes the disk: both ranks meet ENOSPC from here on
        if i == 0 and rank == 1 and os.environ.get("FILL_DIR"):
            wait_for(filler)
print("done", done, flush=True)
sys.exit(7)
"""


def test_two_ranks_on_a_full_disk_each_say_how_much_they_lost(small_disk, tmp_path):
    """Issue 19 item 4, two ranks: the report covered 56 of 150 iterations without a word."""
    from miles_profile.recorder import create_run
    from tests.faults.test_faults_recorder import PRELUDE
    run_dir = create_run(small_disk.path, ["two ranks"], 1.0, run_id="full-disk")
    ranks = []
    for rank in (0, 1):
        env = dict(os.environ, PYTHONPATH=str(REPO), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   MILES_PROFILE_ROLE="actor", **small_disk.env)
        ranks.append(subprocess.Popen([sys.executable, "-c", PRELUDE + RANK_JOB, str(run_dir), str(tmp_path)],
                                      env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      preexec_fn=small_disk.preexec))
    for job in ranks:
        out, err = job.communicate(timeout=120)
        assert job.returncode == 7 and "done 150" in out and "Traceback" not in err, err
    run = load_run(run_dir)
    assert sorted(p["rank"] for p in run.processes if p.get("role") == "actor") == [0, 1]
    (lost,) = [w for w in run.warnings if "the log is incomplete" in w]
    for p in run.processes:
        if p.get("role") == "actor":
            assert p["end_time"] and p["dropped"]["samples"] + p["dropped"]["events"] > 0, p
            assert f"actor rank {p['rank']} (pid {p['pid']}," in lost and (
                f"lost {p['dropped']['samples']:,} sample rows and {p['dropped']['events']:,} events" in lost), lost
    done = cli("-m", "miles_profile.visualize", str(run_dir), "--json", str(tmp_path / "v.json"),
               "-o", str(tmp_path / "r.html"))
    assert done.returncode in (0, 1) and lost in done.stdout + done.stderr, done.stdout + done.stderr


# -- item 11: an impossible byte count, empty process files -------------------------------------
def test_account_refuses_a_count_over_int64_and_the_run_still_reports(tmp_path):
    with mp.Recorder(tmp_path, interval_ms=50) as rec:
        mp.account("kv_cache", 10 ** 20)
        mp.account("kv_cache", 10)
        run_dir = rec.run_dir
    meta = json.loads(next(run_dir.glob("*.meta.json")).read_text())
    assert meta["dropped"]["events"] == 1 and "2**63" in meta["write_error"]
    # a log written before the refusal (or by hand) holds one: the reader skips it
    events = next(run_dir.glob("*.events.jsonl"))
    with open(events, "a") as f:
        f.write(json.dumps({"t": 1e9, "kind": "account", "name": "kv_cache", "pid": 1,
                            "attrs": {"device": "host", "bytes": 10 ** 20}}) + "\n")
    assert load_run(run_dir).accounts["bytes"].tolist() == [10]
    done = cli("-m", "miles_profile.visualize", str(run_dir), "--json", str(tmp_path / "v.json"),
               "-o", str(tmp_path / "r.html"))
    assert done.returncode in (0, 1), done.stderr


def test_empty_process_files_are_tolerated_and_summarized_in_one_line(tmp_path):
    run = make_run(tmp_path / "logs")
    for k in range(200):
        for suffix in (".meta.json", ".samples.csv", ".events.jsonl"):
            (run / f"e-{k}{suffix}").write_bytes(b"")
    loaded = load_run(run)
    assert [p["pid"] for p in loaded.processes] == [7] and len(loaded.samples) == 20
    about = [w for w in loaded.warnings if "e-" in w]
    assert len(about) == 2 and all(w.startswith("200 files: ") for w in about), loaded.warnings


# -- item 5: a rank whose files are missing -----------------------------------------------------------
def two_rank_run(base: Path) -> Path:
    run = make_run(base / "logs")  # h-7: rank 0 of 2
    for stem, pid, rank in (("h-7", 7, 0), ("h-8", 8, 1)):
        write_process_meta(run, stem, {"pid": pid, "host": "h", "role": "actor", "rank": rank, "world_size": 2,
                                       "stem": stem, "end_time": 1020.0})
    samples = SampleWriter(run, "h-8", ["rss", "rss_peak"])
    samples.append(1000.5, "", [1, 2])
    samples.close()
    EventWriter(run, "h-8").close()
    return run


@pytest.mark.parametrize("lost", ["samples.csv", "events.jsonl", "meta.json"])
def test_a_rank_missing_a_file_is_named_not_dropped_silently(tmp_path, lost):
    run = two_rank_run(tmp_path)
    assert load_run(run).warnings == []
    (run / f"h-8.{lost}").unlink()
    warnings = load_run(run).warnings
    if lost == "meta.json":
        assert any("rank 1" in w and "world_size is 2" in w for w in warnings), warnings
        assert any("h-8: no meta file" in w for w in warnings), warnings
    else:
        assert any(f"rank 1 (pid 8, h): no {lost.split('.')[0]} file" in w for w in warnings), warnings


# -- item 10: a copy of a run beside it ------------------------------------------------------------
def test_a_copied_run_directory_is_read_once_and_every_run_is_reported(tmp_path):
    run = make_run(tmp_path / "logs")
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "run_id": "job-1"}))
    shutil.copytree(run, run.with_name(run.name + ".bak"))
    other = make_run(tmp_path / "logs")  # a second, different run in the same directory
    (other / "meta.json").write_text(json.dumps({**meta, "run_id": "job-2", "start_time": 2000.0}))
    loaded = load_run(run, run.with_name(run.name + ".bak"))
    assert len(loaded.processes) == 1 and len(loaded.phases) == 1 and len(loaded.samples) == 20
    assert any("read once" in w for w in loaded.warnings), loaded.warnings
    for args in ([str(tmp_path / "logs")], [str(run), str(run.with_name(run.name + ".bak"))]):
        done = cli("-m", "miles_profile.visualize", *args, "--json", str(tmp_path / "v.json"),
                   "-o", str(tmp_path / "r.html"))
        assert done.returncode in (0, 1), done.stderr
        names = [r["name"] for r in json.loads((tmp_path / "v.json").read_text())["runs"]]
        assert len(names) == (2 if len(args) == 1 else 1), names


# -- items 7, 8: host files that are FIFOs, links, sparse, or name a path -------------------------
def test_host_files_are_opened_guarded_and_their_stem_is_no_path(tmp_path):
    run = make_run(tmp_path / "logs")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "s.host.csv").write_text("t,host_available\n1000.5,123456\n")
    (run / "h-9.host.json").write_text(json.dumps({"format_version": 1, "host": "h", "stem": "../../secret/s"}))
    (run / "h-9.host.csv").write_text("t,host_available\n1000.5,5\n")
    os.mkfifo(run / "h-10.host.json")
    (run / "h-11.host.json").write_text(json.dumps({"format_version": 99, "host": "g"}))
    (run / "h-11.host.csv").write_text("t,host_available\n1000.5,6\n")
    sparse = run / "h-12.host.csv"
    (run / "h-12.host.json").write_text(json.dumps({"format_version": 1, "host": "k"}))
    sparse.write_text("t,host_available\n1000.5,7\n")
    os.truncate(sparse, 2 * 1024 ** 3)
    with open(sparse, "a") as f:
        f.write("1001.5,8\n")
    result = child(f"""
        from miles_profile.logdir.reader import load_run
        run = load_run({str(run)!r})
        frame = run.host_samples
        result = {{"values": sorted(frame["host_available"].tolist()), "warnings": run.warnings}}
    """, timeout=60)
    assert result["values"] == [5, 7, 8]  # not the secret's 123456, not version 99's 6
    assert result["maxrss"] < 600 * 1024 ** 2  # the 2 GiB hole is never read
    warnings = " ".join(result["warnings"])
    assert "h-10.host.json: a FIFO" in warnings and "format version 99" in warnings


def test_a_sparse_run_meta_is_refused_at_once(tmp_path):
    run = make_run(tmp_path / "logs")
    with open(run / "meta.json", "r+b") as f:
        f.truncate(2 * 1024 ** 3)
    result = child(f"""
        import time
        from miles_profile.errors import MilesProfileError
        from miles_profile.logdir.reader import load_run, run_id_of
        start = time.perf_counter()
        run_id_of({str(run)!r})
        try:
            load_run({str(run)!r})
            error = ""
        except MilesProfileError as exc:
            error = str(exc)
        result = {{"error": error, "seconds": time.perf_counter() - start}}
    """, timeout=60)
    assert "over the" in result["error"] and result["seconds"] < 5 and result["maxrss"] < 600 * 1024 ** 2


# -- item 12: one pid on two merged hosts -----------------------------------------------------------
def test_one_pid_on_two_hosts_keeps_two_series_and_far_clocks_are_named(tmp_path):
    from tests.unit.test_logdir_multihost import write_host_run
    a = write_host_run(tmp_path / "a", "node-a", "job", begin=1.0)
    b = write_host_run(tmp_path / "b", "node-b", "job", begin=1.2)
    run = load_run(a, b)
    pids = {p["host"]: p["pid"] for p in run.processes}
    assert pids["node-a"] == 7 and pids["node-b"] != 7
    assert sorted(run.samples["pid"].unique().tolist()) == sorted(pids.values())
    assert {(h, p) for h, p in zip(run.phases["host"], run.phases["pid"])} == set(pids.items())
    assert not any("clocks" in w for w in run.warnings)
    c = write_host_run(tmp_path / "c", "node-c", "job", begin=1.0 + 86400)
    assert any("24.0 hours apart" in w for w in load_run(a, c).warnings)


# -- item 15: the dashboard's command line and Host check ------------------------------------------
def test_dashboard_port_0_prints_the_port_it_listens_on(tmp_path):
    import re
    import time
    import urllib.request
    run = make_run(tmp_path / "logs")
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    server = subprocess.Popen([sys.executable, "-m", "dashboards", str(run), "--port", "0"], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        url = re.search(r"http://\S+/", line)[0]
        assert not url.endswith(":0/"), line
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "_dash-layout", timeout=2) as answer:
                    assert answer.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, f"nothing answers at {url}"
                time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.parametrize("flag", [["--poll-ms", "0"], ["--poll-ms", "-5"]])
def test_dashboard_refuses_a_poll_interval_below_one_ms(tmp_path, flag):
    done = cli("-m", "dashboards", str(tmp_path), *flag, timeout=30)
    assert done.returncode == 2 and "must be at least 1" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("header", ["127.0.0.1:80@evil.com", "localhost:x", "[::1]:80@evil", "[::1"])
def test_host_header_with_junk_after_the_name_is_refused(header):
    from dashboards.hosts import HostPolicy
    assert not HostPolicy().allows(header)
    assert HostPolicy().allows("127.0.0.1:8050") and HostPolicy().allows("[::1]:8050")


# -- items 7, 13: Miles dashboard directories -----------------------------------------------------
def miles_dump(base: Path) -> Path:
    from tests.unit.test_miles_dashboard_import import write_miles_dashboard
    return write_miles_dashboard(base / "dump" / "dashboard", iterations=2)


def test_a_fifo_in_a_miles_stream_folder_is_skipped_with_a_warning(tmp_path):
    root = miles_dump(tmp_path)
    os.mkfifo(root / "gpu_util" / "20990101_00.jsonl")
    os.mkfifo(root / "phases.jsonl")
    result = child(f"""
        from miles_profile.importers.miles_dashboard import load_miles_dashboard
        run = load_miles_dashboard({str(root)!r})
        result = {{"warnings": run.warnings, "gpus": len(run.gpu_samples)}}
    """, timeout=60)
    assert result["gpus"] > 0
    assert sum("a FIFO" in w for w in result["warnings"]) == 2, result["warnings"]


def test_miles_streams_with_nested_json_or_negative_memory_are_skipped_with_a_warning(tmp_path):
    from miles_profile.importers.miles_dashboard import load_miles_dashboard
    root = miles_dump(tmp_path)
    deep = "[" * 100_000 + "]" * 100_000 + "\n"
    for stream in ("gpu_util", "phases", "topology"):
        path = root / f"{stream}.jsonl"
        with open(path, "a") as f:
            f.write(deep)
    with open(root / "gpu_util.jsonl", "a") as f:
        f.write(json.dumps({"ts": 1_767_225_541.0, "node": "10.0.0.1", "gpu": 0, "mem_mb": -5}) + "\n")
    run = load_miles_dashboard(root)
    assert (run.gpu_samples["used"] >= 0).all()
    assert any("negative mem_mb" in w for w in run.warnings), run.warnings
    assert any(w.startswith("gpu_util: skipped 1 malformed") for w in run.warnings), run.warnings


def test_unreadable_gpu_util_lines_are_not_blamed_on_nvml(tmp_path):
    from miles_profile.errors import MilesProfileError
    from miles_profile.importers.miles_dashboard import load_miles_dashboard
    root = miles_dump(tmp_path)
    for path in (root / "gpu_util").glob("*.jsonl"):
        path.write_text("not json\n{broken\n")
    with pytest.raises(MilesProfileError) as info:
        load_miles_dashboard(root)
    assert "NVML" not in str(info.value) and "malformed" in str(info.value)


# -- the sweep: every damage above, through the CLI ---------------------------------------------------
def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _zero_link(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def _sparse(path: Path, head: str = "") -> None:
    path.write_text(head)
    os.truncate(path, 2 * 1024 ** 3)


def _host_files(run: Path, stem: str = "h-9") -> None:
    (run / f"{stem}.host.json").write_text(json.dumps({"format_version": 1, "host": "h"}))
    (run / f"{stem}.host.csv").write_text("t,host_available\n1000.5,5\n")


def _forecast_then_lost_events(run: Path) -> None:
    meta = json.loads((run / "h-7.meta.json").read_text())
    meta["annotations"] = {"forecast": {"device": "cpu", "phases": [
        {"phase": "train", "device": "host", "peak": 100, "allocator": 0}]}}
    (run / "h-7.meta.json").write_text(json.dumps(meta))
    (run / "h-7.events.jsonl").write_text("")


def _account_overflow(run: Path) -> None:
    with open(run / "h-7.events.jsonl", "a") as f:
        f.write(json.dumps({"t": 1002.0, "kind": "account", "name": "kv_cache", "pid": 7,
                            "attrs": {"device": "host", "bytes": 10 ** 20}}) + "\n")


def _empty_processes(run: Path) -> None:
    for k in range(300):
        for suffix in (".meta.json", ".samples.csv", ".events.jsonl"):
            (run / f"e-{k}{suffix}").write_bytes(b"")


SINGLE = {
    "samples-fifo": lambda r: _fifo(r / "h-7.samples.csv"),
    "events-fifo": lambda r: _fifo(r / "h-7.events.jsonl"),
    "meta-fifo": lambda r: _fifo(r / "h-7.meta.json"),
    "host-json-fifo": lambda r: (_host_files(r), _fifo(r / "h-9.host.json")),
    "host-csv-fifo": lambda r: (_host_files(r), _fifo(r / "h-9.host.csv")),
    "host-csv-dev-zero": lambda r: (_host_files(r), _zero_link(r / "h-9.host.csv")),
    "events-dev-zero": lambda r: _zero_link(r / "h-7.events.jsonl"),
    "host-csv-sparse": lambda r: (_host_files(r), _sparse(r / "h-9.host.csv", "t,host_available\n1000.5,5\n")),
    # a malformed row (one field too many) that is not UTF-8: pyarrow fails inside its row handler
    "host-csv-row-not-utf8": lambda r: (_host_files(r), (r / "h-9.host.csv").write_bytes(
        b"t,host_available\n1000.5,5\n1001.0,6,\xff\n1002.0,7\n")),
    "meta-sparse": lambda r: _sparse(r / "h-7.meta.json", '{"format_version": 1'),
    "meta-empty": lambda r: (r / "h-7.meta.json").write_bytes(b""),
    "events-empty": lambda r: (r / "h-7.events.jsonl").write_bytes(b""),
    "host-stem-is-a-path": lambda r: (_host_files(r), (r / "h-9.host.json").write_text(
        json.dumps({"format_version": 1, "host": "h", "stem": "../../../etc/passwd"}))),
    "host-json-version-9": lambda r: (_host_files(r), (r / "h-9.host.json").write_text(
        json.dumps({"format_version": 9}))),
    "account-over-int64": _account_overflow,
    "forecast-then-lost-events": _forecast_then_lost_events,
    "300-empty-processes": _empty_processes,
}


def _multi(tmp_path: Path, damage: str) -> list[str]:
    run = two_rank_run(tmp_path)
    if damage.startswith("rank-1-without-"):
        (run / f"h-8.{damage[len('rank-1-without-'):]}").unlink()
    elif damage == "copy-beside-it":
        meta = json.loads((run / "meta.json").read_text())
        (run / "meta.json").write_text(json.dumps({**meta, "run_id": "job"}))
        shutil.copytree(run, run.with_name(run.name + ".bak"))
    elif damage == "same-pid-two-hosts-a-day-apart":
        from tests.unit.test_logdir_multihost import write_host_run
        write_host_run(tmp_path / "logs" / "a", "node-a", "job", begin=1.0)
        write_host_run(tmp_path / "logs" / "b", "node-b", "job", begin=1.0 + 86400)
        shutil.rmtree(run)
    return [str(tmp_path / "logs")]


MULTI = ["rank-1-without-samples.csv", "rank-1-without-events.jsonl", "rank-1-without-meta.json",
         "copy-beside-it", "same-pid-two-hosts-a-day-apart"]


def _miles(tmp_path: Path, damage: str) -> list[str]:
    root = miles_dump(tmp_path)
    if damage == "fifo-partition":
        os.mkfifo(root / "gpu_util" / "20990101_00.jsonl")
    elif damage == "nested-json":
        for stream in ("gpu_util", "phases", "topology"):
            (root / f"{stream}.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    elif damage == "negative-mem":
        (root / "gpu_util.jsonl").write_text(json.dumps({"ts": 1_767_225_541.0, "node": "10.0.0.1", "gpu": 0,
                                                         "mem_mb": -5}) + "\n")
    elif damage == "sparse-meta":
        _sparse(root / "meta.json", '{"run_name": "x", "start_ts": 1}')
    return [str(root.parent)]


def _visualize_never_hangs_nor_crashes(tmp_path: Path, args: list[str], readable: bool = True) -> None:
    out = tmp_path / "out"
    out.mkdir()
    done = cli("-m", "miles_profile.visualize", *args, "--json", str(out / "v.json"), "-o", str(out / "r.html"),
               timeout=120)  # a hang fails here as TimeoutExpired
    assert "Traceback" not in done.stderr, done.stderr
    if readable:
        assert done.returncode in (0, 1), done.stderr
    else:
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("damage", sorted(SINGLE))
def test_sweep_single_process_runs(tmp_path, damage):
    run = make_run(tmp_path / "logs")
    write_process_meta(run, "h-8", {"pid": 8, "role": "in_process", "stem": "h-8", "end_time": 1020.0})
    intact = SampleWriter(run, "h-8", ["rss", "rss_peak"])  # the readable process the report must show
    intact.append(1000.5, "", [1, 2])
    intact.close()
    EventWriter(run, "h-8").close()
    SINGLE[damage](run)
    _visualize_never_hangs_nor_crashes(tmp_path, [str(run)])


@pytest.mark.slow
@pytest.mark.parametrize("damage", MULTI)
def test_sweep_multi_process_runs(tmp_path, damage):
    _visualize_never_hangs_nor_crashes(tmp_path, _multi(tmp_path, damage))


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["fifo-partition", "nested-json", "negative-mem", "sparse-meta"])
def test_sweep_miles_dumps(tmp_path, damage):
    # a sparse meta.json is no Miles dump and no run: refused in one line, as any unreadable input
    _visualize_never_hangs_nor_crashes(tmp_path, _miles(tmp_path, damage), readable=damage != "sparse-meta")


def test_a_run_nobody_ended_and_nobody_writes_says_it_may_end_early(tmp_path):
    run = make_run(tmp_path / "logs")
    meta = json.loads((run / "h-7.meta.json").read_text())
    del meta["end_time"]
    (run / "h-7.meta.json").write_text(json.dumps(meta))
    (run / "h-7.status.json").unlink()  # a log from before status files (the status would give the end)
    assert not any("clean stop" in w for w in load_run(run).warnings)  # just written: may be live
    for path in run.iterdir():
        os.utime(path, (1000.0, 1000.0))
    assert any("without a clean stop" in w for w in load_run(run).warnings)


def test_a_host_row_that_is_not_utf8_is_skipped_and_the_rest_is_read(tmp_path):
    # before: pyarrow failed inside its row handler ("Exception ignored ... Traceback" on the terminal)
    # and pandas' fallback raised UnicodeDecodeError: the whole host file was lost
    from miles_profile.logdir.host_reader import _read_csv
    path = tmp_path / "h-9.host.csv"
    path.write_bytes(b"t,host_available\n1000.5,5\n1001.0,6,\xff\n1002.0,7\n")
    warnings: list[str] = []
    frame = _read_csv(path, warnings)
    assert frame["t"].tolist() == [1000.5, 1002.0] and frame["host_available"].tolist() == [5, 7]
    assert "h-9.host.csv: skipped 1 malformed rows" in warnings
