"""The verdicts' confusion matrix on the workload corpus (tests/corpus/): programs on libraries nobody here
wrote, healthy and with planted defects, each recorded with `record --exec` and judged by `visualize --json`.

    PYTHONPATH=. python3 bench/verdicts.py [--device cpu|cuda] [--logs DIR] [--only NAME ...] [--json FILE]
    PYTHONPATH=. python3 bench/verdicts.py --device cuda --logs OUT --record-only   # the H200: no visualize there

With --logs, a case whose directory DIR/<case> already holds a run is judged again, not recorded again
(how logs recorded on the H200 are judged here). Prints one verdict line per case, the counts per class
and, per check, how often it failed when it should (hit), stayed silent when it should have failed
(missed), failed when it should not (false FAIL), and gave the wrong cause. Exit 0 when every case is
right, 1 otherwise, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.corpus import manifest, runner  # noqa: E402 - after the path, so `python bench/verdicts.py` works


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--logs", metavar="DIR", help="record into (or re-judge the runs already in) DIR/<case>")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="cases whose name contains any of these")
    parser.add_argument("--json", metavar="FILE", help="also write every case's verdict and the matrix as JSON")
    parser.add_argument("--record-only", action="store_true", help="record, judge nothing (the GPU machine)")
    return parser


def run_case(case, logs: Path, record_only: bool) -> dict:
    case_dir = logs / case.name
    row = {"case": case.name, "program": case.program, "defect": case.defect, "device": case.device,
           "expected_check": case.check, "expected_cause": case.cause}
    started = time.monotonic()
    try:
        existing = runner.run_dirs(case_dir)
        run_dir = existing[-1] if existing else runner.record_workload(case, case_dir)
        row["recorded_s"] = None if existing else round(time.monotonic() - started, 1)
        row["run"] = str(run_dir)
        if record_only:
            return row
        verdict = runner.judge(run_dir)
    except runner.CorpusError as exc:
        row.update(verdict={"exit_code": None, "checks": {}}, cls=runner.ERROR, line=f"{case.name}: {runner.ERROR} ({exc})")
        return row
    cls = runner.classify(case, verdict)
    row.update(verdict=verdict, cls=cls, line=runner.verdict_line(case, verdict, cls))
    return row


def per_check(rows: list[dict], cases: dict) -> dict[str, Counter]:
    """Per check: hit (failed, right cause), wrong cause, missed, false FAIL; from the judged rows."""
    table: dict[str, Counter] = {}
    for row in rows:
        case, checks = cases[row["case"]], row["verdict"]["checks"]
        if not checks:
            continue
        for name, result in checks.items():
            counts = table.setdefault(name, Counter())
            failed = result["status"] == "fail"
            if name == case.check:
                counts["hit" if failed and case.cause in result["causes"] else "wrong cause" if failed else "missed"] += 1
            elif failed:
                counts["false FAIL"] += 1
            else:
                counts["quiet"] += 1
    return table


def print_report(rows: list[dict], cases: dict) -> dict:
    classes = Counter(row["cls"] for row in rows)
    print("\nclass counts:")
    for cls in runner.CLASSES:
        print(f"  {classes.get(cls, 0):3d}  {cls}")
    checks = per_check(rows, cases)
    columns = ("hit", "wrong cause", "missed", "false FAIL", "quiet")
    print("\nper check: " + " | ".join(columns))
    for name, counts in sorted(checks.items()):
        print(f"  {name:24s} " + " | ".join(f"{counts.get(c, 0):3d}" for c in columns))
    return {"classes": {cls: classes.get(cls, 0) for cls in runner.CLASSES},
            "per_check": {name: {c: counts.get(c, 0) for c in columns} for name, counts in checks.items()}}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    chosen = manifest.cases(args.device, args.only)
    if not chosen:
        print(f"bench/verdicts.py: error: no {args.device} case matches {args.only}", file=sys.stderr)
        return 2
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="corpus_logs_"))
    if logs.exists() and not logs.is_dir():
        print(f"bench/verdicts.py: error: --logs {logs} is not a directory", file=sys.stderr)
        return 2
    print(f"corpus: {len(chosen)} {args.device} cases, logs in {logs}", flush=True)
    rows = []
    for case in chosen:
        rows.append(run_case(case, logs, args.record_only))
        done = rows[-1]
        print(done.get("line") or f"{case.name}: recorded in {done.get('recorded_s')} s -> {done.get('run')}", flush=True)
    if args.record_only:
        return 0 if all("run" in row for row in rows) else 1
    print()
    matrix = print_report(rows, {c.name: c for c in chosen})
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "logs": str(logs), "cases": rows, **matrix},
                                              indent=1, default=str))
    return 0 if all(row["cls"] in (runner.RIGHT, runner.CONSEQUENCE) for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
