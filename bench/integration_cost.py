"""What the Trainer callback adds to a 50 ms training step, as a share of the step (the issue's bound:
at most 0.5%), measured so that a shared, loaded machine can still answer.

The benchmark runs itself under `record --exec` (the way a user's trainer runs: the recorder joins the
run in the child, without the host role, the heap read at phase boundaries, the auto-tagging hook
loaded) and calls the real `MilesProfileCallback`'s `on_step_begin`/`on_step_end` with a real
TrainerState, as transformers' Trainer calls them.

A step is a busy wait of `--step-ms` of this thread's CPU time: its cost does not depend on the machine's
load, so the CPU time a block of steps takes differs between the two arms only by what the callback (and
the recorder's sampler thread) spent. Blocks of `--block-steps` steps with the callback (B) and without
it (A) are interleaved in pairs (AB or BA, seeded at random), `--pairs` of them. Printed:

- per pair, the ratio of the process's CPU time (every thread) in B over A, minus one: the median over
  pairs, its interquartile range, and a bootstrap 95% interval of the median;
- the extra CPU per step, in microseconds (median over pairs of (B - A) / steps), and per phase;
- the hooks' own CPU time (this thread, inside the two hooks), per step and per phase;
- the same ratio on wall time, which a loaded machine does stretch (read it as context, not as the bound);
- the share at a nominal 50 ms step: the extra CPU per phase over the time one phase covers there (0.2 s:
  steps under MIN_PHASE_S share a phase). On a loaded machine a step of 50 ms of CPU takes longer than
  0.2 s of wall time, each step gets a phase of its own, and the measured ratio counts a phase per step.

    PYTHONPATH=. python bench/integration_cost.py [--pairs 60] [--block-steps 8] [--step-ms 50] [--cuda]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.under_record import rerun_under_record  # noqa: E402
from miles_profile.integrations.steps import MIN_PHASE_S  # noqa: E402

BOUND = 0.005  # the issue's: 0.5% of a 50 ms step


def busy_step(seconds: float) -> None:
    """`seconds` of this thread's CPU time, whatever else the machine runs."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def run_blocks(args) -> dict:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    import miles_profile as mp
    from miles_profile.integrations.hf import MilesProfileCallback

    if args.cuda:  # a GPU trainer's process: its boundary rows also read NVML for its GPU and torch's allocator
        import torch
        torch.zeros(1, device="cuda")
    mp.annotate(bench="integration_cost")  # starts this process's recorder: both arms run under it
    training = TrainingArguments(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    callback = MilesProfileCallback()
    step_s = args.step_ms / 1e3
    rng = random.Random(args.seed)
    pairs, hooks = [], []

    def block(with_callback: bool) -> tuple[float, float]:
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(args.block_steps):
            if with_callback:
                h0 = time.thread_time()
                callback.on_step_begin(training, state, control)
                h1 = time.thread_time()
            busy_step(step_s)
            if with_callback:
                h2 = time.thread_time()
                callback.on_step_end(training, state, control)
                state.global_step += 1
                hooks.append(h1 - h0 + time.thread_time() - h2)
        return time.process_time() - c0, time.perf_counter() - w0

    for arm in "AB":  # one block of each first: imports, first phase, caches
        block(arm == "B")
    hooks.clear()
    phases_before = callback.steps.phases
    for _ in range(args.pairs):
        order = rng.choice(["AB", "BA"])
        got = {arm: block(arm == "B") for arm in order}
        pairs.append(got)
    callback.on_train_end(training, state, control)
    return {"pairs": pairs, "hooks": hooks, "phases": callback.steps.phases - phases_before,
            "steps": len(hooks)}


def median_interval(values: list[float], seed: int) -> tuple[float, float, float]:
    """The median, and a bootstrap 95% interval of it."""
    boot = random.Random(seed)
    medians = sorted(statistics.median(boot.choices(values, k=len(values))) for _ in range(2000))
    return statistics.median(values), medians[50], medians[1949]


def report(args, got: dict) -> None:
    pairs, hooks, steps_per_block = got["pairs"], got["hooks"], args.block_steps
    cpu = [p["B"][0] / p["A"][0] - 1 for p in pairs]
    wall = [p["B"][1] / p["A"][1] - 1 for p in pairs]
    extra_us = [(p["B"][0] - p["A"][0]) / steps_per_block * 1e6 for p in pairs]
    med, low, high = median_interval(cpu, args.seed + 1)
    q1, _, q3 = statistics.quantiles(cpu, n=4)
    phases, steps = got["phases"], got["steps"]
    per_step, step_low, step_high = median_interval(extra_us, args.seed + 3)
    per_phase = steps / max(phases, 1)  # steps per phase, to turn per-step figures into per-phase ones
    print(f"{len(pairs)} pairs of blocks, {steps_per_block} busy-wait steps of {args.step_ms:g} ms CPU each; "
          f"{phases} phases for {steps} steps with the callback (steps under {MIN_PHASE_S:g} s share one)")
    print(f"CPU time, B (callback) over A, per pair: median {med:+.3%} (95% interval {low:+.3%} to {high:+.3%}; "
          f"quartiles {q1:+.3%} to {q3:+.3%})")
    print(f"extra CPU per step: median {per_step:.0f} us (95% interval {step_low:.0f} to {step_high:.0f}); "
          f"per phase {per_step * per_phase:.0f} us ({step_low * per_phase:.0f} to {step_high * per_phase:.0f})")
    # A loaded machine stretches a step of 50 ms of CPU past 0.2 s of wall time, so fewer steps share a phase
    # there than at a real 50 ms step: the phase's cost over the time a phase covers at a nominal step.
    covered = max(args.step_ms / 1e3, MIN_PHASE_S)
    nominal = [x * per_phase / 1e6 / covered for x in (per_step, step_low, step_high)]
    print(f"at a nominal {args.step_ms:g} ms step (one phase per {covered:g} s): {nominal[0]:.3%} of the step "
          f"(95% interval {nominal[1]:.3%} to {nominal[2]:.3%})")
    print(f"hooks' own CPU (this thread): median {statistics.median(hooks) * 1e6:.0f} us, mean "
          f"{statistics.mean(hooks) * 1e6:.0f} us per step; {sum(hooks) / max(phases, 1) * 1e6:.0f} us per phase")
    w_med, w_low, w_high = median_interval(wall, args.seed + 2)
    print(f"wall time, B over A, per pair: median {w_med:+.3%} (95% interval {w_low:+.3%} to {w_high:+.3%}; "
          f"stretched by the machine's load, context only)")
    for what, (lo, hi) in (("measured", (low, high)), ("nominal", (nominal[1], nominal[2]))):
        verdict = "within" if hi <= BOUND else ("over" if lo > BOUND else "not decided at")
        print(f"bound {BOUND:.1%} of the step, {what}: {verdict} it (the 95% interval against the bound)")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--block-steps", type=int, default=8)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cuda", action="store_true", help="initialise CUDA first, as a GPU trainer has")
    parser.add_argument("--in-process", action="store_true",
                        help="run here, not under record --exec (a recorder must then be active or joinable)")
    args = parser.parse_args(argv)
    if not args.in_process:
        code = rerun_under_record(__file__, "integration_cost_", argv)
        if code is not None:
            return code
    report(args, run_blocks(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
