"""Markdown tables of docs/transitions.md from committed logs: the transition meter and the what-if of
some runs, and the what-if checked against the configurations that kept what others offloaded.

    python scripts/transitions_tables.py meter sample_logs/h200/5-both-gpu-peak sample_logs/h200-tms/5-both-gpu-peak
    python scripts/transitions_tables.py check sample_logs/h200 sample_logs/h200-tms
    python scripts/transitions_tables.py side sample_logs/h200/5-both-gpu-peak sample_logs/h200-tms/5-both-gpu-peak \
        sample_logs/h200/6-gpu-peak-disk
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles_profile.logdir.reader import load_run  # noqa: E402
from miles_profile.runmodel.series import GiB  # noqa: E402
from miles_profile.runmodel.transitions import GB, transitions  # noqa: E402
from miles_profile.report.transitions_html import LINK_TEXT, METER_COLUMNS, meter_rows  # noqa: E402
from miles_profile.runmodel.whatif import whatif  # noqa: E402
from miles_profile.report.whatif_html import WHATIF_COLUMNS, whatif_rows  # noqa: E402

# (configuration that offloads, offloads undone, configuration that kept them): tests/unit/test_whatif.py's
PAIRS = [
    ("3-offload-rollout", ["offload_rollout"], "1-no-offload"),
    ("2-offload-train", ["offload_train"], "1-no-offload"),
    ("4-both", ["offload_rollout", "offload_train"], "1-no-offload"),
    ("4-both", ["offload_rollout"], "2-offload-train"),
    ("4-both", ["offload_train"], "3-offload-rollout"),
    ("5-both-gpu-peak", ["offload_kv", "offload_weights"], "2-offload-train"),
    ("5-both-gpu-peak", ["offload_train"], "3-offload-rollout"),
]


def _table(rows: list[dict], columns: list[tuple[str, str]]) -> list[str]:
    return (["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)] +
            ["| " + " | ".join(r[k] for k, _ in columns) + " |" for r in rows])


def meter(paths: list[str]) -> list[str]:
    out = []
    for path in paths:
        run = load_run(path)
        m, w = transitions(run), whatif(run)
        out += [f"`{path}`: {m.share:.0%} of each step in transitions.", ""]
        out += _table(meter_rows(m), METER_COLUMNS) + [""]
        out += _table(whatif_rows(w), WHATIF_COLUMNS) + [""]
    return out


def side(paths: list[str]) -> list[str]:
    """The training state's offload and onload in the loop, one row per run: backend, link, GB/s."""
    out = ["| log | backend | offload link | offload GB/s | onload link | onload GB/s | share of step |", "|" + "---|" * 7]
    for path in paths:
        m = transitions(load_run(path))
        loop = m.table[m.table["iteration"] >= 0]
        cells = []
        for phase in ("offload_train", "onload_train"):
            rows = loop[loop["phase"] == phase]
            moved = rows["measured"].where(rows["measured"] > 0, rows["declared"]).sum()
            cells += [LINK_TEXT.get(rows["link"].iloc[0], rows["link"].iloc[0]), f"{moved / rows['seconds'].sum() / GB:.2f}"]
        backend = loop[loop["phase"] == "offload_train"]["backend"].iloc[0]
        share = m.by_kind[(m.by_kind["phase"].isin(["offload_train", "onload_train"])) & ~m.by_kind["setup"]]
        out.append(f"| {path} | {backend} | {' | '.join(cells)} | {share['share_of_step'].sum():.0%} |")
    return out


def check(roots: list[str]) -> list[str]:
    out = ["| logs | offloading config | offloads undone | kept by | run peak if kept (GiB) | measured (GiB) | error "
           "| generate if kept / measured | train if kept / measured |", "|" + "---|" * 9]
    for root in roots:
        found: dict = {}
        get = lambda name: found.setdefault(name, whatif(load_run(Path(root) / name)))  # noqa: E731
        for offloading, undone, keeping in PAIRS:
            a, b = get(offloading), get(keeping)
            p, m = a.peak_if_kept(undone), b.measured_peak
            pp, mp = a.peaks_by_phase(undone), b.peaks_by_phase()
            cells = [f"{pp[n] / GiB:.2f} / {mp[n] / GiB:.2f} ({pp[n] / mp[n] - 1:+.1%})" for n in ("generate", "train")]
            out.append(f"| {Path(root).name} | {offloading} | {', '.join(undone)} | {keeping} | {p / GiB:.2f} | "
                       f"{m / GiB:.2f} | {p / m - 1:+.2%} | {cells[0]} | {cells[1]} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("meter", "check", "side"))
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    print("\n".join({"meter": meter, "check": check, "side": side}[args.what](args.paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
