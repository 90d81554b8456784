"""record --stacks on CUDA (skipped without it): a real allocation history around one phase, its snapshot
beside the log, and the planted allocation found at its file:line in the report's sites at the peak.

Runs under pytest, or as a script on a machine without pytest (scripts/h200_stacks.sh):
    python3 tests/integration/test_stacks_cuda.py
"""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import tempfile
import textwrap
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from miles_profile import Recorder, phase  # noqa: E402
from miles_profile.logdir.reader import load_run  # noqa: E402
from miles_profile.runmodel.stacks import stacks_of  # noqa: E402

try:
    import pytest
    gpu = pytest.mark.gpu
    needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
except ImportError:  # as a script
    gpu = needs_cuda = (lambda fn: fn)

MiB = 1024 ** 2
PLANTED = 96 * MiB  # far above anything else the phases hold


def plant() -> torch.Tensor:
    return torch.empty(PLANTED, dtype=torch.uint8, device="cuda")  # the planted allocation site


PLANTED_LINE = inspect.getsourcelines(plant)[1] + 1


@gpu
@needs_cuda
def test_peak_rule_records_the_second_train_and_finds_the_planted_site():
    torch.zeros(1, device="cuda")  # CUDA initialised before the recorder: its allocator probe reads it
    with tempfile.TemporaryDirectory() as tmp:
        with Recorder(tmp, interval_ms=5, stacks="peak", stacks_max_entries=20_000) as rec:
            for i in range(3):
                with phase("generate", rollout_id=i):
                    small = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
                    del small
                with phase("train", rollout_id=i):
                    big = plant()
                    work = big[: 8 * MiB].float()  # more allocations around it, freed before the end
                    del big, work
        run = load_run(rec.run_dir)
        (found,) = stacks_of(run)
        assert (found.status, found.rule, found.phase, found.iteration) == ("written", "peak", "train", 1), found
        assert len(list(Path(rec.run_dir).glob("*.stacks.pickle"))) == 1
        dev = found.top
        top = dev.sites[0]
        assert top.file.endswith("test_stacks_cuda.py") and top.line == PLANTED_LINE, top
        assert top.bytes == PLANTED and top.count == 1 and top.function == "plant", top
        assert dev.peak_bytes >= PLANTED and not dev.truncated
        assert found.recorded_peak is not None and found.recorded_peak >= PLANTED
        print(f"  snapshot {found.path}: {dev.entries} entries, peak {dev.peak_bytes / MiB:.1f} MiB, "
              f"top site {top.site} {top.bytes / MiB:.1f} MiB")
        after = torch.empty(MiB, dtype=torch.uint8, device="cuda")  # history is off again: no stack for it
        blocks = [b for s in torch.cuda.memory._snapshot()["segments"] for b in s["blocks"]
                  if b.get("address") == after.data_ptr()]
        assert blocks and not blocks[0].get("frames"), blocks


PROGRAM = textwrap.dedent("""
    import torch
    import miles_profile as mp
    torch.zeros(1, device="cuda")
    keep = []
    for i in range(2):
        with mp.phase("generate", rollout_id=i):
            pass
        with mp.phase("offload_train", rollout_id=i):
            keep.append(torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))  # PLANTED
""")


@gpu
@needs_cuda
def test_record_stacks_named_phase_exec(tmp_path=None):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp_path or tmp)
        program = tmp / "job.py"
        program.write_text(PROGRAM)
        line = next(k for k, text in enumerate(PROGRAM.splitlines(), 1) if "# PLANTED" in text)
        repo = Path(__file__).resolve().parents[2]
        env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp / "logs"),
                               "--stacks", "offload_train", "--exec", "--", sys.executable, str(program)],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        run = load_run(next((tmp / "logs").glob("run-*")))
        (found,) = stacks_of(run)
        assert (found.status, found.rule, found.iteration) == ("written", "named", 0), found
        top = found.top.sites[0]
        assert top.site == f"{program}:{line}" and top.bytes == 32 * MiB, top


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        sys.exit(0)
    failed = 0
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"PASS {name}", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
    sys.exit(1 if failed else 0)
