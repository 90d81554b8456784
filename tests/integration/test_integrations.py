"""Integrations (miles_profile/integrations/) as real processes: the begin/end API and the decorator in a
real recorder, auto-tagging of an unmodified torch loop under `record --exec` (and --no-auto-tag), a child
that is not Python, and an untagged run judged by time (leak and --baseline). The real trainers
(transformers, TRL, Lightning, accelerate) are in test_integrations_trainers.py (slow)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import miles_profile as mp
from miles_profile.integrations import StepPhases, begin_step, end_step, step
from miles_profile.runmodel.stats import phase_instances
from tests.conftest import REPO, python_env

MiB = 1024 ** 2

# An unmodified torch loop (knows nothing of miles_profile): 60 optimizer steps of ~30 ms, LEAK MiB kept per step.
TORCH_LOOP = textwrap.dedent("""
    import sys, time, torch
    leak = int(sys.argv[1]) * 2 ** 20 // 4
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for _ in range(60):
        model(torch.randn(8, 64)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if leak:
            kept.append(torch.ones(leak))
        time.sleep(0.03)
""")

# No torch, no phases: a bytearray of LEAK MiB kept every 50 ms for 4 s, after a 0.5 s start-up.
PLAIN_LOOP = textwrap.dedent("""
    import sys, time
    leak = int(sys.argv[1]) * 2 ** 20
    time.sleep(0.5)
    kept = []
    for _ in range(160):
        if leak:
            kept.append(bytearray(b"x" * leak))
        time.sleep(0.05)
""")


def record(log_dir: Path, *command: str, flags: tuple[str, ...] = (), interval_ms: int = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(log_dir), "--interval-ms",
                           str(interval_ms), *flags, "--exec", "--", *command],
                          env=python_env(), cwd=REPO, capture_output=True, text=True, timeout=120)


def visualize(log_dir: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = log_dir / "verdict.json"
    done = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(log_dir), "-o",
                           str(log_dir / "report.html"), "--json",
                           str(out), *extra], env=python_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    return done, (json.loads(out.read_text()) if out.exists() else {})


def test_begin_end_and_the_decorator_make_one_train_phase_per_step(tmp_path):
    with mp.Recorder(tmp_path, interval_ms=50):
        steps = StepPhases("my_framework")
        for n in range(3):
            steps.begin(step=n)
        steps.end()
        begin_step()  # the module-level pair: another instance, refused while my_framework owns the process
        end_step()

        @step()
        def train_step():
            return 7
        assert train_step() == 7
    run = mp.load(next(tmp_path.iterdir()))
    phases = run.phases
    assert phases["name"].tolist() == ["train"] * 3  # the decorator's "manual" integration lost to my_framework
    assert phase_instances(run)["iteration"].tolist() == [0, 1, 2]  # each step an iteration
    notes = [p.get("annotations", {}) for p in run.processes]
    assert {"integration": "my_framework", "integration_cannot_see": ""}.items() <= notes[0].items()


@pytest.fixture(scope="module")
def torch_loops(tmp_path_factory):
    """The unmodified torch loop recorded healthy and leaking (6 MiB a step), and healthy with --no-auto-tag."""
    runs = {}
    for name, leak, flags in (("healthy", "0", ()), ("leak", "6", ()), ("off", "0", ("--no-auto-tag",))):
        log_dir = tmp_path_factory.mktemp(name)
        script = log_dir / "loop.py"
        script.write_text(TORCH_LOOP)
        runs[name] = (log_dir, record(log_dir, sys.executable, str(script), leak, flags=flags))
    return runs


@pytest.mark.slow
def test_an_unmodified_torch_loop_is_tagged_by_its_optimizer_steps(torch_loops):
    log_dir, done = torch_loops["healthy"]
    assert done.returncode == 0, done.stderr
    assert "steps tagged by torch optimizer step hook" in done.stderr
    run = mp.load(log_dir)
    # steps shorter than 0.2 s share a phase, numbered by its first step (rollout_id): each phase an iteration
    assert set(run.phases["name"]) == {"train"} and 5 <= len(run.phases) <= 60
    ids = run.phases["rollout_id"].tolist()
    assert ids == sorted(ids) and ids[0] == 1 and ids[-1] <= 60
    checked, verdict = visualize(log_dir)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "steps tagged by torch optimizer step hook" in checked.stdout


def test_the_leak_in_an_unmodified_torch_loop_fails_with_its_rate(torch_loops):
    log_dir, done = torch_loops["leak"]
    assert done.returncode == 0, done.stderr
    checked, verdict = visualize(log_dir)
    leak = next(c for c in verdict["runs"][0]["checks"] if c["name"] == "leak")
    assert checked.returncode == 1 and leak["status"] == "fail", checked.stdout
    assert "sustained growth" in leak["summary"] and "MiB/iteration" in leak["summary"]
    finding = next(f for f in leak["findings"] if f["status"] == "fail")
    assert 4.5 * MiB < finding["numbers"]["slope"] < 7.5 * MiB, leak["summary"]  # 6 MiB kept per step


def test_no_auto_tag_leaves_the_child_untagged(torch_loops):
    log_dir, done = torch_loops["off"]
    assert done.returncode == 0, done.stderr
    assert mp.load(log_dir).phases.empty
    assert "steps tagged" not in done.stderr


def test_a_child_that_is_not_python_is_recorded_untagged_and_said_so(tmp_path):
    done = record(tmp_path, "bash", "-c", "sleep 0.3")
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "no integration tagged" in line]
    assert len(said) == 1 and "judged by time" in said[0]


@pytest.fixture(scope="module")
def plain_loops(tmp_path_factory):
    """A Python program with no torch and no phases, healthy and keeping 2 MiB every 50 ms for 8 s.
    Judged over windows of time (30 s or less: a rise fails only where the floor rose in every window), read
    every 50 ms: windows of ~0.25 s, so a loaded machine's scheduling hiccup of 0.1 s leaves none flat (at
    4 s read every 20 ms, windows of 0.1 s, one went flat in a suite at load 14: WARN, not the FAIL)."""
    runs = {}
    for name, leak in (("healthy", "0"), ("leak", "2")):
        log_dir = tmp_path_factory.mktemp(f"plain-{name}")
        done = record(log_dir, sys.executable, "-c", PLAIN_LOOP, leak, interval_ms=50)
        assert done.returncode == 0, done.stderr
        runs[name] = log_dir
    return runs


def test_an_untagged_run_is_judged_by_time(plain_loops):
    checked, verdict = visualize(plain_loops["healthy"])
    assert checked.returncode == 0, checked.stdout
    assert "leak by time" in checked.stdout and "checks judged" in checked.stdout
    checked, verdict = visualize(plain_loops["leak"])
    leak = next(c for c in verdict["runs"][0]["checks"] if c["name"] == "leak")
    assert checked.returncode == 1 and leak["status"] == "fail", checked.stdout
    assert "by time: sustained growth" in leak["summary"] and "MiB/min" in leak["summary"]
    finding = next(f for f in leak["findings"] if f["status"] == "fail")
    assert finding["numbers"]["judged_by"] == "time" and finding["numbers"]["slope_low"] > 0


def test_baseline_compares_untagged_runs_by_time(plain_loops):
    checked, _ = visualize(plain_loops["leak"], "--baseline", str(plain_loops["healthy"]), "--baseline-threshold",
                           "5%,64MiB")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    regressed = [line for line in checked.stdout.splitlines() if "regressed: whole run (by time)" in line]
    assert {"peak", "floor", "floor growth"} == {w for line in regressed for w in ("peak", "floor", "floor growth")
                                                 if f"host RSS {w} of" in line}, checked.stdout
    checked, _ = visualize(plain_loops["healthy"], "--baseline", str(plain_loops["healthy"]))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_version_we_do_not_know_is_one_line_and_no_hook(monkeypatch, capsys):
    import types

    from miles_profile.integrations import autotag, steps
    future = types.ModuleType("lightning")
    future.__version__ = "9.0.0"
    monkeypatch.setitem(sys.modules, "lightning", future)
    monkeypatch.setattr(steps, "_warned", set())
    assert not autotag.known_version("lightning") and not autotag.known_version("lightning")
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "lightning 9.0.0 is a version miles_profile does not know" in said[0]
    assert "judges this process by time" in said[0]


# A Lightning as far as our hook sees it (lightning/pytorch/trainer/trainer.py, `Callback`, `__version__`), with a
# Trainer whose fit() runs a torch loop and calls the callbacks' batch hooks: real enough to be hooked, light
# enough to import (torch only). The program's subclass overrides fit() with a loop of its own that calls no
# callback: the Trainer subclass that overrides the hooked methods.
FAKE_LIGHTNING = {
    "lightning/__init__.py": "__version__ = {version!r}\n",
    "lightning/pytorch/__init__.py": "class Callback:\n    pass\n",
    "lightning/pytorch/trainer/__init__.py": "",
    "lightning/pytorch/trainer/trainer.py": textwrap.dedent("""
        import time, torch

        class Trainer:
            def __init__(self, steps=40):
                self.callbacks, self.steps, self.global_step, self.sanity_checking = [], steps, 0, False

            def fit(self, model):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
                for batch_idx in range(self.steps):
                    for cb in self.callbacks:
                        cb.on_train_batch_start(self, model, None, batch_idx)
                    self.step(model, optimizer)
                    for cb in self.callbacks:
                        cb.on_train_batch_end(self, model, None, None, batch_idx)

            def step(self, model, optimizer):
                model(torch.randn(8, 64)).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
                self.global_step += 1
                time.sleep(0.03)
    """),
}
FAKE_PROGRAM = textwrap.dedent("""
    import sys, torch
    from lightning.pytorch.trainer.trainer import Trainer

    class MyTrainer(Trainer):
        def fit(self, model):  # a loop of its own: Lightning's callbacks are never called
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(self.steps):
                self.step(model, optimizer)

    (MyTrainer if sys.argv[1] == "subclass" else Trainer)().fit(torch.nn.Linear(64, 64))
    print("fitted")
