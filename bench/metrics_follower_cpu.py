"""A scrape with the follower (it reads the files whenever nothing read them for `collect_interval_s`), with
the follower rendering ahead too (after the pass expected to be the last before the next scrape, and, to
weigh that prediction, after every pass), and without a follower (the endpoint before it: the scrape reads
the whole interval), side by side in one run on the same host's files, and the follower's own CPU: what a
scrape costs, and what each costs a minute.

    python bench/metrics_follower_cpu.py [--processes 64] [--phase-seconds 1 10] [--collect-interval 1]

The host is bench_metrics.py's FakeHost (rows every 100 ms, a phase every `--phase-seconds` per process),
advanced in simulated time: both HostStates read the same files and see the host's time as their clock
(the directory listed every 2 s of it, the follower's schedule). Between two scrapes the host is advanced
up to each time the follower wakes, and its wake (`HostState.follow_step`, a pass when due) is timed on
this thread's CPU clock; a scrape falls on the interval's end, after the follower's last pass (a wake
due at the same time goes to the scrape: the scrape then reads the most it can, one collect interval).
A scrape is read and rendered as the endpoint answers Debian's Prometheus 2.42 (the states that render
ahead: through the endpoint's own WSGI app, `server.metrics_app` over the state), its CPU and wall time
taken for each state in turn, the order rotating. CPU a minute: the scrapes' in 60 s, plus the
follower's in 60 s. The states' heap is frozen (gc.freeze) after their first scrape: the collector's
collections of it otherwise fall into one variant's figure or another's by chance.

`--real-seconds N` also runs the endpoint itself (`serve()`, its follower a thread) for N seconds of
real time over the same kind of host, written every 0.5 s (as the writers flush) by another process
(as the recorded processes are) and scraped over HTTP every 15 s, and reads the follower thread's own
CPU clock: the simulated figure checked in real time; once without rendering ahead, once with.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_metrics as b  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from miles_profile.metrics.host_state import COLLECT_INTERVAL_S, HostState  # noqa: E402
from miles_profile.metrics.server import collector, metrics_app  # noqa: E402


class Scraped:
    """One HostState and its own renderer (each endpoint has its own cache of families), and its scrapes'
    CPU (reading, rendering) and wall seconds."""

    def __init__(self, state: HostState):
        self.state = state
        self.render = b.renderer()[1]
        self.reads: list[float] = []
        self.renders: list[float] = []
        self.walls: list[float] = []

    def scrape(self, timed: bool = True) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        reading = self.state.read()
        read = time.thread_time()
        self.render(reading)
        if timed:
            self.renders.append(time.thread_time() - read)
            self.reads.append(read - cpu)
            self.walls.append(time.perf_counter() - wall)

    def line(self, name: str, interval: float, follower_per_s: float = 0.0) -> str:
        totals = [r + e for r, e in zip(self.reads, self.renders)]
        split = (f"(reading {statistics.median(self.reads) * 1e3:.2f}, "
                 f"rendering {statistics.median(self.renders) * 1e3:.2f})")
        return _line(name, interval, totals, self.walls, split, follower_per_s)


class Endpoint:
    """One HostState behind the endpoint's own WSGI app, its follower rendering ahead (every pass when
    `every_pass`, else after the pass expected to be the last before the next scrape), and its scrapes'
    CPU and wall seconds."""

    def __init__(self, state: HostState, every_pass: bool = False):
        self.state = state
        if every_pass:  # the prediction bypassed, to weigh it: rendering after each pass once the interval is known
            state._scrape_before_next_pass = lambda now: state._gaps_seen > 0
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector(state))
        self.app = metrics_app(registry, state)
        self.environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "",
                        "HTTP_ACCEPT": b.PROMETHEUS_ACCEPT}
        self.totals: list[float] = []
        self.walls: list[float] = []

    def scrape(self, timed: bool = True) -> None:
        served = self.state.served_ahead
        wall, cpu = time.perf_counter(), time.thread_time()
        b"".join(self.app(dict(self.environ), lambda status, headers, exc_info=None: None))
        if timed:
            self.totals.append(time.thread_time() - cpu)
            self.walls.append(time.perf_counter() - wall)
            self.served = getattr(self, "served", 0) + (self.state.served_ahead > served)

    def line(self, name: str, interval: float, follower_per_s: float = 0.0) -> str:
        split = f"({self.served} of {len(self.totals)} answered ahead)"
        return _line(name, interval, self.totals, self.walls, split, follower_per_s)


def _line(name: str, interval: float, totals: list[float], walls: list[float], split: str,
          follower_per_s: float) -> str:
    scrape = statistics.median(totals)
    per_minute = 60 / interval * scrape + 60 * follower_per_s
    follower = f"; follower {follower_per_s * 1e3:.2f} ms a second" if follower_per_s else ""
    return (f"    {name:<20} scrape CPU {scrape * 1e3:6.2f} ms {split}, max {max(totals) * 1e3:.2f}; "
            f"wall {statistics.median(walls) * 1e3:.2f} ms{follower}; CPU a minute {per_minute * 1e3:.0f} ms")


def advance_followed(host: b.FakeHost, states: list[HostState], seconds: float, cpu: list[float]) -> None:
    """Advance the host `seconds`, waking each state's follower whenever it asks; their CPU seconds on
    this thread added to `cpu`."""
    rows = round(seconds * 10)
    due = [0] * len(states)  # rows until each follower's next wake; None: stopped
    while rows:
        for k, state in enumerate(states):
            if due[k] is not None and due[k] <= 0:
                start = time.thread_time()
                wait = state.follow_step()
                cpu[k] += time.thread_time() - start
                due[k] = None if wait is None else max(1, round(wait * 10))
        step = min([rows, *(d for d in due if d is not None)])
        host.advance(step / 10)
        rows -= step
        due = [None if d is None else d - step for d in due]


def compare(processes: int, phase_s: float, interval: float, collect_s: float, scrapes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        host = b.FakeHost(Path(tmp), processes, phase_s)

        def clock() -> float:  # the host's time: exact tenths
            return host.rows / 10
        def followed() -> HostState:
            return HostState(tmp, b.HOST, collect_interval_s=collect_s, clock=clock, follower_thread=False)
        today = Scraped(HostState(tmp, b.HOST, collect_interval_s=None, clock=clock))
        reading = Scraped(followed())
        ahead = Endpoint(followed())
        every_pass = Endpoint(followed(), every_pass=True)
        endpoints = [today, reading, ahead, every_pass]
        followers = [reading.state, ahead.state, every_pass.state]
        # Longer phases need a whole cycle of them before every series is there (offloads, transitions).
        host.advance(interval if phase_s == 1 else max(interval, len(b.PHASES) * phase_s))
        for one in endpoints:
            one.scrape(timed=False)  # the first scrape reads every file's header and meta
        # The four states' heap kept out of the garbage collector's collections: a collection of the whole
        # heap (40 to 60 ms) fell into one variant's figure or another's, by chance (docs/prometheus.md).
        gc.collect()
        gc.freeze()
        cpu = [0.0] * len(followers)
        passes = reading.state.passes
        renders = [ahead.state.renders_ahead, every_pass.state.renders_ahead]
        for k in range(scrapes):
            advance_followed(host, followers, interval, cpu)
            for one in endpoints[k % 4:] + endpoints[:k % 4]:
                one.scrape()
        gc.unfreeze()
        per_s = [c / (scrapes * interval) for c in cpu]
        passes = reading.state.passes - passes
        renders = [ahead.state.renders_ahead - renders[0], every_pass.state.renders_ahead - renders[1]]
    print(f"  {processes} processes, phases of {phase_s:g} s, scrape every {interval:g} s, medians of {scrapes} "
          f"scrapes (the follower: {passes} passes, at least {collect_s:g} s apart, "
          f"{reading.state.collect_every():g} s at the end; renders ahead {renders[0]}, every pass {renders[1]}):")
    print(today.line("no follower:", interval))
    print(reading.line("follower:", interval, per_s[0]))
    print(ahead.line("+ render ahead:", interval, per_s[1]))
    print(every_pass.line("+ ahead every pass:", interval, per_s[2]), flush=True)


def _write_host(run_dir: str, processes: int, phase_s: float, backlog_s: float, ready, stop) -> None:
    """The recorded processes, in a process of their own as in a real run: the host written every 0.5 s."""
    host = b.FakeHost(Path(run_dir), processes, phase_s)
    host.advance(backlog_s)
    ready.set()
    while not stop.wait(0.5):
        host.advance(0.5)


def real_time(processes: int, phase_s: float, seconds: float, render_ahead: bool, interval: float = 15.0) -> None:
    """The endpoint as it runs: its follower's CPU a second of real time, from that thread's CPU clock,
    and the scrapes' wall time over HTTP."""
    import multiprocessing
    import threading
    import urllib.request

    from miles_profile.metrics import serve
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        ready, stop = context.Event(), context.Event()
        writer = context.Process(target=_write_host, args=(tmp, processes, phase_s, interval, ready, stop))
        writer.start()
        server = None
        try:
            ready.wait(120)
            server = serve(tmp, 0, "127.0.0.1", hostname=b.HOST, render_ahead=render_ahead)
            url = f"http://127.0.0.1:{server.port}/metrics"
            urllib.request.urlopen(url, timeout=30).read()  # the first scrape: the follower starts
            follower = next(t for t in threading.enumerate() if t.name == "miles_profile-metrics-follower")
            clock_id = time.pthread_getcpuclockid(follower.ident)
            cpu, start, passes = time.clock_gettime(clock_id), time.monotonic(), server.state.passes
            walls = []
            while time.monotonic() - start < seconds:
                time.sleep(interval)
                wall = time.perf_counter()
                urllib.request.urlopen(url, timeout=30).read()
                walls.append(time.perf_counter() - wall)
            spent, elapsed = time.clock_gettime(clock_id) - cpu, time.monotonic() - start
            passes = server.state.passes - passes
            served, renders = server.state.served_ahead, server.state.renders_ahead
        finally:
            stop.set()
            writer.join()
            if server is not None:
                server.stop()
    ahead = f"rendering ahead ({renders} renders, {served} scrapes answered with them)" if render_ahead else \
        "not rendering ahead"
    print(f"  real time, {ahead}: {processes} processes written by another process, phases of {phase_s:g} s, the "
          f"endpoint scraped over HTTP every {interval:g} s for {elapsed:.0f} s: its follower thread {passes} passes, "
          f"{spent * 1e3 / elapsed:.2f} ms of CPU a second; a scrape's wall time over HTTP (median) "
          f"{statistics.median(walls) * 1e3:.1f} ms", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--phase-seconds", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--intervals", type=float, nargs="+", default=[1.0, 15.0])
    parser.add_argument("--collect-interval", type=float, nargs="+", default=[COLLECT_INTERVAL_S])
    parser.add_argument("--scrapes", type=int, default=10)
    parser.add_argument("--real-seconds", type=float, default=0.0,
                        help="also run the endpoint this long in real time (its follower a thread)")
    args = parser.parse_args(argv)
    # How loaded this machine is: on an idle current x86 core this takes about 10 us.
    calibration = min(timeit.repeat("sum(range(1000))", number=1000, repeat=5)) / 1000
    print(f"{Path(__file__).resolve().parents[1]}: rendered by {b.renderer()[0]}; calibration: sum(range(1000)) "
          f"{calibration * 1e6:.1f} us; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for phase_s in args.phase_seconds:
        for interval in args.intervals:
            for collect_s in args.collect_interval:
                compare(args.processes, phase_s, interval, collect_s, args.scrapes)
    if args.real_seconds:
        for phase_s in args.phase_seconds:
            for render_ahead in (False, True):
                real_time(args.processes, phase_s, args.real_seconds, render_ahead)
    return 0


if __name__ == "__main__":
    sys.exit(main())
