"""python -m miles_profile.record [options] -- <trainer args>   (or --exec -- <command...>)

Runs the integrated trainer in this process with the recorder on, or with --exec any program as a
child, sampled from outside; the child's own `phase()` calls land in the same run.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from miles_profile import names
from miles_profile.errors import MilesProfileError
from miles_profile.recorder import DEFAULT_INTERVAL_MS, DEFAULT_LOG_DIR, OPTIONAL_PROBES, Recorder, create_run


def positive_ms(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"interval must be positive, got {text} ms")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m miles_profile.record",
        usage="%(prog)s [options] -- <trainer args>\n       %(prog)s [options] --exec -- <command...>",
        description="Record phase-tagged GPU and host memory, with true peaks between samples, into a "
                    "new run directory under --log-dir. Without --exec, runs the integrated trainer "
                    "(python -m trainer.train --help lists its arguments) in this process.")
    parser.add_argument("--log-dir", default=DEFAULT_LOG_DIR,
                        help="directory that receives one subdirectory per run (default: %(default)s)")
    parser.add_argument("--interval-ms", type=positive_ms, default=DEFAULT_INTERVAL_MS,
                        help="sampling interval; peaks between samples are kept whatever it is "
                             "(default: %(default)s)")
    parser.add_argument("--watch-dir", action="append", default=[], metavar="DIR",
                        help="also sample the bytes in files under DIR (an offload dir); repeatable")
    parser.add_argument("--disable-probe", action="append", default=[], choices=OPTIONAL_PROBES,
                        help="leave out an optional source (its columns are absent); repeatable")
    parser.add_argument("--exec", dest="exec_child", action="store_true",
                        help="run the command after -- as a child and sample its process tree")
    return parser


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def run_trainer(args: argparse.Namespace, trainer_args: list[str]) -> int:
    try:
        from trainer.args import parse_args
        from trainer.train import main as train_main  # imports torch first, so the allocator probe sees it
    except ImportError as exc:
        raise MilesProfileError(f"the integrated trainer is not available ({exc}); use --exec") from None
    parse_args(trainer_args)  # a flag error exits 2 here, before an empty run directory is made
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # flush on the way out
    with Recorder(args.log_dir, interval_ms=args.interval_ms, watch_dirs=args.watch_dir,
                  command=sys.argv, disable=args.disable_probe) as recorder:
        print(f"miles_profile: recording to {recorder.run_dir}", file=sys.stderr, flush=True)
        try:
            code = train_main(trainer_args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return int(code or 0)


def run_child(args: argparse.Namespace, command: list[str]) -> int:
    run_dir = create_run(args.log_dir, sys.argv, args.interval_ms)
    print(f"miles_profile: recording to {run_dir}", file=sys.stderr, flush=True)
    env = dict(os.environ, **{names.RUN_DIR_ENV: str(run_dir)})
    try:
        # Own process group: a terminal's Ctrl-C reaches the child once, through us.
        child = subprocess.Popen(command, env=env, preexec_fn=os.setpgrp)
    except OSError as exc:
        raise MilesProfileError(f"cannot run {command[0]}: {exc.strerror or exc}", exit_code=127) from None
    forward = lambda signum, frame: child.send_signal(signum)  # noqa: E731
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Recorder(run_dir=run_dir, interval_ms=args.interval_ms, watch_dirs=args.watch_dir,
                      child_pid=child.pid, command=command, disable=args.disable_probe):
            code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    options, rest = split_argv(argv)
    parser = build_parser()
    args = parser.parse_args(options)
    try:
        if args.exec_child:
            if not rest:
                parser.error("--exec needs a command after --")
            code = run_child(args, rest)
        else:
            code = run_trainer(args, rest)
    except MilesProfileError as exc:
        print(f"miles_profile.record: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C while starting or stopping (the trainer handles its own)
        print("miles_profile.record: interrupted", file=sys.stderr)
        return 130
    print(f"miles_profile: log written; report it with: python -m miles_profile.visualize {args.log_dir}",
          file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
