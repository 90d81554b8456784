"""The forecast table of docs/forecast.md: forecast beside measured per phase for recorded runs.

    PYTHONPATH=. python scripts/forecast_table.py [RUN_DIR ...]
        (default: sample_logs/h200/*, sample_logs/h200-tms/*, sample_logs/cpu)

A run that stored its plan (the `forecast` annotation) is compared with it; an older run with the plan
of the trainer flags in its command line (trainer.plan_cli.plan_for_run). Prints markdown; the last
line is the worst judged error over all runs.
"""
from __future__ import annotations

import glob
import sys

import miles_profile as mp
from miles_profile.report.forecast import compare, stored_plan, worst
from trainer.plan_cli import plan_for_run

GiB = 1024**3
DEFAULT = sorted(glob.glob("sample_logs/h200/[1-9]-*")) + sorted(glob.glob("sample_logs/h200-tms/*")) + ["sample_logs/cpu"]


def table(path: str) -> tuple[list[str], float | None]:
    run = mp.load(path)
    found = stored_plan(run)
    source = "stored plan" if found else "plan of the command line"
    found = found or plan_for_run(run)
    if found is None:
        return [f"### {path}", "", "no trainer flags in its command line", ""], None
    pids, plan = found
    c = compare(run, plan, pids)
    command = run.meta.get("command", [])
    flags = " ".join(command[command.index("--") + 1:]) if "--" in command else ""
    lines = [f"### {path}", "", f"`{flags}` ({source}; device {plan['device']})", "",
             "| phase | device | basis | forecast GiB | measured GiB | error |", "|---|---|---|---:|---:|---:|"]
    for r in c.to_dict("records"):
        err = "–" if r["error"] != r["error"] else f"{r['error']:+.1%}" + ("" if r["judged"] else " (not judged)")
        mark = " **outside 5%**" if r["outside"] else ""
        where = r["device"] if r["process"] == "trainer" else f"{r['device']} ({r['process']})"
        lines.append(f"| {r['phase']} | {where} | {r['basis']} | {r['forecast'] / GiB:.3f} | "
                     f"{r['measured'] / GiB:.3f} | {err}{mark} |")
    w = worst(c)
    lines += ["", f"worst judged error: {w['phase']} on {w['device']} ({w['process']}) {w['error']:+.1%}"
              if w is not None else "", ""]
    return lines, None if w is None else float(w["error"])


def main(argv: list[str]) -> int:
    errors = []
    for path in argv or DEFAULT:
        lines, err = table(path)
        print("\n".join(lines))
        if err is not None:
            errors.append((abs(err), err, path))
    if errors:
        _, err, path = max(errors)
        print(f"worst judged error over all runs: {err:+.1%} ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
