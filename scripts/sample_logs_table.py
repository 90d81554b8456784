"""The README's table of the H200 configurations, read from their logs (never typed by hand).

    python scripts/sample_logs_table.py sample_logs/h200                  # print markdown
    python scripts/sample_logs_table.py sample_logs/h200 sample_logs/h200-tms --update README.md

Per configuration (and, with several log directories, per directory side by side: the memory
backend): device peaks (NVML used, allocator true peak), host RSS peak, seconds per rollout, check
verdicts; then each phase's allocator peak per configuration of the first directory; then what
colocation bought.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import miles_profile as mp  # noqa: E402
from miles_profile.logdir import find_runs  # noqa: E402
from miles_profile.names import GENERATE, PHASES, TRAIN  # noqa: E402
from miles_profile.verdicts.checks import run_checks  # noqa: E402

GiB = 1024 ** 3
START, END = "<!-- h200-table:start -->", "<!-- h200-table:end -->"


def gib(value: float) -> str:
    return f"{value / GiB:.2f}" if np.isfinite(value) else "–"


def peak(samples, column: str) -> float:
    return float(samples[column].max()) if column in samples and samples[column].notna().any() else float("nan")


def seconds_per_rollout(run) -> float:
    p = run.phases.dropna(subset=["rollout_id"]) if "rollout_id" in run.phases else run.phases.iloc[:0]
    spans = p.groupby("rollout_id").agg(start=("start", "min"), end=("end", "max"))
    return float((spans["end"] - spans["start"]).mean()) if len(spans) else float("nan")


def phase_peaks(run) -> dict[str, float]:
    s = run.samples
    column = "gpu0_alloc_peak" if "gpu0_alloc_peak" in s else "rss_peak"
    return s.groupby("phase", observed=True)[column].max().to_dict()


def verdicts(run) -> str:
    results = run_checks(run)
    passed = sum(r.status == "pass" for r in results)
    failed = [r.name for r in results if r.status == "fail"]
    return f"{passed} pass" + (f", **fail: {', '.join(failed)}**" if failed else ", 0 fail")


def tables(roots: list[Path]) -> str:
    sets = [(root.name, [(p.name, mp.load(p)) for p in sorted(find_runs(root), key=lambda p: p.name)])
            for root in roots]
    runs = sets[0][1]
    lines = ["| configuration | logs | NVML used peak (GiB) | allocator peak (GiB) | host RSS peak (GiB) | s / rollout | checks |",
             "|---|---|---|---|---|---|---|"]
    rows = sorted(((name, i, label, run) for i, (label, set_runs) in enumerate(sets) for name, run in set_runs),
                  key=lambda row: row[:2])  # each configuration's directories side by side
    for name, _, label, run in rows:
        s = run.samples
        lines.append(f"| {name} | {label} | {gib(peak(s, 'gpu0_used'))} | {gib(peak(s, 'gpu0_alloc_peak'))} | "
                     f"{gib(peak(s, 'rss_peak'))} | {seconds_per_rollout(run):.2f} | {verdicts(run)} |")
    peaks = {name: phase_peaks(run) for name, run in runs}
    shown = [p for p in PHASES if any(p in v for v in peaks.values())]
    lines += ["", f"Allocator true peak per phase (GiB), {sets[0][0]}:", "",
              "| phase | " + " | ".join(name for name, _ in runs) + " |", "|---|" + "---|" * len(runs)]
    for phase in shown:
        lines.append(f"| {phase} | " + " | ".join(gib(peaks[name].get(phase, np.nan)) for name, _ in runs) + " |")
    lines += ["", colocation(runs)]
    return "\n".join(lines)


def colocation(runs) -> str:
    by_name = dict(runs)
    colocated = next((r for n, r in runs if "gpu-peak" in n and "disk" not in n and "optimizer" not in n), None)
    plain = next((r for n, r in runs if "no-offload" in n), None)
    if colocated is None or plain is None:
        return ""
    p = phase_peaks(colocated)
    alone = max(p[GENERATE], p[TRAIN])
    floor = float(colocated.samples["gpu0_alloc"].min())
    colocated_peak = peak(colocated.samples, "gpu0_alloc_peak")
    plain_peak = peak(plain.samples, "gpu0_alloc_peak")
    both = p[GENERATE] + p[TRAIN] - floor
    del by_name
    return (f"What colocation bought (allocator true peaks): generate alone {gib(p[GENERATE])} GiB, train alone "
            f"{gib(p[TRAIN])} GiB. With `--colocate-memory-peak-device gpu` the device peak is {gib(colocated_peak)} "
            f"GiB = **{colocated_peak / alone:.3f} x the larger** (target ≤ 1.05); without offload it is "
            f"{gib(plain_peak)} GiB = **{plain_peak / both:.3f} x their sum** (less the {gib(floor)} GiB floor they share).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", type=Path, nargs="+", help="directories of configurations (several: side by side)")
    parser.add_argument("--update", type=Path, metavar="README", help=f"replace the block between {START} and {END}")
    args = parser.parse_args(argv)
    text = tables(args.logs)
    if args.update is None:
        print(text)
        return 0
    readme = args.update.read_text()
    if START not in readme or END not in readme:
        print(f"error: {args.update} has no {START} ... {END} block", file=sys.stderr)
        return 2
    block = f"{START}\n{text}\n{END}"
    args.update.write_text(re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, readme, flags=re.S))
    print(f"updated {args.update}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
