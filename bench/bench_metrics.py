"""What the Prometheus exposition costs (issue 32, item 5): one scrape of a host with 64 recording
processes, and the job's own time with the endpoint up and nobody scraping, side by side in one run.

    python bench/bench_metrics.py [--processes 64] [--scrapes 15] [--blocks 5]

Scrape: a run directory with N processes on one host (a GPU rank's columns: RSS, its split, the
allocator on one GPU, pinned, disk), 8 GPUs in the host files and every process listed on one, all
written with the recorder's own writers. Before each scrape, every process appends what it records
between two scrapes (rows every 100 ms, a phase begin and end with its summary every second, the
host sampler's rows and process lists); the scrape is `HostState.read()` plus rendering the OpenMetrics
exposition Prometheus asks for, timed as a whole in this process (the reading apart too), and the whole
HTTP GET as another process sees it. Two scrape intervals: 15 s (Prometheus' default) and 1 s.

Job: a fixed pure-Python step in the main thread (what the GIL shares with the endpoint's threads, the
worst case: `record` runs the in-process trainer with the endpoint in the job's process), timed in
blocks that alternate: no endpoint, endpoint up and never scraped, endpoint scraped every second by
another process. The step's median per block, and each setting's median over blocks against none.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles_profile.logdir.host_writer import HostWriter, write_host_meta  # noqa: E402
from miles_profile.logdir.writer import EventWriter, SampleWriter, write_process_meta, write_run_meta  # noqa: E402
from miles_profile.metrics.server import serve  # noqa: E402

# What Debian's Prometheus 2.42 sends (scrape.go's acceptHeader): OpenMetrics 1.0 first, with no escaping
# scheme named, and gzip.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
HOST = "benchhost"
GiB = 1024**3
COLUMNS = ["rss", "rss_peak", "rss_anon", "rss_file", "rss_shmem", "gpu0_alloc", "gpu0_alloc_peak",
           "gpu0_reserved", "pinned", "disk"]
PHASES = ["generate", "offload_rollout", "train", "offload_train", "onload_train", "update_weights"]


class FakeHost:
    """N processes and one host sampler writing into `run_dir`, advanced `seconds` at a time; a phase
    every `phase_s` seconds (1 s: a stress; an RL loop's phases last tens of seconds, its offloads a few)."""

    def __init__(self, run_dir: Path, processes: int, phase_s: float = 1.0):
        self.phase_rows = max(1, int(round(phase_s / 0.1)))
        write_run_meta(run_dir, {"run_id": "bench", "command": ["bench"], "host": HOST, "pid": 1,
                                 "start_time": time.time(), "interval_ms": 100.0})
        self.uuids = [f"GPU-bench-{g:04d}" for g in range(8)]
        write_host_meta(run_dir, f"{HOST}-1", {"host": HOST, "pid": 1, "start_time": time.time(),
                                               "gpus": [{"uuid": u, "index": g, "total": 80 * GiB, "name": "bench"}
                                                        for g, u in enumerate(self.uuids)]})
        self.host = HostWriter(run_dir, f"{HOST}-1", [f"gpu_used:{u}" for u in self.uuids], flush_interval_s=1e9)
        self.procs = []
        for k in range(processes):
            pid, stem = 1000 + k, f"{HOST}-{1000 + k}"
            uuid = self.uuids[k % 8]
            write_process_meta(run_dir, stem, {"host": HOST, "pid": pid, "rank": k, "local_rank": k % 8,
                                               "world_size": processes, "role": "actor", "gpu_uuid": uuid,
                                               "cuda_devices": [{"index": 0, "uuid": uuid}]})
            self.procs.append((pid, SampleWriter(run_dir, stem, COLUMNS, flush_interval_s=1e9),
                               EventWriter(run_dir, stem), uuid))
        self.t, self.phase_id, self.iteration, self.rows = time.time(), 0, 0, 0

    def advance(self, seconds: float) -> None:
        rows = int(round(seconds / 0.1))
        for i in range(rows):
            self.t += 0.1
            new_phase = self.rows % self.phase_rows == 0  # a phase begins and ends every phase_s
            if new_phase:
                self.phase_id += 1
            phase = PHASES[self.phase_id % len(PHASES)]
            self.rows += 1
            drift = (self.rows % 4096) * 4096  # every level moves from row to row, as a real one does
            for pid, samples, events, uuid in self.procs:
                level = 20 * GiB + (pid % 7) * 2**20 + drift
                rss = 3 * GiB + drift
                samples.append(self.t, phase, [rss, rss + 8192, 2 * GiB, GiB, 0, level, level + 2**21,
                                               level + 2**24, 2**28, 0])
                if new_phase:  # a phase lasts a little longer or shorter each time: transition seconds move
                    span = (self.phase_rows - 1) * 0.1
                    events.write("begin", phase, {"rollout_id": self.phase_id // len(PHASES), "expected_bytes": GiB,
                                                  "tags": ["kv_cache"]}, t=self.t - span - (self.phase_id % 5) * 0.01,
                                 id=self.phase_id)
                    summary = {"rows": self.phase_rows, "t_first": self.t - span, "t_last": self.t,
                               "series": {c: {"peak": level, "floor": level - GiB, "first": level, "last": level - GiB}
                                          for c in ("rss", "gpu0_alloc", "gpu0_reserved")}}
                    events.write("end", phase, {"status": "ok", "summary": summary}, t=self.t, id=self.phase_id)
            self.host.append(self.t, [60 * GiB + drift] * 8, [(p[3], p[0], 21 * GiB + drift) for p in self.procs])
        for _, samples, _, _ in self.procs:
            samples.flush()
        self.host.flush()


def scrape_only_state(run_dir):
    """A HostState read at scrape time only, as before the follower (trees from before it take no
    argument): a benchmark that times one scrape's reading must not have a thread read for it."""
    from miles_profile.metrics.host_state import HostState
    try:
        return HostState(run_dir, HOST, collect_interval_s=None)
    except TypeError:
        return HostState(run_dir, HOST)


def renderer(accept: str = PROMETHEUS_ACCEPT):
    """(what renders, a function from one HostReading to the body the endpoint answers `accept` with).
    The same file runs on trees whose endpoint renders with prometheus_client (families.py) and on
    0108de6's, which rendered by hand (exposition.py), for an A/B across commits."""
    try:
        from miles_profile.metrics.exposition import render  # 0108de6
        return "exposition.py (by hand)", lambda reading: render(reading, "openmetrics" in accept.split(",")[0])
    except ImportError:
        pass
    from prometheus_client import CollectorRegistry

    from miles_profile.metrics.families import families
    reading_now: list = [None]

    class One:
        def collect(self):
            return families(reading_now[0])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())
    try:  # the endpoint's own WSGI app (since 8f25f3e: Prometheus 2.x answered by the allow-utf-8 encoder)
        from miles_profile.metrics.server import metrics_app
        app, which = metrics_app(registry), "prometheus_client (families.py, server.metrics_app)"
    except ImportError:
        from prometheus_client import make_wsgi_app
        app, which = make_wsgi_app(registry, disable_compression=True), "prometheus_client (families.py)"
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "", "HTTP_ACCEPT": accept}

    def render(reading):
        reading_now[0] = reading
        return b"".join(app(dict(environ), lambda status, headers, exc_info=None: None))
    return which, render


