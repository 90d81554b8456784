"""Where the test suite's CPU time goes, by kind of Python process (a trainer rank, an engine server,
`visualize`, a corpus program, the pytest workers themselves...) and by test file.

    python bench/suite_cpu.py [pytest args]      (default: the suite as `make test` runs it)
    SUITE_CPU_KEEP=DIR python bench/suite_cpu.py ...   (also keeps the raw per-process and per-test logs,
                                                        and the scans' programs by pid, to join with `perf record -a`)

`make test` is CPU-bound on a 2-core machine: its wall time is about its CPU time over 1.5-1.6 cores, so
cutting it means cutting CPU work, and this says which. Every Python process the suite starts logs its own
CPU seconds at exit (a sitecustomize.py put first on PYTHONPATH for the run, which the tests hand on to
their children); processes killed by a signal, Chromium and other non-Python programs log nothing, so the
total logged is printed beside the suite's whole CPU time. Then every program on the machine, Python or
not, in pytest's tree or not (Chromium's renderers, Ray's daemons and workers, kernel threads), from a scan
of /proc every second, beside the machine's busy CPU seconds from /proc/stat. Per test file, then for the 25 costliest tests:
wall time, and the CPU of the worker and of the children it waited for (a browser's Chromium, started once
per worker, is not in it).
"""
from __future__ import annotations

import collections
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scratch_write_cost import busy_s  # the machine's busy CPU-seconds so far (/proc/stat)

REPO = Path(__file__).resolve().parents[1]
LOG_ENV = "SUITE_CPU_LOG"
SITECUSTOMIZE = f"""
import atexit, json, os, resource, sys

def _log_cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = json.dumps({{"pid": os.getpid(), "argv": list(getattr(sys, "orig_argv", sys.argv))[:4],
                       "cpu_s": usage.ru_utime + usage.ru_stime, "torch": "torch" in sys.modules,
                       "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]}})
    try:
        with open(os.environ["{LOG_ENV}"], "a") as log:
            log.write(line + "\\n")
    except (KeyError, OSError):
        pass

atexit.register(_log_cpu)
"""
TESTS_ENV = "SUITE_CPU_TESTS"
KEEP_ENV = "SUITE_CPU_KEEP"  # a folder: processes.jsonl and tests.jsonl are copied there
PLUGIN = f"""
import json, os, time
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0, w0, started = os.times(), time.monotonic(), time.time()
    yield
    t1, w1 = os.times(), time.monotonic()
    cpu = sum(getattr(t1, k) - getattr(t0, k) for k in ("user", "system", "children_user", "children_system"))
    with open(os.environ["{TESTS_ENV}"], "a") as log:
        log.write(json.dumps({{"test": item.nodeid, "wall_s": w1 - w0, "cpu_s": cpu, "start": started,
                              "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}}) + "\\n")
"""


def process_kind(argv: list[str]) -> str:
    """`-m trainer.train`, `engine_server`, `ddp_gloo.py`, `pytest worker`, `-c` (an inline program)..."""
    args = [a for a in argv[1:] if a not in ("-u", "-B", "-I")]
    if not args:
        return "python"
    if args[0] == "-m" and len(args) > 1:
        return f"-m {args[1]}"
    if args[0] == "-c":
        return "pytest worker" if len(args) > 1 and "exec(eval(" in args[1] else "-c (inline program)"
    return Path(args[0]).name


