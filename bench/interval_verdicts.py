"""Would the verdicts change at a coarser sampling interval? Re-judges recorded logs as if taken every
INTERVAL: the rows at phase boundaries are kept (the recorder reads those whatever the interval), plus
one row per INTERVAL; the dropped rows' true peaks (`*_peak`) are folded into the next kept row, as the
recorder's peak reset would have; the phase summaries written from every row are dropped, so statistics
come from the kept rows. Prints each run's exit code and any check whose status changed.

    python bench/interval_verdicts.py [--interval-ms 100] [--filter h200-tms] [ROOT=sample_logs]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd


def coarsen(run: Path, out: Path, interval_s: float, keep_summaries: bool) -> None:
    shutil.copytree(run, out)
    for events in out.glob("*.events.jsonl"):
        stem = events.name[: -len(".events.jsonl")]
        lines, boundaries = [], []
        for line in events.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                lines.append(line)
                continue
            if event.get("kind") in ("begin", "end"):
                boundaries.append(event["t"])
                if event["kind"] == "end" and not keep_summaries and isinstance(event.get("attrs"), dict):
                    event["attrs"].pop("summary", None)
            lines.append(json.dumps(event, separators=(",", ":")))
        events.write_text("\n".join(lines) + "\n")
        samples = out / f"{stem}.samples.csv"
        if samples.exists():
            _coarsen_samples(samples, np.sort(np.array(boundaries, float)), interval_s)


def _coarsen_samples(path: Path, boundaries: np.ndarray, interval_s: float) -> None:
    df = pd.read_csv(path, dtype={"phase": str}, keep_default_na=False, na_values=[""])
    t = df["t"].to_numpy(float)
    keep = np.zeros(len(df), bool)
    at = np.searchsorted(t, boundaries, side="right") - 1  # the row taken at each boundary
    keep[at[at >= 0]] = True
    last = -np.inf
    for i in range(len(df)):
        if keep[i] or t[i] >= last + interval_s:
            keep[i], last = True, t[i]
    keep[0] = keep[-1] = True
    group = np.cumsum(keep[::-1])[::-1]  # each dropped row belongs to the next kept row
    for column in (c for c in df.columns if c.endswith("_peak")):
        df[column] = df.groupby(group)[column].transform("max")
    df = df[keep].copy()
    for column in df.columns.drop(["t", "phase"]):
        df[column] = pd.to_numeric(df[column], errors="coerce").round().astype("Int64")
    df.to_csv(path, index=False, float_format="%.6f")


def verdict(run: Path) -> tuple[int, dict[str, str]]:
    out = run.with_name(run.name + ".verdict.json")
    proc = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(run), "--json", str(out),
                           "-o", str(run.with_name(run.name + ".html"))], capture_output=True, text=True)
    checks = json.loads(out.read_text())["runs"][0]["checks"]
    return proc.returncode, {check["name"]: check["status"] for check in checks}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="sample_logs", type=Path)
    parser.add_argument("--interval-ms", type=float, default=100.0)
    parser.add_argument("--filter", default="", help="only runs whose path contains this")
    parser.add_argument("--keep-summaries", action="store_true", help="keep the phase summaries (as recorded)")
    args = parser.parse_args()
    runs = sorted(m.parent for m in args.root.rglob("meta.json") if args.filter in str(m.parent))
    changed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, run in enumerate(runs):
            as_recorded, coarse = Path(tmp, f"{i}-recorded"), Path(tmp, f"{i}-coarse")
            shutil.copytree(run, as_recorded)
            coarsen(run, coarse, args.interval_ms / 1000, args.keep_summaries)
            (code_a, checks_a), (code_b, checks_b) = verdict(as_recorded), verdict(coarse)
            diff = {k: f"{checks_a.get(k)} -> {checks_b.get(k)}" for k in sorted(set(checks_a) | set(checks_b))
                    if checks_a.get(k) != checks_b.get(k)}
            changed += code_a != code_b or bool(diff)
            print(f"{str(run):55s} exit {code_a} -> {code_b}  {diff or 'same checks'}", flush=True)
    print(f"interval_verdicts: {len(runs)} runs at {args.interval_ms:g} ms, {changed} with a changed verdict")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
