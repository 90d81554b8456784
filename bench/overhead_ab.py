"""The recorder's step-time overhead on the launch-bound loop, resolved by many short alternations.

One recorder is started once. The loop then runs `--blocks` blocks of about `--block-ms` each, in
quads ordered ABBA or BAAB at random (seeded): A = the sampler paused, B = the sampler running. A slow
drift of the machine hits A and B alike within a quad, so the ratio of mean step times, B / A, is
known far better than from a few long rounds. Step times are CUDA-event times on a GPU, perf_counter
times on CPU. The 95% interval comes from a bootstrap over quads (resampled whole, so the pairing
that cancels drift is kept).

Pausing: the main thread holds the sampler's lock during A blocks, so the sampler thread waits
without running. It is not free of bias, and the bias is against the recorder: on resume the sampler
takes the sample it waited for at once, and NVML's 100 ms and the writer's 0.5 s schedules run on wall
time, so in short B blocks it reads NVML and flushes up to twice as often per second of B time as in a
steady run. The run counts what the sampler did during B blocks and prints it beside the steady rates,
so the ratio is read as an upper bound with its cause in view. (Starting and stopping a recorder per
block would bias the other way: a fresh recorder's first NVML read and flush come after 100 ms and
0.5 s, never inside a 50 ms block.)

    PYTHONPATH=. python3 bench/overhead_ab.py [--blocks 200] [--block-ms 50] [--out overhead_ab.json]
    PYTHONPATH=. python3 bench/overhead_ab.py --null     # A against A: the method's own noise
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import device, machine  # noqa: E402
from bench.overhead import _loop  # noqa: E402
import miles_profile as mp  # noqa: E402
from miles_profile.recorder import DEFAULT_INTERVAL_MS, Recorder  # noqa: E402


class _Pausable:
    """Pauses a running recorder's sampler thread by holding its lock (see the module docstring)."""

    def __init__(self, rec: Recorder | None):
        self._lock = rec._sampler._lock if rec is not None else None
        self.paused = False

    def set(self, running: bool) -> None:
        if self._lock is None or running != self.paused:
            return
        if running:
            self._lock.release()
        else:
            self._lock.acquire()
        self.paused = not running


def _time_block(step, steps: int, dev: torch.device) -> float:
    """Mean seconds per step over `steps` steps."""
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def warm_loop(dev: torch.device, block_ms: float):
    """The launch-bound loop, warmed up, and the number of its steps that last about `block_ms`."""
    step, _ = _loop(dev, "launch_bound")
    for _ in range(5):
        step()
    return step, max(1, round(block_ms / 1e3 / max(_time_block(step, 5, dev), 1e-6)))