class MachineWatch(threading.Thread):
    """Every second, the CPU seconds of every process on the machine from /proc/<pid>/stat. A process is
    credited what it used while watched (all of it when it started after the watch); one that lived less
    than a second between two scans is missed, hence the machine's total from /proc/stat beside it."""

    TICKS = os.sysconf("SC_CLK_TCK")

    def __init__(self):
        super().__init__(name="suite_cpu-machine-watch", daemon=True)
        self.stopped = threading.Event()
        self.seen: dict[tuple[str, str], list] = {}  # (pid, start tick) -> [CPU-s at first sight, latest, kind]
        self.started_tick = float(Path("/proc/uptime").read_text().split()[0]) * self.TICKS
        self.busy_at_start = busy_s()
        self.timeline: list[tuple[float, float]] = []  # (time, the machine's busy CPU-s so far) at each scan

    def run(self) -> None:
        while True:
            self.timeline.append((time.time(), busy_s()))
            self.scan()
            if self.stopped.wait(1.0):
                self.scan()
                return

    def scan(self) -> None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                cpu_s = (int(fields[11]) + int(fields[12])) / self.TICKS
                key = (pid, fields[19])
                if key in self.seen:
                    self.seen[key][1] = cpu_s
                    continue
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                kind = program_kind([a for a in argv if a], stat[stat.index("(") + 1:stat.rindex(")")])
                first = 0.0 if int(fields[19]) >= self.started_tick else cpu_s
                self.seen[key] = [first, cpu_s, kind]
            except (OSError, IndexError, ValueError):
                pass  # a process that ended mid-read

    def report(self) -> None:
        busy = busy_s() - self.busy_at_start
        by_kind, count = collections.Counter(), collections.Counter()
        for first, last, kind in self.seen.values():
            by_kind[kind] += last - first
            count[kind] += 1
        print(f"suite_cpu: the machine was busy {busy:.0f} CPU-s (/proc/stat); its processes seen by the scans "
              f"used {sum(by_kind.values()):.0f}, by program:")
        print(f"{'CPU s':>8} {'share':>6} {'procs':>6}  program")
        for kind, cpu in by_kind.most_common(25):
            if cpu >= 0.05:
                print(f"{cpu:8.1f} {cpu / busy:6.1%} {count[kind]:6d}  {kind}")


def program_kind(argv: list[str], comm: str) -> str:
    """A Python process as process_kind names it; Chromium by process type; a Ray worker by its actor
    class; a kernel thread by its name without the CPU number (Chromium's renderers, zygote-forked, keep
    no `--type` in their command line)."""
    if not argv:
        return f"[{comm.split('/')[0].rstrip('0123456789.')}] (kernel)"
    program = Path(argv[0]).name
    if program.startswith("ray::"):
        return "Ray worker " + program.split(".")[0]
    if program.startswith("python"):
        return process_kind(argv)
    joined = " ".join(argv)  # Chromium's children rewrite their command line into one string
    if "chrom" in program or "--change-stack-guard-on-fork" in joined:
        kind = re.search(r"--type=(\S+)", joined)
        if kind:
            return f"chromium {kind.group(1)}"
        if "--renderer-client-id" in joined:
            return "chromium renderer"
        return "chromium gpu-process" if "--gpu-preferences" in joined else "chromium browser"
    return program


