"""Record a corpus case with `record --exec`, judge it with `visualize --json`, and classify the verdict.

Only the standard library: the H200 machine records with this module and has no plotly; judging runs
`visualize` in a subprocess, so nothing here imports the report.

    record_workload(case, log_dir) -> run_dir        # python -m miles_profile.record --log-dir D --exec -- ...
    judge(run_dir) -> verdict dict                   # python -m miles_profile.visualize RUN --json F -o F.html
    classify(case, verdict) -> one of CLASSES
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent

# right: the expected check failed with the expected cause and no other failed (healthy: none failed).
# right + consequence: that, and another check failed with a cause that points back at the planted defect
# (serialized_peaks' `residual`: "more than one footprint resident, see offload_drop"), counted apart so a
# reader sees it; on a healthy case any failure is a false FAIL.
RIGHT, CONSEQUENCE, WRONG_CAUSE, MISSED, FALSE_FAIL, ERROR = (
    "right", "right + consequence", "right check, wrong cause", "missed", "false FAIL", "error")
CLASSES = (RIGHT, CONSEQUENCE, WRONG_CAUSE, MISSED, FALSE_FAIL, ERROR)
CONSEQUENCE_CAUSES = {"residual"}


class CorpusError(Exception):
    """A case that could not be recorded or judged (the program failed, timed out, or wrote no run)."""


def environment(device: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if device == "cpu":  # one thread per process: the cores are shared, and torchrun's ranks are many
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


# Where a program's temporary files go (its disk offloads: offload_tools.offload_dir): tmpfs when the machine
# has one with room. On the suite's VM a GiB written to ext4 costs 0.3 to 7.5 CPU-s of kernel time, 3.3 to
# 3.7 on average (bench/scratch_write_cost.py), on tmpfs about 0.4: llama-none-cpu used 29 to 36 CPU-s of the
# machine with its offloads on disk, 19 on tmpfs. What the checks judge is the same: the bytes leave the
# process either way, and the recorder's `disk` column counts the files wherever they are.
SCRATCH_ROOT = Path("/dev/shm")
SCRATCH_MIN_FREE = 8 * 1024 ** 3


@contextlib.contextmanager
def scratch_tmpdir():
    """A TMPDIR for one program on tmpfs, removed afterwards; None where there is no such place."""
    try:
        room = os.statvfs(SCRATCH_ROOT)
        path = tempfile.mkdtemp(prefix="miles-corpus-", dir=SCRATCH_ROOT) \
            if room.f_bavail * room.f_frsize >= SCRATCH_MIN_FREE else None
    except OSError:  # no /dev/shm, or not writable: the default temporary directory
        path = None
    try:
        yield path
    finally:
        if path:
            shutil.rmtree(path, ignore_errors=True)


def program_command(case) -> list[str]:
    script = str(CORPUS / f"{case.program}.py")
    program_args = ["--defect", case.defect, "--device", case.device, *case.args]
    if case.nproc:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(case.nproc),
                script, *program_args]
    return [sys.executable, script, *program_args]


def record_command(case, log_dir: Path) -> list[str]:
    return [sys.executable, "-m", "miles_profile.record", "--log-dir", str(log_dir),
            *(["--heap"] if case.heap else []), "--exec", "--", *program_command(case)]


def run_dirs(log_dir: Path) -> list[Path]:
    return sorted(p for p in Path(log_dir).glob("run-*") if (p / "meta.json").is_file())


def record_workload(case, log_dir: str | os.PathLike) -> Path:
    """Record `case` into a new run under `log_dir`; its program's output goes to log_dir/program.log."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    before = set(run_dirs(log_dir))
    with open(log_dir / "program.log", "w") as out, scratch_tmpdir() as scratch:
        env = environment(case.device)
        if scratch:
            env["TMPDIR"] = scratch
        try:
            proc = subprocess.run(record_command(case, log_dir), cwd=REPO, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=case.timeout_s)
        except subprocess.TimeoutExpired:
            raise CorpusError(f"{case.name}: timed out after {case.timeout_s} s") from None
    new = [p for p in run_dirs(log_dir) if p not in before]
    if proc.returncode != 0:
        raise CorpusError(f"{case.name}: the program exited {proc.returncode}: {last_line(log_dir / 'program.log')}")
    if len(new) != 1:
        raise CorpusError(f"{case.name}: expected one new run under {log_dir}, found {len(new)}")
    return new[0]


def last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def judge(run_dir: str | os.PathLike, timeout_s: int = 600) -> dict:
    """Visualize's verdict on one run: exit code, and per check its status and failing findings' causes."""
    run_dir = Path(run_dir)
    out = run_dir.parent / f"{run_dir.name}.verdict.json"
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(run_dir), "--json", str(out),
                               "-o", str(out.with_suffix(".html"))], cwd=REPO, env=environment("cpu"),
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise CorpusError(f"{run_dir}: visualize took more than {timeout_s} s") from None
    verdict = {"exit_code": proc.returncode, "judge_s": round(time.monotonic() - started, 1), "checks": {},
               "stderr": proc.stderr.strip().splitlines()[-1:] if proc.returncode == 2 else []}
    if proc.returncode in (0, 1) and out.is_file():
        runs = json.loads(out.read_text())["runs"]
        for check in runs[0]["checks"] if runs else []:
            failing = [f for f in check.get("findings", []) if f.get("status") == "fail"]
            verdict["checks"][check["name"]] = {
                "status": check["status"], "summary": check.get("summary", ""),
                "causes": sorted({str(f.get("cause")) for f in failing}),
                "first_failure": failing[0].get("message", "") if failing else ""}
    return verdict


def failing_checks(verdict: dict) -> list[str]:
    return [name for name, c in verdict["checks"].items() if c["status"] == "fail"]


def classify(case, verdict: dict) -> str:
    """One class per case. A check other than the expected one failing is a false FAIL, whatever else."""
    if verdict["exit_code"] not in (0, 1) or not verdict["checks"]:
        return ERROR
    failing = failing_checks(verdict)
    if case.check is None:
        return RIGHT if verdict["exit_code"] == 0 and not failing else FALSE_FAIL
    others = [name for name in failing if name != case.check]
    if any(not set(verdict["checks"][name]["causes"]) <= CONSEQUENCE_CAUSES for name in others):
        return FALSE_FAIL
    if case.check not in failing:
        return FALSE_FAIL if others else MISSED
    if case.cause not in verdict["checks"][case.check]["causes"]:
        return WRONG_CAUSE
    return CONSEQUENCE if others else RIGHT


def verdict_line(case, verdict: dict, cls: str) -> str:
    """`case: class (expected ...; got ...)` with the first failure's message."""
    expected = f"{case.check}/{case.cause}" if case.check else "no failing check"
    failing = failing_checks(verdict)
    got = ", ".join(f"{n}/{'+'.join(verdict['checks'][n]['causes'])}" for n in failing) or "no failing check"
    if verdict["exit_code"] not in (0, 1):
        got = f"visualize exited {verdict['exit_code']}: {' '.join(verdict.get('stderr', []))}"
    message = next((verdict["checks"][n]["first_failure"] for n in failing), "")
    return f"{case.name}: {cls} (expected {expected}; got {got})" + (f" — {message}" if message else "")
