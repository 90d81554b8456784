"""A held-out program's cost of `record --exec`, resolved by alternation inside one run.

The program is PyTorch Lightning's own demo model (`BoringModel`) fitted by Lightning's `Trainer`: nothing of
its model or loop is written here. Run whole, with and without the recorder, its fit time moved 15-30% from
run to run on the H200 (docs/benchmarks.md), which hides a cost of 1%. So it runs once, under the real
recorder, and a Lightning callback alternates blocks of steps in quads ordered ABBA or BAAB at random
(seeded): A = the recorder process stopped (SIGSTOP), B = it running (SIGCONT). A block's time is wall time
between two synchronisations of the device, so it holds everything the job does, Lightning's Python
included. The 95% interval is a bootstrap over quads, as in bench/overhead_ab.py, whose JSON this writes
(bench/pool_ab.py pools runs). An upper bound: on resume the recorder takes the read it missed at once.

    python -m miles_profile.record --log-dir D --exec -- python bench/heldout_ab.py [--blocks 400] [--block-ms 250]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.demos.boring_classes import BoringModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine  # noqa: E402
from bench.overhead_ab import add_block_arguments, parse_block_arguments, ratio_interval  # noqa: E402

WARMUP_STEPS = 200  # CUDA context, cuDNN choices and Lightning's first-step work, before any block is timed


def recorder_pid() -> int:
    """The `record --exec` process this program runs under (its parent); a one-line error otherwise."""
    parent = os.getppid()
    try:
        cmdline = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
    except OSError:
        cmdline = []
    if b"miles_profile.record" not in cmdline:
        sys.exit("heldout_ab: run me under `python -m miles_profile.record --exec -- python bench/heldout_ab.py`")
    return parent


class Alternation(pl.Callback):
    """Times blocks of training steps, stopping the recorder in A blocks and letting it run in B blocks."""

    def __init__(self, recorder: int, blocks: int, block_ms: float, seed: int, cuda: bool, null: bool = False):
        self.recorder, self.block_ms, self.cuda, self.null = recorder, block_ms, cuda, null
        rng = random.Random(seed)
        self.order = [c for _ in range(blocks // 4) for c in ("ABBA" if rng.random() < 0.5 else "BAAB")]
        self.a, self.b = np.zeros(blocks // 4), np.zeros(blocks // 4)
        self.steps_per_block = 0
        self.block, self.steps, self.started = -1, 0, 0.0

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _set(self, running: bool) -> None:
        with contextlib.suppress(ProcessLookupError):  # the recorder gone: nothing left to pause or resume
            os.kill(self.recorder, signal.SIGCONT if running else signal.SIGSTOP)

    def on_train_batch_end(self, trainer, *args) -> None:
        self.steps += 1
        if self.block < 0:  # warm-up, then one untimed block's worth to size the blocks
            if self.steps == WARMUP_STEPS:
                self.started = self._now()
            elif self.steps == 2 * WARMUP_STEPS:
                step_s = (self._now() - self.started) / WARMUP_STEPS
                self.steps_per_block = max(1, round(self.block_ms / 1e3 / step_s))
                self._begin(0)
            return
        if self.steps < self.steps_per_block:
            return
        seconds = self._now() - self.started
        kept = self.b if self.order[self.block] == "B" else self.a
        kept[self.block // 4] += seconds / self.steps_per_block  # a step's mean, as overhead_ab keeps it
        if self.block + 1 == len(self.order):
            self._set(running=True)
            trainer.should_stop = True
            self.block += 1
        else:
            self._begin(self.block + 1)

    def _begin(self, block: int) -> None:
        self.block, self.steps = block, 0
        self._set(running=self.order[block] == "B" and not self.null)
        self.started = self._now()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/heldout_ab.py", description=__doc__.splitlines()[0])
    add_block_arguments(parser, blocks=400, block_ms=250.0, per="in all")
    parser.add_argument("--null", action="store_true", help="the recorder stopped in B blocks too: the method's noise")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    args = parse_block_arguments(parser, argv)
    alternation = Alternation(recorder_pid(), args.blocks, args.block_ms, args.seed, args.device == "cuda",
                                args.null)
    trainer = pl.Trainer(max_steps=10**9, max_epochs=-1, accelerator="gpu" if args.device == "cuda" else "cpu",
                         devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[alternation])
    try:
        trainer.fit(BoringModel())
    finally:
        alternation._set(running=True)  # never leave the recorder stopped, whatever ended the fit
    if alternation.block < len(alternation.order):
        sys.exit(f"heldout_ab: the fit ended after {alternation.block} of {len(alternation.order)} blocks")
    a, b, quads = alternation.a, alternation.b, len(alternation.a)
    ratio, lo, hi = ratio_interval(a, b, 10_000, args.seed)
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "device": args.device,
              "program": "pytorch_lightning BoringModel, Trainer.fit", "recorder": "record --exec (SIGSTOP in A)",
              "blocks": quads * 4, "steps_per_block": alternation.steps_per_block,
              "step_ms_a": round(a.sum() / (2 * quads) * 1e3, 4), "step_ms_b": round(b.sum() / (2 * quads) * 1e3, 4),
              "ratio": round(ratio, 5), "ci95": [round(lo, 5), round(hi, 5)], "timer": "perf_counter after a sync",
              "null": args.null, "quad_seconds_a": [round(x, 6) for x in a], "quad_seconds_b": [round(x, 6) for x in b]}
    what = "stopped / stopped (null)" if args.null else "running / stopped"
    print(f"heldout_ab: record --exec {what}: ratio {ratio:.4f}, 95% interval [{lo:.4f}, {hi:.4f}] over "
          f"{quads * 4} blocks of {alternation.steps_per_block} steps ({result['step_ms_a']:.3f} ms a step)",
          flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
