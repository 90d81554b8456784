"""python -m miles_profile.visualize D [-o report.html] [--png F] [--trace F] [--json F] [--csv F] [--no-check]
                                     [--lanes SPEC] [--phase LIST] [--baseline OLD [--baseline-threshold 5%,256MiB]]

Writes a self-contained HTML report of the run(s) in D (a run directory, a directory of runs, or a
Miles CPU-profiler CSV), prints the check verdicts and exits 0 (all pass or n/a), 1 (a check
failed, or a phase grew over the --baseline) or 2 (bad input, a --phase that matches none of a run's phases,
a --baseline that shares nothing with the run, a malformed --baseline-threshold). The verdicts are the
engine's (verdicts/engine.py). A closed stdout (`| head`) does not change the exit code.
Several runs are compared phase by phase.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from miles_profile.errors import MilesProfileError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m miles_profile.visualize",
        description="Write an offline HTML memory report of a miles-profile log and check that every offload "
                    "dropped memory. Exit code 0: checks pass or do not apply; 1: a check failed; 2: bad input.")
    parser.add_argument("path", nargs="*", help="run directory, directory of runs (e.g. /tmp/memory_logs), "
                                                "or a Miles cpu_memory_profile.csv; the directories of one "
                                                "run (same run id, e.g. one per host) are merged")
    parser.add_argument("--compare", nargs="+", metavar="D", default=[],
                        help="more runs (or directories of runs) to compare with, phase by phase")
    parser.add_argument("-o", "--output", help="HTML file to write (default: report.html in D, or next to the CSV)")
    parser.add_argument("--png", metavar="FILE", help="also write the timeline as a PNG (kaleido + Chromium)")
    parser.add_argument("--trace", metavar="FILE",
                        help="also write a Chrome trace / Perfetto JSON (phases as slices, memory as counters)")
    parser.add_argument("--json", metavar="FILE", help="also write check results and per-phase statistics as JSON")
    parser.add_argument("--csv", metavar="FILE", help="also write the per-phase table (overall and per iteration)")
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip the checks (exit 0)")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 on a WARN too (ambiguous evidence: too few iterations, one process differing "
                             "once, a drop within noise, a run where only headroom was judged); default: exit 0")
    parser.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                        help="override a check threshold, e.g. offload_min_drop_share=80%%, leak_abs_bytes=1GiB "
                             "(sizes take units, shares a percent; see docs/checks.md)")
    parser.add_argument("--lanes", metavar="SPEC",
                        help="for a run of many processes: which GPUs (lanes) get a timeline, e.g. rank:0-7, "
                             "host:node3, worst:5, gpu:GPU-1a2b, comma-combined (default: all up to 8, else worst:8)")
    parser.add_argument("--phase", metavar="LIST",
                        help="show and judge only these phases: families offload, onload, rollout, all, or phase "
                             "names, comma-separated, e.g. offload,train,rollout (default: what record --phase "
                             "asked for, else all; see docs/checks.md)")
    parser.add_argument("--baseline", metavar="D",
                        help="a run to compare with: exit 1 when a phase's peak or floor grew by more than "
                             "--baseline-threshold on any GPU or process (docs/checks.md)")
    parser.add_argument("--baseline-threshold", metavar="SHARE,SIZE", default="5%,256MiB",
                        help="growth allowed over the baseline; a value fails only above both; the share ends "
                             "in %%, the size is bytes or a unit: 5%%,0 fails any growth over 5%% "
                             "(default: %(default)s)")
    parser.add_argument("--baseline-by", choices=["phase", "iteration"], default="phase",
                        help="compare per phase name (default) or per (iteration, phase)")
    parser.add_argument("--max-points", type=int, default=100_000,
                        help="points per figure after peak-preserving reduction (default: %(default)s)")
    return parser


def _thresholds(pairs: list[str]):
    """(Thresholds, FleetThresholds) with the NAME=VALUE overrides (a name both have sets both)."""
    # the checks import pandas: a mistyped flag or --help is answered before that second
    from miles_profile.verdicts.checks import Thresholds
    from miles_profile.verdicts.fleet_checks import FleetThresholds
    found = [Thresholds(), FleetThresholds()]
    known = list(dict.fromkeys(Thresholds.names() + FleetThresholds.names()))
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in known or not value:
            raise MilesProfileError(f"unknown threshold {pair!r}; known: {', '.join(known)}")
        for k, target in enumerate(found):
            if name not in type(target).names():
                continue
            found[k] = replace(target, **{name: _threshold_value(name, type(getattr(target, name)), value)})
    return found[0], found[1]


def _threshold_value(name: str, kind: type, value: str):
    """A size takes units as every other size flag does (`leak_abs_bytes=1GiB`), a share a percent."""
    from miles_profile.sizes import parse_share, parse_size
    try:
        if name.endswith("_bytes"):
            return kind(parse_size(value))
        if name.endswith("_share"):
            return kind(parse_share(value))
        return kind(float(value)) if kind is int else kind(value)
    except MilesProfileError as exc:
        raise MilesProfileError(f"threshold {name}: {exc}") from None
    except ValueError:
        raise MilesProfileError(f"threshold {name} needs a number, got {value!r}") from None


def _echo(line: str) -> None:
    """print, except that a reader who stopped reading (`visualize D | head`) is not an error: the rest
    of the output goes to /dev/null and the exit code stays the verdict's (0 or 1), as docs/checks.md says."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit does not fail again
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_points < 1000:  # fewer points than pixels would hide peaks: a user mistake, not a request
        parser.error(f"--max-points must be at least 1000, got {args.max_points}")
    if not args.path and not args.compare:
        parser.print_usage(sys.stderr)
        print("miles_profile.visualize: error: give a run directory (e.g. /tmp/memory_logs)", file=sys.stderr)
        return 2
    try:
        # plotly, pandas and pyarrow only once the flags are valid (usage errors answer at once)
        from miles_profile.logdir.gc_pause import gc_relaxed
        from miles_profile.logdir.side_process import allowed as side_processes
        from miles_profile.report.build import VisualizeOptions, visualize
        from miles_profile.verdicts.gate import RegressionThresholds
        thresholds, fleet_thresholds = _thresholds(args.threshold)
        options = VisualizeOptions(
            paths=[p for p in [*args.path, *args.compare] if p], output=args.output, png=args.png,
            trace=args.trace, json=args.json, csv=args.csv, check=args.check,
            thresholds=thresholds, fleet_thresholds=fleet_thresholds, max_points=args.max_points,
            lanes=args.lanes, phases=args.phase, baseline=args.baseline,
            baseline_thresholds=RegressionThresholds.parse(args.baseline_threshold),
            baseline_by_iteration=args.baseline_by == "iteration", strict=args.strict)
        with gc_relaxed(), side_processes():  # a fleet's work shared with the second core (round 7 of issue 35)
            return visualize(options, echo=_echo)
    except MilesProfileError as exc:
        print(f"miles_profile.visualize: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("miles_profile.visualize: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # never a traceback for a user: one line, the details on demand
        if os.environ.get("MILES_PROFILE_DEBUG"):
            raise
        print(f"miles_profile.visualize: error: could not report this log ({type(exc).__name__}: {exc}); "
              "set MILES_PROFILE_DEBUG=1 for the traceback", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from miles_profile.process_exit import exit_now
    exit_now(main())  # not sys.exit: pyarrow's thread pool can abort the interpreter's teardown (134)