def main() -> int:
    pytest_args = sys.argv[1:] or ["-q", "-n", "auto", "--dist", "loadgroup"]
    with tempfile.TemporaryDirectory(prefix="suite_cpu_") as tmp:
        Path(tmp, "sitecustomize.py").write_text(SITECUSTOMIZE)
        Path(tmp, "suite_cpu_plugin.py").write_text(PLUGIN)
        log, tests_log = Path(tmp, "processes.jsonl"), Path(tmp, "tests.jsonl")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (tmp, os.environ.get("PYTHONPATH")))),
                   **{LOG_ENV: str(log), TESTS_ENV: str(tests_log)})
        watch = MachineWatch()
        watch.start()
        started = time.monotonic()
        code = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_cpu_plugin", *pytest_args], cwd=REPO,
                              env=env).returncode
        wall = time.monotonic() - started
        watch.stopped.set()
        watch.join()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        tests = [json.loads(line) for line in tests_log.read_text().splitlines()] if tests_log.exists() else []
        if os.environ.get(KEEP_ENV):  # the raw logs, for a breakdown this summary does not print
            Path(os.environ[KEEP_ENV]).mkdir(parents=True, exist_ok=True)
            for kept in (log, tests_log):
                if kept.exists():
                    shutil.copy(kept, Path(os.environ[KEEP_ENV], kept.name))
            # every process the scans saw, by pid: joins a system-wide `perf record` to the programs
            Path(os.environ[KEEP_ENV], "programs.jsonl").write_text("".join(
                json.dumps({"pid": int(pid), "kind": kind, "cpu_s": round(last - first, 2)}) + "\n"
                for (pid, _), (first, last, kind) in watch.seen.items()))
    total = children.ru_utime + children.ru_stime
    by_kind, count, with_torch = collections.Counter(), collections.Counter(), collections.Counter()
    for row in rows:
        kind = process_kind(row["argv"])
        by_kind[kind] += row["cpu_s"]
        count[kind] += 1
        with_torch[kind] += row["torch"]
    logged = sum(by_kind.values())
    print(f"suite_cpu: pytest exit {code}, wall {wall:.0f} s, CPU {total:.0f} s ({total / wall:.2f} cores busy); "
          f"{len(rows)} Python processes logged {logged:.0f} s (the rest: killed processes, Chromium, other programs)")
    print(f"{'CPU s':>8} {'share':>6} {'procs':>6} {'torch':>6}  kind")
    for kind, cpu in by_kind.most_common(25):
        print(f"{cpu:8.1f} {cpu / total:6.1%} {count[kind]:6d} {with_torch[kind]:6d}  {kind}")
    watch.report()
    print_test_files(tests, total)
    print_idle_stretches(watch.timeline, tests)
    return code


def print_idle_stretches(timeline: list[tuple[float, float]], tests: list[dict], window_s: float = 30.0) -> None:
    """Windows of the run where the machine's cores were not all busy, and the tests running then: where
    the suite waits (a cluster starting, a poll's sleep, one worker left with a long group) rather than works."""
    cores = os.cpu_count() or 1
    print(f"suite_cpu: {window_s:.0f} s windows with the machine under {cores - 0.5:.1f} of {cores} cores busy, "
          "and the tests running in them")
    print(f"{'from s':>7} {'cores':>6}  tests running")
    begin = timeline[0][0] if timeline else 0.0
    for i in range(0, len(timeline) - 1, int(window_s)):
        (t0, b0), (t1, b1) = timeline[i], timeline[min(i + int(window_s), len(timeline) - 1)]
        busy = (b1 - b0) / max(t1 - t0, 1e-9)
        if busy >= cores - 0.5:
            continue
        running = sorted({t["test"].split("[")[0].split("@")[0].rsplit("/", 1)[-1]
                          for t in tests if "start" in t and t["start"] < t1 and t["start"] + t["wall_s"] > t0})
        print(f"{t0 - begin:7.0f} {busy:6.2f}  {'; '.join(running)[:220]}")


def print_test_files(tests: list[dict], total: float) -> None:
    """The 25 test files, then the 25 tests, that cost the most CPU (with their children's), and their wall time."""
    cpu, wall, count = collections.Counter(), collections.Counter(), collections.Counter()
    for test in tests:
        name = test["test"].split("::")[0]
        cpu[name] += test["cpu_s"]
        wall[name] += test["wall_s"]
        count[name] += 1
    print(f"suite_cpu: {len(tests)} tests took {sum(wall.values()):.0f} s of the workers' wall time and "
          f"{sum(cpu.values()):.0f} s of CPU with the children they waited for")
    print(f"{'CPU s':>8} {'share':>6} {'wall s':>7} {'tests':>6}  file")
    for name, seconds in cpu.most_common(25):
        print(f"{seconds:8.1f} {seconds / total:6.1%} {wall[name]:7.1f} {count[name]:6d}  {name}")
    print(f"{'CPU s':>8} {'share':>6} {'wall s':>7}  test")
    for test in sorted(tests, key=lambda t: -t["cpu_s"])[:25]:
        print(f"{test['cpu_s']:8.1f} {test['cpu_s'] / total:6.1%} {test['wall_s']:7.1f}  {test['test']}")


if __name__ == "__main__":
    raise SystemExit(main())
