"""CPU time of one whole scrape (read the files, render the exposition) with 64 processes on a host, for
an A/B of the exposition across commits on a shared machine, where wall time mostly measures the wait
for a core: this thread's CPU seconds do not. Runs on this tree (exposition.render) and on trees before
it (prometheus_client rendering families.py), so the same file measures both:

    git worktree add /tmp/old 44a96e9 && cp bench/metrics_scrape_cpu.py /tmp/old/bench/
    for k in 1 2 3; do (cd /tmp/old && python bench/metrics_scrape_cpu.py); python bench/metrics_scrape_cpu.py; done

The host is bench_metrics.py's FakeHost (rows every 100 ms, a phase every second per process).
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_metrics as b  # noqa: E402

from miles_profile.metrics.host_state import HostState  # noqa: E402



def scraper(state: HostState):
    """(which code, a function doing one whole scrape of `state`)."""
    try:
        from miles_profile.metrics.exposition import render
        return "this tree (exposition.render)", lambda: render(state.read(), True)
    except ImportError:  # a tree from before exposition.py
        from prometheus_client import CollectorRegistry, generate_latest
        from miles_profile.metrics.families import families

        class Collector:
            def collect(self):
                return families(state.read())

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Collector())
        return "prometheus_client (families.py)", lambda: generate_latest(registry)


def main() -> int:
    for interval in (15.0, 1.0):
        with tempfile.TemporaryDirectory() as tmp:
            host = b.FakeHost(Path(tmp), 64)
            which, scrape = scraper(HostState(tmp, b.HOST))
            host.advance(interval)
            scrape()  # the first scrape reads every file's header and meta
            cpu = []
            for _ in range(10):
                host.advance(interval)
                start = time.thread_time()
                scrape()
                cpu.append(time.thread_time() - start)
            print(f"{which}, 64 processes, scrape every {interval:g} s: CPU median {statistics.median(cpu) * 1e3:.2f} ms "
                  f"(min {min(cpu) * 1e3:.2f} ms) over {len(cpu)} scrapes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
