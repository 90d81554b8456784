"""OOM forensics end to end: a real child killed under `record --exec` (SIGKILL, a synthetic cgroup
counter that moves, and, where this machine lets us make a memory-limited cgroup, the kernel's OOM
killer itself); the report, --json and the exit code say who died, where, and what grew before."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import miles_profile as mp
from miles_profile.verdicts.engine import judge
from miles_profile.visualize import main as visualize

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

# Grows 8 MiB per step, 4 steps per `train` phase; kills itself in iteration 2 (`die`), or exits with
# the code given. `bump` moves the synthetic oom_kill counter first, as the kernel would.
CHILD = """
import os, signal, sys, time
import miles_profile as mp
die, code, bump = sys.argv[1], int(sys.argv[2]), sys.argv[3]
held = []
for it in range(100):
    with mp.phase("train", rollout_id=it):
        for _ in range(4):
            held.append(bytearray(8 << 20)); time.sleep(0.02)
        if die == "kill" and it == 2:
            if bump:
                open(bump, "w").write("oom_kill 1\\n")
            os.kill(os.getpid(), signal.SIGKILL)
    if die == "exit" and it == 1:
        sys.exit(code)
"""


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **extra)
    env.pop("MILES_PROFILE_RUN_DIR", None)
    return env


def _record(tmp: Path, die: str, code: int = 0, bump: bool = False, prefix: list[str] = ()) -> tuple[int, Path]:
    child, events = tmp / "child.py", tmp / "memory.events"
    child.write_text(CHILD)
    events.write_text("oom_kill 0\n")
    env = _env() if prefix else _env(MILES_PROFILE_MEMORY_EVENTS=str(events))
    proc = subprocess.run([*prefix, sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp / "logs"),
                           "--exec", "--", sys.executable, str(child), die, str(code), str(events) if bump else ""],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return proc.returncode, next((tmp / "logs").glob("run-*"))


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("sigkill"), "kill")


@pytest.fixture(scope="module")
def oom_counted(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("counted"), "kill", bump=True)


def _oom_events(run_dir: Path) -> list[dict]:
    return [e for path in run_dir.glob("*.events.jsonl") for e in map(json.loads, path.read_text().splitlines())
            if e["kind"] == "oom"]


def test_a_child_killed_by_sigkill_is_recorded_and_reported_first(killed, tmp_path):
    code, run_dir = killed
    assert code == 128 + signal.SIGKILL
    seen = {e["attrs"]["detected_by"]: e["attrs"] for e in _oom_events(run_dir)}
    assert seen["record_exec"]["cause"] == "sigkill" and seen["record_exec"]["signal"] == signal.SIGKILL
    # the host sampler (in record) names it too when it read the zombie before record reaped it; once
    # reaped, record's own exit status is the witness
    assert seen.get("host_sampler", {"cause": "sigkill"})["cause"] == "sigkill"
    pid = seen["record_exec"]["process_pid"]

    out, js = tmp_path / "r.html", tmp_path / "r.json"
    # a SIGKILL with 10 %+ of the memory free and no OOM kill counted is not a memory failure: WARN, exit 0
    # (1 under --strict), the death still said first (issue 30: a launcher's kill -9 of a healthy rank)
    assert visualize([str(run_dir), "-o", str(out), "--json", str(js)]) == 0
    data = json.loads(js.read_text())
    assert data["status"] == "warn" and data["exit_code"] == 0 and data["exit_code_strict"] == 1
    assert visualize([str(run_dir), "-o", str(out), "--strict"]) == 1
    summary = data["runs"][0]["summary"]
    (death,) = summary["killed"]  # two witnesses, one death
    assert (death["pid"], death["cause"], death["phase"], death["iteration"]) == (pid, "sigkill", "train", 2)
    assert death["grew"][0]["growth"] >= 16 << 20  # 3 iterations of 32 MiB, within the last 10 s
    # its own RSS, or its tree's sampled from outside (its own last rows die unflushed with it)
    assert any(g["what"] in (f"RSS of pid {pid}", "RSS of process tree") or
               g["what"].startswith("RSS of process tree") for g in death["grew"]), death["grew"]
    html = out.read_text()
    assert html.index('class="killed"') < html.index('class="summary-verdict"')


def test_the_cli_summary_says_killed_before_the_verdict(killed):
    run = mp.load(killed[1])
    verdict = judge(run)
    from miles_profile.report.summary import summarize
    lines = summarize(run, verdict.checks, verdict.status).lines()
    assert lines[0].startswith("KILLED: pid ") and "killed by SIGKILL in train of iteration 2" in lines[0]
    assert lines[1] == "verdict: WARN" and verdict.exit_code == 0 and verdict.exit_code_for(strict=True) == 1
    assert "not judged a memory failure" in lines[0]


def test_a_phase_selection_never_hides_a_death(killed):
    run = mp.load(killed[1])
    assert judge(run, selection="train").status == "warn"
    oom = next(c for c in judge(run, selection="train").checks if c.name == "oom")
    assert oom.status == "warn" and len(oom.findings) == 1


def test_the_cgroup_counter_moving_makes_it_an_oom_kill(oom_counted):
    code, run_dir = oom_counted
    assert code == 128 + signal.SIGKILL
    causes = {e["attrs"]["detected_by"]: e["attrs"]["cause"] for e in _oom_events(run_dir)}
    assert causes["record_exec"] == "oom_kill"
    (oom,) = [c for c in judge(mp.load(run_dir)).checks if c.name == "oom"]
    assert oom.status == "fail" and oom.findings[0].cause == "oom_kill"
    assert "killed by the OOM killer in train of iteration 2" in oom.summary


@pytest.mark.parametrize("code", [0, 3])
def test_a_child_that_exits_by_itself_is_no_death(tmp_path, code):
    rc, run_dir = _record(tmp_path, "exit", code)
    assert rc == code and _oom_events(run_dir) == []
    run = mp.load(run_dir)
    verdict = judge(run)
    (oom,) = [c for c in verdict.checks if c.name == "oom"]
    assert oom.status == "n/a"
    # Not a memory verdict, but every view says that the command failed, first, so PASS is not misread.
    from dashboards.panels.summary import render
    from miles_profile.report.summary import summarize
    summary = summarize(run, verdict.checks, verdict.status)
    said = "the recorded command exited with code 3"
    assert (said in summary.lines()[0]) == bool(code) and summary.lines()[bool(code)].startswith("verdict: ")
    js = tmp_path / "r.json"
    visualize([str(run_dir), "-o", str(tmp_path / "r.html"), "--json", str(js)])
    assert json.loads(js.read_text())["runs"][0]["summary"]["command_exit"] == code
    html = (tmp_path / "r.html").read_text()
    assert (html.find(said) < html.index('class="summary-verdict"')) and ((said in html) == bool(code))
    children, _ = render(summary, 0.0)
    assert (children[0] is not None and said in children[0].children) == bool(code)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_a_command_stopped_by_a_signal_is_no_death_and_every_view_says_so(tmp_path, how):
    """A scheduler's SIGTERM (or Ctrl-C) to `record`: the child is stopped by it, and Python's default
    handling ends it without writing its end. Not a memory death: no KILLED, oom n/a, the command's
    stop said first."""
    child, events = tmp_path / "child.py", tmp_path / "memory.events"
    child.write_text(CHILD)
    events.write_text("oom_kill 0\n")
    logs = tmp_path / "logs"
    proc = subprocess.Popen([sys.executable, "-m", "miles_profile.record", "--log-dir", str(logs), "--exec", "--",
                             sys.executable, str(child), "run", "0", ""], cwd=REPO,
                            env=_env(MILES_PROFILE_MEMORY_EVENTS=str(events)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                '"rollout_id":2}' in p.read_text() for p in logs.glob("run-*/*.events.jsonl")):
            time.sleep(0.1)
        proc.send_signal(how)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (-how, 128 + how)
    run_dir = next(logs.glob("run-*"))
    js = tmp_path / "r.json"
    assert visualize([str(run_dir), "-o", str(tmp_path / "r.html"), "--json", str(js)]) == 0
    summary = json.loads(js.read_text())["runs"][0]["summary"]
    assert summary["killed"] == [] and f"stopped by {signal.Signals(how).name}" in summary["command_exit_text"]
    (oom,) = [c for c in judge(mp.load(run_dir)).checks if c.name == "oom"]
    assert oom.status == "n/a"
    if how == signal.SIGTERM:  # ended without writing its end (Ctrl-C's KeyboardInterrupt lets it write it)
        assert "stopped by SIGTERM, and 1 recorded process(es) ended with it" in oom.summary


def _limited_cgroup(tmp_path: Path, limit: int) -> Path | None:
    """A child of our own memory cgroup with `limit`, or None where this machine does not allow one."""
    own = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
    for parent, limit_file in ((Path("/sys/fs/cgroup/memory") / own.get("memory", "/").lstrip("/"),
                                "memory.limit_in_bytes"),
                               (Path("/sys/fs/cgroup") / own.get("", "/").lstrip("/"), "memory.max")):
        group = parent / f"miles-oom-test-{os.getpid()}-{tmp_path.name}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            (group / limit_file).write_text(str(limit))
            (group / "memory.swappiness").exists() and (group / "memory.swappiness").write_text("0")
            return group
        except OSError:
            group.rmdir()
    return None


def test_a_real_oom_kill_in_a_memory_limited_cgroup(tmp_path):
    limit = 300 << 20
    group = _limited_cgroup(tmp_path, limit)
    if group is None:
        pytest.skip("this machine does not let us create a memory-limited cgroup")
    try:  # record itself runs in the cgroup, as a job in a container does; the child grows until killed
        code, run_dir = _record(tmp_path, "grow", prefix=["sh", "-c", f'echo $$ > {group}/cgroup.procs; exec "$@"', "sh"])
    finally:
        group.rmdir()
    assert code == 128 + signal.SIGKILL
    run = mp.load(run_dir)
    (oom,) = [c for c in judge(run).checks if c.name == "oom"]
    death = oom.findings[0]
    assert oom.status == "fail" and death.cause == "oom_kill", oom.summary
    assert death.numbers["memory_max"] == limit and death.numbers["phase"] == "train"
    assert death.numbers["grew"][0]["growth"] > 100 << 20  # it grew toward the limit in the last 10 s


VIEWPORT = {"width": 1500, "height": 1000}


@pytest.mark.browser
def test_the_report_and_the_dashboard_show_the_death_first_and_its_link_zooms_to_the_seconds_before(
        killed, open_report, dashboard_page, tmp_path):
    import shutil

    from dashboards.serve import dashboard_process
    out, js = tmp_path / "r.html", tmp_path / "r.json"
    visualize([str(killed[1]), "-o", str(out), "--json", str(js)])
    death = json.loads(js.read_text())["runs"][0]["summary"]["killed"][0]
    page, requests, errors = open_report(out, **VIEWPORT)
    assert not errors and not requests
    page.wait_for_selector("#timeline-0 .main-svg")
    # the HTML header says what --json and the dashboard say: WARN, exit 0 (1 with --strict)
    assert page.locator("#overall").get_attribute("data-status") == "warn"
    assert "1 with --strict" in page.locator("#overall-exit").inner_text()
    killed_box = page.locator("#run-killed").bounding_box()
    verdict_box = page.locator("#run-summary .summary-verdict").bounding_box()
    assert killed_box["y"] + killed_box["height"] <= verdict_box["y"] <= VIEWPORT["height"]
    assert page.locator("#run-killed li[data-cause]").first.get_attribute("data-pid") == str(death["pid"])
    page.locator("#run-killed a.zoom-link").first.click()
    shown = page.evaluate("() => document.getElementById('timeline-0').layout.xaxis.range")
    t0 = float(page.locator("#run-killed a.zoom-link").first.get_attribute("data-t0"))
    t1 = float(page.locator("#run-killed a.zoom-link").first.get_attribute("data-t1"))
    assert t1 - t0 == pytest.approx(death["window_s"]) and shown[0] < t0 < t1 < shown[1]
    logs = tmp_path / "logs"
    shutil.copytree(killed[1], logs / killed[1].name)
    with dashboard_process(logs) as url:
        page = dashboard_page(VIEWPORT)
        page.goto(url)
        page.wait_for_selector("#summary-killed", timeout=60_000)
        text = page.locator("#summary-killed").inner_text()
        assert "killed by SIGKILL in train of iteration 2" in text
        assert page.locator("#summary-killed").bounding_box()["y"] < page.locator("#summary-status").bounding_box()["y"]
        assert page.locator("#summary-status").get_attribute("data-status") == "warn"  # as --json says
        assert "badge-warn" in page.locator("#summary-status").get_attribute("class")


def test_a_kill_9_of_record_itself_cuts_the_run_and_warns(tmp_path):
    """`record` killed mid-run: nothing says the run ended; once nothing was written for STALE_S, the oom
    check warns that the recording was cut, at which iteration (issue 30: it reported PASS, no word)."""
    from miles_profile.verdicts.oom import STALE_S, check_oom, cut_recording
    program = tmp_path / "loop.py"
    program.write_text("import time, numpy as np, miles_profile as mp\n"
                       "for it in range(500):\n"
                       "    with mp.phase('train', rollout_id=it):\n"
                       "        a = np.ones(4 << 20, dtype=np.uint8); time.sleep(0.05)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    record = subprocess.Popen([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path / "logs"),
                               "--exec", "--", sys.executable, str(program)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(6)
        os.kill(record.pid, signal.SIGKILL)
        record.wait(timeout=30)
    finally:
        os.killpg(record.pid, signal.SIGKILL)  # the orphaned child, in record's own session
    run = mp.load(next((tmp_path / "logs").glob("run-*")))
    assert cut_recording(run) is None  # written seconds ago: maybe still live
    cut = cut_recording(run, now=float(run.samples["t"].max()) + STALE_S + 1)
    assert cut is not None and cut.status == "warn" and "the recording was cut" in cut.message
    assert "the last iteration recorded is" in cut.message
    assert check_oom(run).status in ("n/a", "warn")  # never a failure for a recorder killed with memory free
