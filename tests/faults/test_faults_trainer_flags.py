"""Hostile trainer flags and Ctrl-C (trainer/args.py, trainer/train.py, miles_profile/record.py): every
bad number is one line and exit 2 before torch sees it; Ctrl-C is one line and exit 130, for
`python -m trainer.train` and for `python -m miles_profile.record -- ...`, with the offload files gone."""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import miles_profile as mp
from tests.conftest import REPO, python_env
from trainer.args import SEED_MAX, parse_args

HUGE = "9" * 400  # past float's range: float() gives inf, int() of it raises OverflowError

# (argv, what the one line says). Every numeric flag: not finite, zero, negative, past its bound.
BAD = [
    (["--kv-cache-bytes", "999999999999999999999"], "999999999999999999999 is more than the cpu's memory"),
    (["--kv-cache-bytes", HUGE], "is more than the cpu's memory"),
    (["--kv-cache-bytes", "1024GiB"], "is more than the cpu's memory"),
    (["--kv-cache-bytes", "0.5"], "--kv-cache-bytes must be at least 1"),
    (["--kv-cache-bytes", "12GB"], "invalid size '12GB'"),
    (["--offload-chunk-bytes", "0"], "--offload-chunk-bytes must be at least 1"),
    (["--offload-chunk-bytes", "inf"], "invalid size 'inf'"),
    (["--lr", "nan"], "--lr must be positive and finite"),
    (["--lr", "inf"], "--lr must be positive and finite"),
    (["--lr=-inf"], "--lr must be positive and finite"),
    (["--lr", "1e999"], "--lr must be positive and finite"),
    (["--lr", "0"], "--lr must be positive and finite"),
    (["--lr=-1e-3"], "--lr must be positive and finite"),
    (["--lr", "fast"], "invalid float value"),
    (["--seed", "99999999999999999999999"], f"--seed must be from 0 to {SEED_MAX}"),
    (["--seed", str(SEED_MAX + 1)], f"--seed must be from 0 to {SEED_MAX}"),
    (["--seed", "-1"], f"--seed must be from 0 to {SEED_MAX}"),
    (["--seed", "1.5"], "invalid int value"),
    (["--n-samples-per-prompt", "0"], "--n-samples-per-prompt must be at least 2 for GRPO"),
    (["--n-samples-per-prompt", "0", "--use-critic"], "--n-samples-per-prompt must be at least 2 for GRPO (1 is"),
    (["--n-samples-per-prompt", "-3"], "--n-samples-per-prompt must be at least 2 for GRPO"),
    (["--num-rollout", "0"], "--num-rollout must be at least 1"),
    (["--num-rollout", "-5"], "--num-rollout must be at least 1"),
    (["--digits", "0"], "--digits must be at least 1"),
    (["--digits", "99999999999999999999"], "holds less than one sequence"),
    (["--rollout-batch-size", "0"], "--rollout-batch-size must be at least 1"),
    (["--rollout-batch-size", "99999999999999999999"], "the token ids alone"),
    (["--rollout-batch-size", "1000000", "--n-samples-per-prompt", "1000000"], "the token ids alone"),
    (["--micro-batch-size", "0"], "--micro-batch-size must be at least 1"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_bad_numbers_are_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--preset", "tiny", *argv], cuda_available=False)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert err.count("\n") == 1 and err.startswith("python -m trainer.train: error: ")


@pytest.mark.parametrize("argv", [
    ["--seed", "0"], ["--seed", str(SEED_MAX)], ["--lr", "1e-12"], ["--lr", "10"],
    ["--n-samples-per-prompt", "1", "--use-critic"], ["--n-samples-per-prompt", "2"],
    ["--num-rollout", "99999999999999999999"], ["--micro-batch-size", "99999999999999999999"],
    ["--offload-chunk-bytes", HUGE], ["--kv-cache-bytes", "1.5MiB"],
])
def test_numbers_at_their_bounds_are_accepted(argv):
    cfg = parse_args(["--preset", "tiny", *argv], cuda_available=False)
    assert cfg.n_samples_per_prompt >= 1 and cfg.lr > 0 and cfg.kv_cache_bytes >= 1


def _run(argv: list[str], timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=python_env(), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_the_largest_seed_trains_with_a_critic():
    """SEED_MAX is usable, the critic's seed + 1 included (torch takes seeds up to 2**64 - 1)."""
    result = _run(["-m", "trainer.train", "--preset", "tiny", "--num-rollout", "1", "--use-critic",
                   "--seed", str(SEED_MAX)])
    assert result.returncode == 0, result.stderr


ISSUE_EXAMPLES = [["--kv-cache-bytes", "999999999999999999999"], ["--lr", "nan"], ["--lr", "inf"],
                  ["--seed", "99999999999999999999999"], ["--n-samples-per-prompt", "0"]]


@pytest.mark.slow
@pytest.mark.parametrize("argv", ISSUE_EXAMPLES, ids=[" ".join(a) for a in ISSUE_EXAMPLES])
def test_issue_examples_exit_2_in_both_entry_points(tmp_path, argv):
    """The flags of issue 11 as typed: the trainer, and the recorder running it (no run directory is
    made for a flag error)."""
    logs = tmp_path / "logs"
    for command in (["-m", "trainer.train"], ["-m", "miles_profile.record", "--log-dir", str(logs), "--"]):
        result = _run([*command, "--preset", "tiny", "--num-rollout", "1", *argv])
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "error:" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""
    assert not logs.exists() or not any(logs.iterdir())


# Run as `python -m`, then say whether torch was imported: a flag error should cost a user no torch import
# (1.5 CPU-s on the suite's VM), also through `record`.
BEFORE_TORCH = """
import runpy, sys
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as exit:
    print(exit.code, "torch" in sys.modules)
"""


RECORD = ["miles_profile.record", "--log-dir", "LOGS", "--"]
FLAG_ERRORS = [(["trainer.train"], ["--lr", "nan"], "--lr must be positive and finite"),
               (["trainer.train"], ["--seed", "-1"], "--seed must be from 0"),
               (RECORD, ["--lr", "nan"], "--lr must be positive and finite"),
               (RECORD, ["--nproc-per-node", "2", "--preset", "tiny", "--rollout-batch-size", "3"],
                "does not split evenly over 2 ranks")]


@pytest.mark.parametrize("entry, argv, message", FLAG_ERRORS, ids=["train-lr", "train-seed", "record-lr", "record-nproc"])
def test_a_flag_error_is_answered_before_torch_loads(tmp_path, entry, argv, message):
    logs = tmp_path / "logs"
    entry = [str(logs) if a == "LOGS" else a for a in entry]
    preset = [] if "--nproc-per-node" in argv else ["--preset", "tiny"]
    result = _run(["-c", BEFORE_TORCH, *entry, *preset, *argv])
    assert result.stdout.split() == ["2", "False"], (result.stdout, result.stderr)  # exit 2, torch never loaded
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not logs.exists() or not any(logs.iterdir())


# --- Ctrl-C ---------------------------------------------------------------------------------------

TRAIN = ["--preset", "tiny", "--num-rollout", "100000", "--offload-train", "--offload-rollout",
         "--optimizer-cpu-offload", "--offload-train-target", "disk"]


def _interrupt_after(argv: list[str], marker: str, timeout: float = 180) -> tuple[int, str]:
    """Start `python argv` in its own session, as a terminal's foreground job; once a line contains
    `marker`, send SIGINT to the whole group (what Ctrl-C does); return (exit code, output)."""
    proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=python_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, deadline = [], time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while not any(marker in line for line in lines):
                assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
                if sel.select(timeout=1.0):
                    lines.append(proc.stdout.readline())
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(lines) + rest


def _assert_interrupted(code: int, output: str, offload_dir: Path) -> None:
    assert code == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert sum("interrupted" in line for line in output.splitlines()) == 1, output
    assert not list(offload_dir.glob("trainer-*"))  # the run removed its offload files on the way out


@pytest.mark.slow
@pytest.mark.parametrize("marker", ["trainer: preset", "rollout 2/"])
def test_ctrl_c_on_the_trainer_is_one_line_and_exit_130(tmp_path, marker):
    offload = tmp_path / "offload"
    code, output = _interrupt_after(["-m", "trainer.train", *TRAIN, "--offload-train-disk-dir", str(offload)],
                                    marker)
    _assert_interrupted(code, output, offload)
    assert output.splitlines()[-1] == "trainer: interrupted"


@pytest.mark.slow
@pytest.mark.parametrize("marker", ["miles_profile: recording to", "rollout 2/"])
def test_ctrl_c_on_a_recorded_run_is_one_line_and_exit_130(tmp_path, marker):
    offload, logs = tmp_path / "offload", tmp_path / "logs"
    code, output = _interrupt_after(["-m", "miles_profile.record", "--log-dir", str(logs), "--", *TRAIN,
                                     "--offload-train-disk-dir", str(offload)], marker)
    _assert_interrupted(code, output, offload)
    run = mp.load(next(logs.iterdir()))  # what was recorded up to Ctrl-C is a readable run
    assert marker != "rollout 2/" or (run.phases["name"] == "train").sum() >= 2