""")


@pytest.mark.slow
@pytest.mark.parametrize("version, kind", [("9.0.0", "plain"), ("2.6.0", "subclass")])
def test_an_unknown_lightning_or_a_subclass_with_its_own_loop_is_never_an_error(tmp_path, version, kind):
    """Bad input (issue 37): a Lightning version we don't know is one line on stderr and no callback; a Trainer
    subclass whose loop never calls the callbacks gets none to see. Either way the training runs as it would,
    and torch's optimizer step hook tags its steps (the fallback record names at the end)."""
    for name, text in FAKE_LIGHTNING.items():
        path = tmp_path / "pkgs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(version=version) if name == "lightning/__init__.py" else text)
    program = tmp_path / "fit.py"
    program.write_text(FAKE_PROGRAM)
    env = dict(python_env(), PYTHONPATH=f"{tmp_path / 'pkgs'}{os.pathsep}{python_env()['PYTHONPATH']}")
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path / "logs"),
                           "--exec", "--", sys.executable, str(program), kind],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "fitted" in done.stdout, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    warned = [line for line in done.stderr.splitlines() if "warning" in line]
    if kind == "plain":
        assert len(warned) == 1 and "lightning 9.0.0 is a version miles_profile does not know" in warned[0], warned
        assert "tagged by torch's optimizer step hook" in warned[0], warned  # what happens next, said truly
    else:
        assert warned == [], warned
    assert "steps tagged by torch optimizer step hook" in done.stderr, done.stderr
    assert set(mp.load(tmp_path / "logs").phases["name"]) == {"train"}
