"""Real trainers, unmodified, under `record --exec` (tests/untouched/: programs that know nothing of
miles_profile, tiny random models built from a config, nothing downloaded): for each integration a healthy
run that exits 0 and a planted leak that fails `leak` with its rate. transformers, trl, lightning and
accelerate are the `integrations` test extra (pyproject.toml); a missing one skips its cases."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

import miles_profile as mp
from miles_profile.verdicts.engine import judge
from tests.conftest import REPO, python_env

pytestmark = pytest.mark.slow
PROGRAMS = REPO / "tests" / "untouched"
BIN = Path(sys.executable).parent
MiB = 1024 ** 2


# A real model's step takes tens of ms; the tiny test models' take ~1 ms, so a whole run fit in one or two of
# the integration's 0.2 s phases on an idle machine and the leak had nothing to judge.
STEP_MS = "100"


def command(kind: str, out: Path, leak: str) -> list[str]:
    py = sys.executable
    return {
        "hf_trainer": [py, str(PROGRAMS / "hf_trainer.py"), str(out), "--steps", "30", "--leak-mib", leak, "--step-ms", STEP_MS],
        "trl_grpo": [py, str(PROGRAMS / "trl_grpo.py"), str(out), "--steps", "12", "--leak-mib", leak, "--step-ms", STEP_MS],
        "lightning": [py, str(PROGRAMS / "lightning_fit.py"), "--steps", "40", "--leak-mib", leak, "--step-ms", STEP_MS],
        # two ranks, each recording itself (its rank from torchrun's environment)
        "accelerate": [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                       "--main_process_port", str(free_port()),
                       "--mixed_precision", "no", "--dynamo_backend", "no", str(PROGRAMS / "accelerate_loop.py"),
                       "--steps", "40", "--leak-mib", leak, "--step-ms", STEP_MS],
    }[kind]


def free_port() -> int:
    """A port nobody listens on now (torchrun's default 29500 is shared by every run on the machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# MiB kept per step; 12 elsewhere (GRPO runs 8 slow steps: more per step; accelerate 150 fast ones: less)
LEAK_MIB = {"trl_grpo": 24, "accelerate": 4}
NEEDS = {"hf_trainer": "transformers", "trl_grpo": "trl", "lightning": "lightning", "accelerate": "accelerate"}
TAGGED_BY = {"hf_trainer": "transformers.Trainer callback", "trl_grpo": "transformers.Trainer callback",
             "lightning": "Lightning callback", "accelerate": "torch optimizer step hook"}


def record_and_judge(kind: str, leak: str, tmp: Path, report: bool = False):
    """(record's CompletedProcess, the loaded run, its verdict, visualize's CompletedProcess or None). The
    verdict is judged here, as `visualize` judges it (verdicts.engine.judge): a second Python importing
    pandas and plotly per run proved nothing more; `report` runs `visualize` itself too (its words)."""
    pytest.importorskip(NEEDS[kind])
    # One intra-op thread: torch's second thread spun on the shared 2-core machine while the tiny model waited
    # on it (the HF run took 8-10 s of CPU with it, 5.5 s without); the memory each step keeps is the same.
    env = dict(python_env(), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp / "logs"),
                           "--interval-ms", "20", "--exec", "--", *command(kind, tmp / "out", leak)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = mp.load(tmp / "logs")
    verdict = judge(run)
    shown = None
    if report:
        shown = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(tmp / "logs"), "-o",
                                str(tmp / "report.html")],
                               env=python_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
        assert shown.returncode == verdict.exit_code_for(), shown.stdout
    return done, run, verdict, shown


def leak_check(verdict):
    return next(c for c in verdict.checks if c.name == "leak")


@pytest.mark.parametrize("kind", list(NEEDS))
def test_a_healthy_trainer_is_tagged_and_passes(kind, tmp_path):
    done, run, verdict, shown = record_and_judge(kind, "0", tmp_path, report=kind == "trl_grpo")
    assert f"steps tagged by {TAGGED_BY[kind]}" in done.stderr
    assert verdict.exit_code_for() == 0, [(c.name, c.status, c.summary) for c in verdict.checks]
    leak = leak_check(verdict)
    assert leak.status == "pass", leak.summary
    assert set(run.phases["name"]) == {"train"}
    if kind == "accelerate":
        assert sorted(p["rank"] for p in run.processes if p.get("role") != "exec_parent") == [0, 1]
    if kind == "trl_grpo":  # no public hook around its generation: said in the run and the report
        assert "GRPOTrainer generates inside each optimizer step" in shown.stdout


@pytest.mark.parametrize("kind", list(NEEDS))
def test_a_planted_leak_fails_leak_with_its_rate(kind, tmp_path):
    leak_mib = LEAK_MIB.get(kind, 12)
    done, run, verdict, _ = record_and_judge(kind, str(leak_mib), tmp_path)
    assert verdict.exit_code_for() == 1, [(c.name, c.status, c.summary) for c in verdict.checks]
    leak = leak_check(verdict)
    assert leak.status == "fail" and "sustained growth" in leak.summary, leak.summary
    assert "MiB/iteration" in leak.summary
    worst = max((f for f in leak.findings if f.status == "fail"), key=lambda f: f.numbers["slope"])
    # per step: a phase that groups short steps is numbered by its first step (rollout_id)
    assert 0.8 * leak_mib * MiB < worst.numbers["slope"] < 1.2 * leak_mib * MiB, leak.summary