def scrape_cost(processes: int, scrapes: int, interval_s: float) -> tuple[list[float], list[float], list[float],
                                                                         list[float], int]:
    """(whole scrape seconds, its CPU seconds, reading seconds, HTTP GET seconds, samples) over `scrapes`
    scrapes `interval_s` apart; every other scrape is the in-process one, the rest an HTTP GET from a
    child. CPU seconds are this thread's: on a shared machine they wait for no one else's."""
    with tempfile.TemporaryDirectory() as tmp:
        host = FakeHost(Path(tmp), processes)
        # No follower: each scrape reads one whole interval (bench/metrics_scrape_cpu.py times the follower).
        server = serve(tmp, 0, "127.0.0.1", hostname=HOST, collect_interval_s=None)
        state = server.state  # one endpoint's state: each scrape, in process or over HTTP, reads one interval
        _, render = renderer()
        host.advance(interval_s)
        render(state.read())  # the first scrape reads every file's header and meta
        getter = subprocess.Popen([sys.executable, "-c", (
            "import sys, time, urllib.request\n"
            "for line in sys.stdin:\n"
            "    start = time.perf_counter()\n"
            f"    urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:{server.port}/metrics', headers="
            f"{{'Accept': {PROMETHEUS_ACCEPT!r}, 'Accept-Encoding': 'gzip'}})).read()\n"
            "    print(time.perf_counter() - start, flush=True)\n")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        times, cpus, reads, gets = [], [], [], []
        try:
            for k in range(2 * scrapes):
                host.advance(interval_s)
                if k % 2:  # the same endpoint over HTTP: what the files gained since the in-process scrape
                    getter.stdin.write("\n")
                    getter.stdin.flush()
                    gets.append(float(getter.stdout.readline()))
                    continue
                start, cpu = time.perf_counter(), time.thread_time()
                reading = state.read()
                read = time.perf_counter()
                body = render(reading)
                times.append(time.perf_counter() - start)
                cpus.append(time.thread_time() - cpu)
                reads.append(read - start)
        finally:
            getter.stdin.close()
            getter.wait()
            server.stop()
        assert b"miles_profile_process_resident_memory_peak_bytes" in body
        samples = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
        return times, cpus, reads, gets, samples


def step(n: int = 60_000) -> float:
    start = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i % 7
    return time.perf_counter() - start


def job_cost(run_dir: str, blocks: int, steps: int) -> dict[str, list[float]]:
    settings = {"no endpoint": None, "endpoint, no scraper": "idle", "endpoint, scraped every 1 s": "scraped"}
    medians: dict[str, list[float]] = {k: [] for k in settings}
    for _ in range(blocks):
        for name, mode in settings.items():
            server = serve(run_dir, 0, "127.0.0.1", hostname=HOST) if mode else None
            scraper = None
            if mode == "scraped":
                scraper = subprocess.Popen([sys.executable, "-c", (
                    "import time, urllib.request\n"
                    "while True:\n"
                    f"    urllib.request.urlopen('http://127.0.0.1:{server.port}/metrics').read(); time.sleep(1)\n")])
            try:
                time.sleep(0.3)
                medians[name].append(statistics.median(step() for _ in range(steps)))
            finally:
                if scraper is not None:
                    scraper.kill()
                    scraper.wait()
                if server is not None:
                    server.stop()
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--scrapes", type=int, default=15)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = {}
    # How loaded this machine is: on an idle current x86 core this takes about 10 us.
    calibration = min(timeit.repeat("sum(range(1000))", number=1000, repeat=5)) / 1000
    print(f"calibration: sum(range(1000)) {calibration * 1e6:.1f} us (best of 5); rendered by {renderer()[0]}")
    for interval in (15.0, 1.0):
        times, cpus, reads, gets, samples = scrape_cost(args.processes, args.scrapes, interval)
        results[f"scrape every {interval:g} s"] = times
        results[f"HTTP GET every {interval:g} s"] = gets
        print(f"scrape, {args.processes} processes, every {interval:g} s ({int(interval / 0.1)} rows each, {samples} "
              f"samples): median {statistics.median(times) * 1e3:.2f} ms (reading the files "
              f"{statistics.median(reads) * 1e3:.2f} ms, the rest rendering), "
              f"min {min(times) * 1e3:.2f} ms, max {max(times) * 1e3:.2f} ms over {len(times)} scrapes, CPU median "
              f"{statistics.median(cpus) * 1e3:.2f} ms; "
              f"HTTP GET from another process median {statistics.median(gets) * 1e3:.2f} ms", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        host = FakeHost(Path(tmp), args.processes)
        host.advance(1.0)
        medians = job_cost(tmp, args.blocks, args.steps)
    base = statistics.median(medians["no endpoint"])
    for name, values in medians.items():
        print(f"job step, {name}: median {statistics.median(values) * 1e3:.3f} ms "
              f"(ratio {statistics.median(values) / base:.4f}; blocks {', '.join(f'{v * 1e3:.3f}' for v in values)})")
    if args.json:
        print(json.dumps({"scrape_s": results, "job_step_s": medians}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
