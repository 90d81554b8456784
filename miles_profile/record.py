"""python -m miles_profile.record [options] -- <trainer args>   (or --exec -- <command...>)

Runs the integrated trainer in this process with the recorder on, or with --exec any program as a
child, sampled from outside; the child's own `phase()` calls land in the same run.

With --exec the command behaves as if run without `record`: it shares our process group (it may
read the terminal; Ctrl-C, Ctrl-\\, Ctrl-Z and a hangup reach it from the terminal directly), a
signal sent to the recorder is passed on to it, its stop stops the recorder, and its exit code (128+N
for signal N) is ours, always: a run directory deleted mid-run is said in one line, and the job's exit
code stays the job's (a scheduler that retries on failure must not rerun a job that succeeded).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys

import psutil

from miles_profile import host_sampler, names, oom, stacks
from miles_profile.cluster import launch as ray_launch
from miles_profile.cluster.detect import RayDriverWatch
from miles_profile.errors import MilesProfileError
from miles_profile.identity import RUN_ID_ENV, host_name
from miles_profile.integrations import autotag
from miles_profile.integrations.tagged_by import integrations_of, opened_phases, read_process_metas, tagging_text
from miles_profile.lifetime import child_dies_with_us
from miles_profile.logdir.cluster import hook_missing_text, read_cluster, write_cluster
from miles_profile.logdir.layout import PHASE_SELECTION_KEY, is_run_dir
from miles_profile.phase_select import parse_phases
from miles_profile.recorder import (
    DEFAULT_INTERVAL_MS, DEFAULT_LOG_DIR, OPTIONAL_PROBES, Recorder, check_interval_ms, create_run,
)


# Signals that belong to the command: sent to the recorder by a user, they are passed on. Those about
# the recorder's own faults, files and timers (SEGV, PIPE, XFSZ, PROF, ...) stay here; SIGKILL and
# SIGSTOP can't be caught. Job-control stops are mirrored instead (see `wait_forwarding`).
FORWARDED = tuple(getattr(signal, name) for name in (
    "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGWINCH",
    "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGCONT"))


def interval_ms(text: str) -> float:
    try:
        return check_interval_ms(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid interval {text!r}: a number of milliseconds") from None
    except MilesProfileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: a positive integer")
    return int(text)


def port_number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: 1 to 65535")
    return int(text)


def serve_metrics(args: argparse.Namespace, run_dir) -> object | None:
    """This host's metrics endpoint for the run (record --metrics-port), or None: never the job's problem."""
    if args.metrics_port is None or run_dir is None:
        return None
    from miles_profile.metrics import serve  # the endpoint's modules are imported only when a port is asked for
    server = serve(run_dir, args.metrics_port)
    if server is not None:
        print(f"miles_profile: metrics on http://{host_name()}:{server.port}/metrics", file=sys.stderr, flush=True)
    return server


def stop_metrics(server) -> None:
    if server is not None:
        server.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m miles_profile.record",
        usage="%(prog)s [options] -- [--nproc-per-node N] <trainer args>\n"
              "       %(prog)s [options] --exec -- <command...>",
        description="Record phase-tagged GPU and host memory, with true peaks between samples, into a "
                    "new run directory under --log-dir. Without --exec, runs the integrated trainer "
                    "(python -m trainer.train --help lists its arguments) in this process; with "
                    "--nproc-per-node N first, N data-parallel ranks under torchrun, each recording itself.")
    parser.add_argument("--log-dir", default=DEFAULT_LOG_DIR,
                        help="directory that receives one subdirectory per run (default: %(default)s)")
    parser.add_argument("--interval-ms", type=interval_ms, default=DEFAULT_INTERVAL_MS,
                        help="sampling interval, 1 to 60000: the timeline's resolution; the peaks between samples "
                             "and every phase boundary are recorded whatever it is (default: %(default)s)")
    parser.add_argument("--watch-dir", action="append", default=[], metavar="DIR",
                        help="also sample the bytes in files under DIR (an offload dir); repeatable")
    parser.add_argument("--disable-probe", action="append", default=[], choices=OPTIONAL_PROBES,
                        help="leave out an optional source (its columns are absent); repeatable")
    heap = parser.add_mutually_exclusive_group()
    heap.add_argument("--heap", action="store_true",
                      help="sample glibc's heap in use at every sample of every recorded process, not only at its "
                           "phase boundaries (the default, for offload_drop on the host): each read walks malloc's "
                           "free lists under its lock, about 0.2 ms, up to 20 ms seen; the report then judges the "
                           "trainer's host forecast against it (docs/forecast.md)")
    heap.add_argument("--no-heap", action="store_true",
                      help="never read glibc's heap, not even at phase boundaries (host offloads are then judged "
                           "on RSS alone: a fall passes, no fall is not judged)")
    parser.add_argument("--run-id", default=None, metavar="ID",
                        help="id shared by the run directories of one run on several hosts, so that "
                             "`visualize A B` merges them (default: $MILES_PROFILE_RUN_ID, else the new "
                             "directory's name); handed to child processes")
    parser.add_argument("--phase", metavar="LIST",
                        help="the phases the report and dashboard show and judge by default, e.g. "
                             "offload,train,rollout (families offload, onload, rollout, all, or phase names; "
                             "stored in the run meta; every phase is still recorded: docs/log-format.md)")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure what this machine's memory links can do (pinned and pageable host<->device "
                             "copies on CUDA, memcpy, disk write/read in the first --watch-dir, else --log-dir), once "
                             "per host (cached), into the run meta: the report's transition meter compares every "
                             "offload with it (docs/transitions.md)")
    parser.add_argument("--recalibrate", action="store_true",
                        help="--calibrate, measured again now: replaces this host's cached ceilings (a "
                             "measurement taken while the machine was busy would otherwise be kept for good)")
    parser.add_argument("--stacks", nargs="?", const=stacks.PEAK, default=None, metavar="PHASE",
                        help="CUDA only: record PyTorch's allocation history (stack traces) around ONE phase per "
                             "process, the first PHASE, or without PHASE the phase kind that held the peak so far "
                             "(from the second iteration on), and dump its snapshot beside the log; the report lists "
                             "the top allocation sites at that peak (docs/stacks.md)")
    parser.add_argument("--stacks-max-entries", type=positive_int, default=stacks.DEFAULT_MAX_ENTRIES, metavar="N",
                        help="history entries kept (the latest N allocations and frees; default: %(default)s)")
    parser.add_argument("--metrics-port", type=port_number, default=None, metavar="PORT",
                        help="serve this host's memory as OpenMetrics on http://<host>:PORT/metrics while the job "
                             "runs, for Prometheus (docs/prometheus.md). A port in use is "
                             "one warning and the job runs as before")
    parser.add_argument("--exec", dest="exec_child", action="store_true",
                        help="run the command after -- as a child and sample its process tree")
    parser.add_argument("--auto-tag", action=argparse.BooleanOptionalAction, default=True,
                        help="with --exec: make each optimizer step of a Python child a phase, with no edit to it "
                             "(transformers/TRL Trainer, Lightning, any torch optimizer, also under accelerate "
                             "launch and torchrun; docs/integrations.md) (default: on)")
    return parser


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def split_nproc(trainer_args: list[str]) -> tuple[int, list[str]] | None:
    """`--nproc-per-node N <trainer flags>` -> (N, trainer flags); None without that first flag."""
    if not trainer_args or trainer_args[0].split("=")[0] not in ("--nproc-per-node", "--nproc_per_node"):
        return None
    if "=" in trainer_args[0]:
        count, rest = trainer_args[0].split("=", 1)[1], trainer_args[1:]
    elif len(trainer_args) > 1:
        count, rest = trainer_args[1], trainer_args[2:]
    else:
        raise MilesProfileError("--nproc-per-node needs a number of ranks", exit_code=2)
    if not count.isdigit() or int(count) < 1:
        raise MilesProfileError(f"--nproc-per-node must be a positive integer, got {count!r}", exit_code=2)
    return int(count), rest


def torchrun_command(nproc: int, trainer_args: list[str]) -> list[str]:
    """torchrun (through trainer.launch: its ranks die with it, a stop is one line) running `nproc`
    ranks of the trainer as our child; each rank (and its engine process) records itself into the
    run through MILES_PROFILE_RUN_DIR."""
    return [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "trainer.train", *trainer_args]


def refuse_a_command(trainer_args: list[str]) -> None:
    """The integrated trainer takes flags only, so a first word that is not a flag (`my_job.py`,
    `python`, `torchrun`) is a program meant for --exec: say so instead of argparse's
    "unrecognized arguments"."""
    if trainer_args and not trainer_args[0].startswith("-"):
        command = " ".join(["python", *trainer_args] if trainer_args[0].endswith(".py") else trainer_args)
        raise MilesProfileError(f"`{trainer_args[0]}` is a program, not a trainer flag: add --exec "
                                f"(record --exec -- {command})")


@contextlib.contextmanager
def trainer_importable():
    """Imports of the integrated trainer: where it (or torch) is missing, one line pointing at --exec."""
    try:
        yield
    except ImportError as exc:
        raise MilesProfileError(f"the integrated trainer is not available ({exc}); use --exec") from None


def run_trainer(args: argparse.Namespace, trainer_args: list[str]) -> int:
    refuse_a_command(trainer_args)
    if any(a == "--launcher" and b == "ray" for a, b in zip(trainer_args, trainer_args[1:])):
        # a Ray driver as our child: its actors join the run through the job's runtime env (docs/ray.md)
        return run_child(args, [sys.executable, "-m", "trainer.train", *trainer_args], auto_tag=False)
    ranks = split_nproc(trainer_args)
    with trainer_importable():  # the trainer only when it runs: --exec needs neither it nor torch
        from trainer.args import check_flags
    if "--plan" not in trainer_args:  # a flag error exits 2 here, before torch loads and a run directory is made
        world_size, flags = ranks if ranks is not None else (None, trainer_args)
        check_flags(flags, world_size=world_size)
    if ranks is not None:
        from trainer.args import parse_args
        parse_args(ranks[1], world_size=ranks[0])  # what needs the machine (a CUDA device, its memory)
        return run_child(args, torchrun_command(*ranks), auto_tag=False)  # the trainer tags its own phases
    with trainer_importable():
        from trainer import gc_startup
        gc_startup.defer_collections()  # torch's import: 175,000 lasting objects (trainer/gc_startup.py)
        from trainer.args import parse_args
        from trainer.train import main as train_main  # imports torch first, so the allocator probe sees it
        gc_startup.freeze_imports()
    if "--plan" in trainer_args:  # a forecast allocates and records nothing: no run directory for it
        return train_main(trainer_args)
    parse_args(trainer_args)  # a flag error exits 2 here, before an empty run directory is made
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # flush on the way out
    recorder = start_or_warn(Recorder(args.log_dir, interval_ms=args.interval_ms, watch_dirs=args.watch_dir,
                                      command=sys.argv, disable=args.disable_probe, run_id=args.run_id,
                                      run_meta=run_meta(args)))
    metrics = serve_metrics(args, recorder.run_dir if recorder is not None else None)
    try:
        code = train_main(trainer_args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        stop_and_tell(recorder, args)
        stop_metrics(metrics)
    return int(code or 0)


def run_meta(args: argparse.Namespace) -> dict:
    """Run meta keys from our options: the phase selection, as parsed (an unknown name exits 2 in main)."""
    selection = parse_phases(args.phase)
    meta = {PHASE_SELECTION_KEY: selection.text} if selection is not None else {}
    if args.calibrate or args.recalibrate:
        meta.update(calibration_meta(args))
    return meta


def calibration_meta(args: argparse.Namespace) -> dict:
    """{CALIBRATION_KEY: this host's link ceilings} (cached per host), or {} with one warning: the job comes first."""
    from miles_profile import calibrate  # only with --calibrate: it measures links and starts slowly
    disk_dir = args.watch_dir[0] if args.watch_dir else args.log_dir
    try:
        os.makedirs(disk_dir, exist_ok=True)
        found = calibrate.for_this_host(disk_dir, refresh=args.recalibrate, warn=lambda line: print(
            f"miles_profile: warning: {line}", file=sys.stderr, flush=True))
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as exc:  # measured in a child
        print(f"miles_profile: warning: not calibrated: {exc}", file=sys.stderr, flush=True)
        return {}
    links = ", ".join(f"{k} {v / 1e9:.2f} GB/s" for k, v in found["links"].items())
    print(f"miles_profile: link ceilings{' (cached)' if found.get('cached') else ''}: {links}", file=sys.stderr,
          flush=True)
    return {calibrate.CALIBRATION_KEY: found}


def start_or_warn(recorder: Recorder) -> Recorder | None:
    """The job comes first: a run that can't be written is one warning, and the job runs unrecorded."""
    try:
        recorder.start()
    except MilesProfileError as exc:
        print(f"miles_profile: warning: not recording: {exc}; the job runs unrecorded", file=sys.stderr, flush=True)
        return None
    print(f"miles_profile: recording to {recorder.run_dir}", file=sys.stderr, flush=True)
    return recorder


def stop_and_tell(recorder: Recorder | None, args: argparse.Namespace) -> bool:
    """Stop recording and say where the log is; False when its run directory was deleted mid-run
    (the log is gone: promising a report of it would point at nothing, or at another run)."""
    if recorder is None:
        return True
    recorder.stop()
    if not is_run_dir(recorder.run_dir):
        print(f"miles_profile: the log is gone: its run directory {recorder.run_dir} was deleted during the run",
              file=sys.stderr)
        return False
    print(f"miles_profile: log written; report it with: python -m miles_profile.visualize {args.log_dir}",
          file=sys.stderr)
    return True


def run_child(args: argparse.Namespace, command: list[str], auto_tag: bool = True) -> int:
    try:
        run_dir = create_run(args.log_dir, sys.argv, args.interval_ms, args.run_id, run_meta(args))
    except MilesProfileError as exc:
        print(f"miles_profile: warning: not recording: {exc}; the job runs unrecorded", file=sys.stderr,
              flush=True)
        run_dir = None
    env = dict(os.environ, **({names.RUN_DIR_ENV: str(run_dir), names.INTERVAL_ENV: str(args.interval_ms)}
                              if run_dir else {}))
    if run_dir:
        env = autotag.child_env(env, enabled=auto_tag)
    if run_dir:  # a Ray job carries the run to its workers through its runtime env (cluster/, docs/ray.md)
        env = ray_launch.with_hook(env)
        if ray_launch.is_job_submit(command):
            command = ray_launch.submit_command(command, env)
    watched = (*FORWARDED, signal.SIGCHLD)
    host = None
    if run_dir:
        # The host role is taken before the child exists, so this process, not a child, samples the
        # host; with the signals blocked, so the sampler thread inherits the mask and never takes one.
        signal.pthread_sigmask(signal.SIG_BLOCK, watched)
        try:
            host = host_sampler.join(run_dir, prefer=True)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
    oom_counter = oom.OomCounter()
    oom_before = oom_counter.read()
    metrics = None
    if run_dir:  # its threads too are started with the signals blocked
        signal.pthread_sigmask(signal.SIG_BLOCK, watched)
        try:
            metrics = serve_metrics(args, run_dir)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
    try:
        # In our process group (no setpgrp): the command may read the terminal, and the terminal's
        # signals (Ctrl-C, Ctrl-\, hangup, Ctrl-Z) reach it directly, as without `record`.
        # It dies with us, even of SIGKILL (a killed `record` left it, torchrun's ranks and their engine
        # servers running, reparented to init); Popen runs on the main thread, which lives as long as we do.
        # (The preexec_fn only calls prctl, resolved before the fork: it takes no lock a thread may hold.)
        child = subprocess.Popen(command, env=env, preexec_fn=child_dies_with_us(signal.SIGKILL))  # noqa: PLW1509
    except OSError as exc:
        if host is not None:
            host_sampler.leave(host)
        stop_metrics(metrics)
        raise MilesProfileError(f"cannot run {command[0]}: {exc.strerror or exc}", exit_code=127) from None
    # Blocked before any recorder thread exists (threads inherit the mask), so every such signal
    # waits for `sigtimedwait` in wait_forwarding; the child was started with the mask unblocked.
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        recorder = None if run_dir is None else start_or_warn(Recorder(
            run_dir=run_dir, interval_ms=args.interval_ms, watch_dirs=args.watch_dir, child_pid=child.pid,
            command=command, disable=args.disable_probe))
        ray_watch = None if recorder is None else RayDriverWatch(child.pid).start()
        try:
            code = wait_forwarding(child)
            if ray_watch is not None:
                tell_unreached_ray(recorder.run_dir, ray_watch.stop())
            if recorder is not None:
                # How the command ended decides what a vanished descendant was (verdicts/oom.py).
                if is_run_dir(recorder.run_dir):  # deleted mid-run: stop_and_tell says so, once
                    recorder.annotate({names.COMMAND_EXIT: code})
                record_death(recorder, child.pid, code, command, oom_counter, oom_before)
                if auto_tag:
                    found = integrations_of(read_process_metas(recorder.run_dir))
                    if found or not opened_phases(recorder.run_dir):  # its own phases need no tagging
                        print(f"miles_profile: {tagging_text(found)}", file=sys.stderr, flush=True)
        finally:
            stop_and_tell(recorder, args)
            if host is not None:
                host_sampler.leave(host)
            stop_metrics(metrics)
    finally:
        while signal.sigtimedwait(watched, 0) is not None:  # what came after the child ended: not for us
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
    return 128 - code if code < 0 else code


def tell_unreached_ray(run_dir, drivers: list[int]) -> None:
    """A Ray driver ran but our hook never did: its workers' phases are lost; say so here and in the run."""
    if not drivers or read_cluster(run_dir) is not None:
        return
    print(f"miles_profile: warning: {hook_missing_text(drivers)}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        write_cluster(run_dir, {"hook_ran": False, "drivers": drivers, "nodes": []})


def record_death(recorder: Recorder, pid: int, code: int, command: list[str], counter: oom.OomCounter,
                 before: int | None) -> None:
    """A child killed by SIGKILL or the OOM killer: an `oom` event, and one line saying so."""
    after = counter.read()
    attrs = oom.exec_death(pid, code, None if before is None or after is None else after - before,
                           command=command, limit=oom.cgroup_limit(),
                           counter=str(counter.path) if counter.path else None)
    if attrs is None:
        return
    oom.write_death(recorder.event, attrs)
    how = "the OOM killer" if attrs["cause"] == oom.OOM_KILL else "SIGKILL"
    print(f"miles_profile: the command (pid {pid}) was killed by {how}; the report says what grew before",
          file=sys.stderr, flush=True)


def wait_forwarding(child: subprocess.Popen) -> int:
    """Wait for the child, passing on each signal a user sent us, and stopping when it stops.

    As sudo does: a signal the kernel raised (the terminal's, si_code > 0) already reached the child,
    which shares our process group, and one the child's own process tree sent (`kill 0`) is not
    sent back; anything else is forwarded. (A `kill` to our whole process group from outside reaches
    the child twice: directly and forwarded.) A child that stops (Ctrl-Z, SIGTTIN) stops us too,
    so the shell sees the job stopped; when we are continued, so is it."""
    watched = (*FORWARDED, signal.SIGCHLD)
    while True:
        pid, status = os.waitpid(child.pid, os.WNOHANG | os.WUNTRACED)
        if pid and os.WIFSTOPPED(status):
            os.kill(os.getpid(), signal.SIGSTOP)
            signal_child(child, signal.SIGCONT)
            continue
        if pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            return child.returncode
        info = signal.sigtimedwait(watched, 1.0)  # SIGCHLD ends the wait at once; 1 s is a fallback
        if info is not None and info.si_signo != signal.SIGCHLD and sent_by_a_user(info, child.pid):
            signal_child(child, info.si_signo)


def signal_child(child: subprocess.Popen, signum: int) -> None:
    # Not Popen.send_signal: its poll() would reap the child behind wait_forwarding's back. The pid
    # can't be reused before we reap it.
    try:
        os.kill(child.pid, signum)
    except ProcessLookupError:
        pass


def sent_by_a_user(info, child_pid: int) -> bool:
    if info.si_code > 0:  # SI_KERNEL: the terminal signalled our whole (shared) process group
        return False
    try:  # the child's own tree signalling its group (`kill 0`) also reached the child: not sent back
        sender = psutil.Process(info.si_pid)
        return child_pid not in (sender.pid, *(p.pid for p in sender.parents()))
    except psutil.Error:  # the sender is gone already: forward rather than lose it
        return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    options, rest = split_argv(argv)
    parser = build_parser()
    args = parser.parse_args(options)
    try:
        parse_phases(args.phase)  # a bad --phase is one line and exit 2, before anything runs
    except MilesProfileError as exc:
        print(f"miles_profile.record: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.run_id:
        os.environ[RUN_ID_ENV] = args.run_id  # children that start runs of their own (other launches) agree
    if args.heap or args.no_heap:  # every recorder of the run, in this process or a child, follows it
        os.environ[names.HEAP_ENV] = "1" if args.heap else "0"
    if args.metrics_port is not None:  # a per-node sampler the job starts elsewhere (Ray) serves on the same port
        os.environ[names.METRICS_PORT_ENV] = str(args.metrics_port)
    if args.stacks:  # likewise: each recording process (not the outside sampler) records its own stacks
        os.environ[stacks.STACKS_ENV] = args.stacks
        os.environ[stacks.MAX_ENTRIES_ENV] = str(args.stacks_max_entries)
    try:
        if args.exec_child:
            if not rest:
                parser.error("--exec needs a command after --")
            code = run_child(args, rest, auto_tag=args.auto_tag)
        else:
            code = run_trainer(args, rest)
    except MilesProfileError as exc:
        print(f"miles_profile.record: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C while starting or stopping (the trainer handles its own)
        print("miles_profile.record: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
