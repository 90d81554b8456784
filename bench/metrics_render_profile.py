"""Where a scrape's rendering time goes with prometheus_client (issue 32 round 2b): building our metric
families (families.py) against prometheus_client's encoders, for each format a scraper can ask for, and
profiles of the OpenMetrics encoder as Debian's Prometheus 2.42 asks (no escaping scheme named, so
prometheus_client's default `underscores`) and as the endpoint answers it since round 3 (`allow-utf-8`,
server.metrics_app: the same bytes). Interleaved, this thread's CPU seconds.

    python bench/metrics_render_profile.py [--repeat 9]

One HostReading of bench_metrics.py's FakeHost (64 processes): the tenth scrape, 1 s and 15 s apart.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_metrics as b  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402
from prometheus_client.exposition import choose_encoder  # noqa: E402

from miles_profile.metrics.families import families  # noqa: E402

ACCEPTS = {
    "OpenMetrics, Prometheus 2.42's Accept (escaping underscores)": b.PROMETHEUS_ACCEPT,
    "OpenMetrics, escaping=allow-utf-8 asked": "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
    "text 0.0.4 (curl, no Accept)": "",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args(argv)
    for interval in (1.0, 15.0):
        with tempfile.TemporaryDirectory() as tmp:
            host = b.FakeHost(Path(tmp), 64)
            state = b.scrape_only_state(tmp)
            for _ in range(10):  # as after bench_metrics.py's scrapes: every offload and transition seen
                host.advance(interval)
                reading = state.read()

        class One:
            def collect(self):
                return families(reading)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(One())
        built = list(families(reading))
        samples = sum(len(f.samples) for f in built)

        class Built:  # the families already built: the encoder alone
            def collect(self):
                return built
        encoded = CollectorRegistry(auto_describe=False)
        encoded.register(Built())
        cases = {"building the families (families.py)": lambda: list(families(reading))}
        for name, accept in ACCEPTS.items():
            cases[f"encoding: {name}"] = (lambda enc: lambda: enc(encoded))(choose_encoder(accept)[0])
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.repeat):
            for name, run in cases.items():
                start = time.thread_time()
                run()
                times[name].append(time.thread_time() - start)
        print(f"scrape every {interval:g} s, 64 processes, {samples} samples:")
        for name, values in times.items():
            print(f"  {name}: CPU median {statistics.median(values) * 1e3:.2f} ms (min {min(values) * 1e3:.2f})")
        for name, accept in list(ACCEPTS.items())[:2]:  # as Prometheus 2.42 asks, and as the endpoint answers it
            encoder = choose_encoder(accept)[0]
            profile = cProfile.Profile()
            profile.runcall(lambda: [encoder(encoded) for _ in range(5)])
            stats = pstats.Stats(profile)
            total = stats.total_tt
            print(f"  profile of the encoder, {name} (share of its time, cumulative):")
            rows = []
            for (file, _, func), (_, _, _, cum, _) in stats.stats.items():
                if "prometheus_client" in file and func not in ("generate_latest", "<lambda>"):
                    label = "the label pairs of a sample (<listcomp>)" if func == "<listcomp>" else func
                    rows.append((cum / total, label))
            for share, func in sorted(rows, reverse=True)[:6]:
                print(f"    {func}: {share:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
