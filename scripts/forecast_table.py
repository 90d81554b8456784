"""The forecast table of docs/forecast.md: forecast beside measured per phase for recorded runs.

    PYTHONPATH=. python scripts/forecast_table.py [--cpu-count N] [RUN_DIR ...]
        (default: the runs of sample_logs/h200 and sample_logs/h200-tms, and sample_logs/cpu)

A run that stored its plan (the `forecast` annotation) is compared with it; an older run with the plan
of the trainer flags in its command line (miles_profile.runmodel.replan.plan_for_run). Prints markdown; the last
lines are the worst error per basis over all runs. `--cpu-count`: the cores of the machine that
recorded them, for the disk offload's staging buffers (logs do not record it; default: this machine's).
"""
from __future__ import annotations

import argparse
import glob
import sys

import pandas as pd

import miles_profile as mp
from miles_profile.runmodel.forecast import compare, stored_plan, worst
from miles_profile.runmodel.replan import plan_for_run

GiB = 1024**3
DEFAULT = sorted(glob.glob("sample_logs/h200/[1-9]-*")) + sorted(glob.glob("sample_logs/h200-tms/[1-9]-*")) + ["sample_logs/cpu"]


def table(path: str, cpu_count: int | None = None) -> tuple[list[str], pd.DataFrame | None]:
    run = mp.load(path)
    found = stored_plan(run)
    source = "stored plan" if found else "plan of the command line"
    found = found or plan_for_run(run, cpu_count)
    if found is None:
        return [f"### {path}", "", "no trainer flags in its command line", ""], None
    pids, plan = found
    c = compare(run, plan, pids)
    command = run.meta.get("command", [])
    flags = " ".join(command[command.index("--") + 1:]) if "--" in command else ""
    lines = [f"### {path}", "", f"`{flags}` ({source}; {plan['device']})", "",
             "| process | phase | forecast GiB | measured GiB | error | host forecast GiB | host measured GiB | host error |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (process, phase), rows in c.groupby(["process", "phase"], sort=False):
        cells = []
        for device in ("cuda", "host"):
            r = rows[rows["device"] == device]
            if r.empty:
                cells += ["–", "–", "–"]
                continue
            r = r.iloc[0]
            err = "–" if r["error"] != r["error"] else f"{r['error']:+.1%}"
            err += " **outside 5%**" if r["outside"] else ("" if r["judged"] else " (shown)")
            measured = f"{r['measured'] / GiB:.3f}" + (f" ({r['basis']})" if device == "host" else "")
            cells += [f"{r['forecast'] / GiB:.3f}", measured, err]
        lines.append(f"| {process} | {phase} | " + " | ".join(cells) + " |")
    w = worst(c)
    lines += ["", f"worst judged error: {w['phase']} on {w['device']} ({w['process']}) {w['error']:+.1%}"
              if w is not None else "", ""]
    return lines, c.assign(run=path)


def summary(comparisons: list[pd.DataFrame]) -> list[str]:
    lines = ["| run | phases judged | worst error | outside 5% |", "|---|---:|---:|---:|"]
    for c in comparisons:
        judged = c[c["judged"] & c["error"].notna()]
        w = worst(c)
        text = "–" if w is None else (f"{w['error']:+.2%} ({w['phase']}{'' if w['device'] == 'cuda' else ' on host'}"
                                       f"{'' if w['process'] == 'trainer' else ', engine'})")
        lines.append(f"| {c['run'].iloc[0]} | {len(judged)} | {text} | {int(judged['outside'].sum())} |")
    return lines + [""]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/forecast_table.py")
    parser.add_argument("--cpu-count", type=int)
    parser.add_argument("runs", nargs="*")
    options = parser.parse_args(argv)
    comparisons, sections = [], []
    for path in options.runs or DEFAULT:
        lines, comparison = table(path, options.cpu_count)
        sections += lines
        if comparison is not None:
            comparisons.append(comparison)
    print("\n".join(summary(comparisons) + sections))
    if comparisons:
        every = pd.concat(comparisons, ignore_index=True)
        for basis, label in (("allocator", "CUDA allocator peaks"), ("heap", "glibc's heap in use (record --heap)")):
            rows = every[(every["basis"] == basis) & every["judged"] & every["error"].notna()]
            if not rows.empty:
                w = rows.loc[rows["error"].abs().idxmax()]
                print(f"worst error over {label} ({len(rows)} phases): {w['error']:+.1%} "
                      f"({w['run']}, {w['phase']} on {w['device']}, {w['process']}); "
                      f"{int(rows['outside'].sum())} outside 5%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