def ratio_interval(a: np.ndarray, b: np.ndarray, resamples: int, seed: int) -> tuple[float, float, float]:
    """(B/A ratio of mean step times, 2.5th and 97.5th percentile of the bootstrap over quads).
    a, b: per quad, the sum of its two A (B) block means."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(resamples, len(a)))
    boot = b[idx].sum(axis=1) / a[idx].sum(axis=1)
    return float(b.sum() / a.sum()), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def measure(dev: torch.device, blocks: int, block_ms: float, interval_ms: float, null: bool, seed: int,
            log_dir: Path, seconds: float | None = None) -> dict:
    """`seconds`: stop at the first quad boundary past this many seconds of alternation (`blocks` is then an
    upper bound), so a run with a fixed time budget ends with a result however fast the machine is."""
    step, steps = warm_loop(dev, block_ms)
    rec = None if null else Recorder(log_dir, interval_ms=interval_ms).start()
    sampler = _Pausable(rec)
    rng = random.Random(seed)
    quads = blocks // 4
    a, b = np.zeros(quads), np.zeros(quads)
    on_windows: list[tuple[float, float]] = []
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        for q in range(quads):
            if deadline is not None and q >= 2 and time.monotonic() > deadline:
                quads, a, b = q, a[:q], b[:q]
                break
            for cond in ("ABBA" if rng.random() < 0.5 else "BAAB"):
                sampler.set(running=cond == "B")
                t0 = time.time()
                seconds = _time_block(step, steps, dev)
                if cond == "B":
                    b[q] += seconds
                    on_windows.append((t0, time.time()))
                else:
                    a[q] += seconds
    finally:
        sampler.set(running=True)
        if rec is not None:
            rec.stop()
    ratio, lo, hi = ratio_interval(a, b, 10_000, seed)
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "device": dev.type, "null": null,
              "interval_ms": interval_ms, "blocks": quads * 4, "steps_per_block": steps,
              "step_ms_a": round(a.sum() / (2 * quads) * 1e3, 4), "step_ms_b": round(b.sum() / (2 * quads) * 1e3, 4),
              "ratio": round(ratio, 5), "ci95": [round(lo, 5), round(hi, 5)],
              "timer": "CUDA events" if dev.type == "cuda" else "perf_counter",
              "quad_seconds_a": [round(x, 6) for x in a], "quad_seconds_b": [round(x, 6) for x in b]}
    if rec is not None:
        result["sampler_during_b"] = _sampler_work(rec.run_dir, on_windows)
    return result


def _sampler_work(run_dir: Path, windows: list[tuple[float, float]]) -> dict:
    """Rows and NVML reads the sampler wrote inside B blocks, per second of B time."""
    samples = mp.load(run_dir).samples
    t = samples["t"].to_numpy(float)
    inside = np.zeros(len(t), dtype=bool)
    for t0, t1 in windows:
        inside |= (t >= t0) & (t <= t1)
    seconds = sum(t1 - t0 for t0, t1 in windows)
    nvml = [c for c in samples.columns if c.endswith("_used")]
    reads = int(samples.loc[inside, nvml[0]].notna().sum()) if nvml else 0
    return {"b_seconds": round(seconds, 3), "samples_per_s": round(inside.sum() / seconds, 1),
            "nvml_reads_per_s": round(reads / seconds, 1) if nvml else None}


def add_block_arguments(parser: argparse.ArgumentParser, blocks: int, block_ms: float, per: str) -> None:
    """The options every alternation benchmark takes: its blocks, their length, the seed, the JSON out."""
    parser.add_argument("--blocks", type=int, default=blocks, help=f"blocks {per}, a multiple of 4 (default: %(default)s)")
    parser.add_argument("--block-ms", type=float, default=block_ms, help="length of one block (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the results as JSON")


def parse_block_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.blocks < 8 or args.blocks % 4:
        parser.error("--blocks must be a multiple of 4, at least 8")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/overhead_ab.py", description=__doc__.splitlines()[0])
    add_block_arguments(parser, blocks=200, block_ms=50.0, per="in all")
    parser.add_argument("--interval-ms", type=float, default=DEFAULT_INTERVAL_MS)
    parser.add_argument("--null", action="store_true", help="no recorder at all: A against A, the method's noise")
    parser.add_argument("--seconds", type=float, help="stop at the first quad boundary past this many seconds "
                        "of alternation (--blocks is then an upper bound): a run inside a fixed time budget")
    args = parse_block_arguments(parser, argv)
    dev = device()
    with tempfile.TemporaryDirectory() as tmp:
        r = measure(dev, args.blocks, args.block_ms, args.interval_ms, args.null, args.seed, Path(tmp), args.seconds)
    print(json.dumps({k: v for k, v in r.items() if not k.startswith("quad_")}, indent=1))
    what = "A/A (no recorder)" if args.null else f"recorder {args.interval_ms:g} ms / paused"
    print(f"overhead_ab: {what}: ratio {r['ratio']:.4f}, 95% interval [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}] "
          f"over {r['blocks']} blocks of {r['steps_per_block']} steps ({r['step_ms_a']:.3f} ms a step, {r['timer']})")
    if "sampler_during_b" in r:
        w = r["sampler_during_b"]
        print(f"overhead_ab: during B the sampler wrote {w['samples_per_s']} rows/s (steady {1e3 / args.interval_ms:g}) "
              f"and read NVML {w['nvml_reads_per_s']}/s (steady 10)")
    if args.out:
        args.out.write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
