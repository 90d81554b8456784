"""What `record --stacks` costs on the launch-bound loop (bench/overhead.py's), on CUDA.

1. Per step, resolved as bench/overhead_ab.py does (ABBA/BAAB quads, seeded, bootstrap over quads): a
   recorder runs throughout; A = allocation history off, B = history on (`_record_memory_history` as
   miles_profile/stacks.py turns it on, bounded by --max-entries). B/A is what each step of the one
   recorded phase costs.
2. Per run: --runs rounds, each recording three runs of --iterations iterations of three phases
   (generate, train, offload_train; --phase-steps steps each), in a rotated order: `off` (no stacks),
   `stacks` (record --stacks: the peak rule, history around one phase, its snapshot written), `history_all`
   (history on from the recorder's start to its stop, as turning it on for a whole run would). Each mode's
   run seconds over `off`'s, with a bootstrap interval over rounds; and the snapshot's own seconds and size
   (the `stacks` event).

    PYTHONPATH=. python3 bench/stacks_overhead.py [--blocks 200] [--runs 6] [--out stacks_overhead.json]

Without CUDA it says so and exits 2 (history exists only in the CUDA allocator).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine  # noqa: E402
from bench.overhead import _loop  # noqa: E402
from bench.overhead_ab import _time_block, ratio_interval  # noqa: E402
import miles_profile as mp  # noqa: E402
from miles_profile import stacks  # noqa: E402
from miles_profile.logdir.reader import load_run  # noqa: E402
from miles_profile.recorder import DEFAULT_INTERVAL_MS, Recorder  # noqa: E402

MODES = ("off", "stacks", "history_all")
PHASES = ("generate", "train", "offload_train")


def _history(on: bool, max_entries: int) -> None:
    if on:
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=max_entries)
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def per_step(step, steps: int, blocks: int, max_entries: int, seed: int, log_dir: Path) -> dict:
    dev = torch.device("cuda")
    rng = random.Random(seed)
    quads = blocks // 4
    a, b = np.zeros(quads), np.zeros(quads)
    with Recorder(log_dir, interval_ms=DEFAULT_INTERVAL_MS):
        try:
            for q in range(quads):
                for cond in ("ABBA" if rng.random() < 0.5 else "BAAB"):
                    _history(cond == "B", max_entries)
                    seconds = _time_block(step, steps, dev)
                    if cond == "B":
                        b[q] += seconds
                    else:
                        a[q] += seconds
        finally:
            _history(False, max_entries)
    ratio, lo, hi = ratio_interval(a, b, 10_000, seed)
    return {"blocks": quads * 4, "steps_per_block": steps, "step_ms_off": round(a.sum() / (2 * quads) * 1e3, 4),
            "step_ms_history": round(b.sum() / (2 * quads) * 1e3, 4), "ratio": round(ratio, 5),
            "ci95": [round(lo, 5), round(hi, 5)]}


def one_run(mode: str, step, iterations: int, phase_steps: int, max_entries: int, log_dir: Path) -> tuple[float, dict]:
    """(seconds of the run's loop, the stacks event's attrs or {})."""
    saved = {k: os.environ.pop(k, None) for k in (stacks.STACKS_ENV, stacks.MAX_ENTRIES_ENV)}
    if mode == "stacks":
        os.environ.update({stacks.STACKS_ENV: stacks.PEAK, stacks.MAX_ENTRIES_ENV: str(max_entries)})
    try:
        with Recorder(log_dir, interval_ms=DEFAULT_INTERVAL_MS) as rec:
            if mode == "history_all":
                _history(True, max_entries)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(iterations):
                for name in PHASES:
                    with mp.phase(name, rollout_id=i):
                        for _ in range(phase_steps):
                            step()
                        torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            if mode == "history_all":
                _history(False, max_entries)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
    events = load_run(rec.run_dir).events
    found = events[events["kind"] == stacks.EVENT_KIND]
    return seconds, (dict(found.iloc[0]["attrs"]) if len(found) else {})


def per_run(step, rounds: int, iterations: int, phase_steps: int, max_entries: int, seed: int, log_dir: Path) -> dict:
    seconds = {m: np.zeros(rounds) for m in MODES}
    snapshots = []
    for r in range(rounds):
        order = MODES[r % 3:] + MODES[:r % 3]  # rotated: drift hits every mode alike
        for mode in order:
            s, attrs = one_run(mode, step, iterations, phase_steps, max_entries, log_dir)
            seconds[mode][r] = s
            if mode == "stacks":
                snapshots.append(attrs)
    out = {"rounds": rounds, "iterations": iterations, "phases": list(PHASES), "phase_steps": phase_steps,
           "run_s": {m: round(float(np.median(v)), 4) for m, v in seconds.items()}}
    for mode in MODES[1:]:
        ratio, lo, hi = ratio_interval(seconds["off"], seconds[mode], 10_000, seed)
        out[f"{mode}_over_off"] = {"ratio": round(ratio, 5), "ci95": [round(lo, 5), round(hi, 5)]}
    written = [a for a in snapshots if a.get("status") == "written"]
    out["snapshot"] = {"written": len(written), "of": len(snapshots),
                       "phase": sorted({a.get("phase") for a in written}),
                       "seconds_median": round(float(np.median([a["seconds"] for a in written])), 4) if written else None,
                       "bytes_median": int(np.median([a["bytes"] for a in written])) if written else None,
                       "entries_median": int(np.median([a["entries"] for a in written])) if written else None,
                       "not_written": [a.get("reason") or a.get("error") for a in snapshots if a.get("status") != "written"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/stacks_overhead.py", description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=200, help="per-step A/B blocks, a multiple of 4 (default: %(default)s)")
    parser.add_argument("--block-ms", type=float, default=50.0)
    parser.add_argument("--runs", type=int, default=6, help="rounds of the three recorded runs (default: %(default)s)")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--phase-steps", type=int, default=20)
    parser.add_argument("--max-entries", type=int, default=stacks.DEFAULT_MAX_ENTRIES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the result as JSON")
    args = parser.parse_args(argv)
    if args.blocks < 8 or args.blocks % 4 or args.runs < 2:
        parser.error("--blocks must be a multiple of 4, at least 8; --runs at least 2")
    if not torch.cuda.is_available():
        print("bench/stacks_overhead.py: needs CUDA (allocation history exists only in the CUDA allocator)",
              file=sys.stderr)
        return 2
    step, _ = _loop(torch.device("cuda"), "launch_bound")
    for _ in range(5):
        step()
    steps = max(1, round(args.block_ms / 1e3 / max(_time_block(step, 5, torch.device("cuda")), 1e-6)))
    with tempfile.TemporaryDirectory() as tmp:
        result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "max_entries": args.max_entries,
                  "interval_ms": DEFAULT_INTERVAL_MS, "timer": "CUDA events (per step), perf_counter (per run)",
                  "per_step": per_step(step, steps, args.blocks, args.max_entries, args.seed, Path(tmp)),
                  "per_run": per_run(step, args.runs, args.iterations, args.phase_steps, args.max_entries, args.seed,
                                     Path(tmp))}
    print(json.dumps(result, indent=1))
    s, r = result["per_step"], result["per_run"]
    print(f"stacks_overhead: history on / off, per step: {s['ratio']:.4f} [{s['ci95'][0]:.4f}, {s['ci95'][1]:.4f}] "
          f"({s['step_ms_off']:.3f} ms a step)")
    for mode in MODES[1:]:
        x = r[f"{mode}_over_off"]
        print(f"stacks_overhead: {mode} / off, per run of {r['iterations']}x{len(PHASES)} phases: {x['ratio']:.4f} "
              f"[{x['ci95'][0]:.4f}, {x['ci95'][1]:.4f}]")
    print(f"stacks_overhead: snapshot {r['snapshot']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
