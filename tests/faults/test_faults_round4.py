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
    assert "refusing to write" in line and str(run / "report.html") in line, line
    assert victim.read_text() == "precious"
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
def test_duplicated_event_lines_are_dropped_with_a_warning(recorded, tmp_path):
    run = copy_of(recorded, tmp_path)
    events = run / f"{stem_of(run)}.events.jsonl"
    lines = events.read_bytes()
    events.write_bytes(lines + lines)  # cat E E > E
    done = report(run, tmp_path / "out")
    assert done.returncode in (0, 1), done.stderr  # before: "could not report this log (InvalidIndexError)", 2
    n = lines.count(b"\n")
    assert f"{events.name}: dropped {n} duplicated event lines" in done.stdout, done.stdout
    intact = report(copy_of(recorded, tmp_path / "intact"), tmp_path / "out2")
    assert done.returncode == intact.returncode
    assert json.loads((tmp_path / "out" / "v.json").read_text())["runs"][0]["checks"] == \
        json.loads((tmp_path / "out2" / "v.json").read_text())["runs"][0]["checks"]
