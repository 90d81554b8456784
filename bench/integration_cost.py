"""What the Trainer callback adds to a training step: its `on_step_begin` and `on_step_end`, timed around
a 50 ms step, as a share of the step (the issue's bound: at most 0.5%).

A recorder runs (in this process, as `record --exec` starts one in the child) and the real
`MilesProfileCallback` is called with a real TrainerState, as transformers' Trainer calls it. The step is
`--step-ms` of torch matrix products (CPU), calibrated first. Two numbers:

- direct: the time spent inside the two hooks (which open and close the step's phase: one sample each,
  the phase's begin and end rows), median and 95th percentile, over the median step; and their CPU time
  (this thread's), over the nominal step, which a loaded machine does not inflate;
- A/B: whole steps with the callback (B) against without (A), in seeded random ABBA quads, the ratio of
  mean step times with a bootstrap interval over quads: noisy on a shared machine, read it beside direct.

    PYTHONPATH=. python bench/integration_cost.py [--steps 400] [--step-ms 50]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time

import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

import miles_profile as mp
from miles_profile.integrations.hf import MilesProfileCallback
from miles_profile.integrations.steps import MIN_PHASE_S


def calibrated_step(step_ms: float):
    a = torch.randn(256, 256)

    def work(n: int) -> None:
        for _ in range(n):
            a @ a

    t = time.thread_time()  # CPU time: a shared machine's load does not stretch the calibration
    work(20)
    per = (time.thread_time() - t) / 20
    n = max(1, round(step_ms / 1e3 / per))
    return lambda: work(n)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    step = calibrated_step(args.step_ms)
    with tempfile.TemporaryDirectory() as logs, mp.Recorder(logs, interval_ms=100):
        training = TrainingArguments(output_dir=logs, report_to=[], use_cpu=True)
        state, control = TrainerState(), TrainerControl()
        callback = MilesProfileCallback()
        hooks, cpu, steps = [], [], {"A": [], "B": []}
        rng = random.Random(args.seed)
        quads = []
        for _ in range(args.steps // 4):
            order = rng.choice(["ABBA", "BAAB"])
            quad = {"A": [], "B": []}
            for arm in order:
                t0 = time.perf_counter()
                if arm == "B":
                    c0 = time.thread_time()
                    callback.on_step_begin(training, state, control)
                    c1, t1 = time.thread_time(), time.perf_counter()
                step()
                t2 = time.perf_counter()
                if arm == "B":
                    c2 = time.thread_time()
                    callback.on_step_end(training, state, control)
                    state.global_step += 1
                    hooks.append((t1 - t0) + (time.perf_counter() - t2))
                    cpu.append((c1 - c0) + (time.thread_time() - c2))
                quad[arm].append(time.perf_counter() - t0)
            quads.append(quad)
            for arm in "AB":
                steps[arm] += quad[arm]
    median_step = statistics.median(steps["A"])
    hooks.sort()
    p95 = hooks[int(0.95 * (len(hooks) - 1))]
    print(f"step (A, no callback): median {median_step * 1e3:.1f} ms over {len(steps['A'])} steps")
    print(f"callback hooks per step: mean {statistics.mean(hooks) * 1e3:.3f} ms, median "
          f"{statistics.median(hooks) * 1e3:.3f} ms, p95 {p95 * 1e3:.3f} ms "
          f"({callback.steps.phases} phases for {len(hooks)} steps: "
          f"steps under {MIN_PHASE_S:g} s share one)")
    print(f"direct ratio: {statistics.mean(hooks) / median_step:.3%} of a step (mean hooks over the median step); "
          f"bound 0.5%")
    # CPU time of the hooks (this thread only) against the nominal step: what a loaded machine cannot inflate
    share = statistics.mean(cpu) / (args.step_ms / 1e3)
    print(f"hooks' CPU time per step: mean {statistics.mean(cpu) * 1e3:.3f} ms = {share:.3%} "
          f"of a {args.step_ms:g} ms step (median {statistics.median(cpu) * 1e3:.3f} ms)")
    # Load-independent: CPU per phase opened, over the time one phase covers at a nominal step (a step, or
    # MIN_PHASE_S when steps are grouped). On a loaded machine a 50 ms step's wall time stretches, fewer
    # steps share a phase, and the measured shares above rise with the load, not with our cost.
    per_phase = sum(cpu) / max(1, callback.steps.phases)
    covered = max(args.step_ms / 1e3, MIN_PHASE_S)
    print(f"CPU per phase {per_phase * 1e3:.3f} ms; at a nominal {args.step_ms:g} ms step (one phase per "
          f"{covered:g} s): {per_phase / covered:.3%} of the step time; bound 0.5%")
    ratio = mean_ratio(quads)
    boot = random.Random(args.seed + 1)
    samples = sorted(mean_ratio([boot.choice(quads) for _ in quads]) for _ in range(2000))
    print(f"A/B ratio of mean step times: {ratio - 1:+.3%} (95% interval {samples[50] - 1:+.3%} to "
          f"{samples[1949] - 1:+.3%}) over {len(quads)} quads")
    return 0


def mean_ratio(quads) -> float:
    a = [t for q in quads for t in q["A"]]
    b = [t for q in quads for t in q["B"]]
    return (sum(b) / len(b)) / (sum(a) / len(a))


if __name__ == "__main__":
    sys.exit(main())
