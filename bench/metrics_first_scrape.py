"""The endpoint's answer against prometheus_client's own WSGI app on one host of 64 processes (the unit
tests' reading, tests/unit/test_metrics_exposition.py): a first scrape (nothing cached: every family
encoded, its lines and prefixes kept) and a scrape whose families all repeat the previous one's, each as a
ratio of this thread's CPU time to prometheus_client's, interleaved, medians.

    python bench/metrics_first_scrape.py [--repeat 9] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import make_wsgi_app  # noqa: E402

from miles_profile.metrics.server import metrics_app  # noqa: E402
from tests.unit.test_metrics_exposition import PROMETHEUS_ACCEPT, _answer, _many, _registry_of  # noqa: E402


def median_cpu(calls: dict, repeat: int) -> dict:
    cpu: dict = {name: [] for name in calls}
    for _ in range(repeat):  # interleaved: the machine is shared
        for name, call in calls.items():
            start = time.thread_time()
            call()
            cpu[name].append(time.thread_time() - start)
    return {name: statistics.median(values) for name, values in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    registry = _registry_of([_many()])
    theirs = make_wsgi_app(registry, disable_compression=True)
    cached = metrics_app(registry)
    _answer(cached, PROMETHEUS_ACCEPT)
    for k in range(args.rounds):
        first = median_cpu({"ours": lambda: _answer(metrics_app(registry), PROMETHEUS_ACCEPT),
                            "theirs": lambda: _answer(theirs, PROMETHEUS_ACCEPT)}, args.repeat)
        again = median_cpu({"ours": lambda: _answer(cached, PROMETHEUS_ACCEPT),
                            "theirs": lambda: _answer(theirs, PROMETHEUS_ACCEPT)}, args.repeat)
        print(f"round {k + 1}: first scrape {first['ours'] * 1e3:.2f} ms, prometheus_client's app "
              f"{first['theirs'] * 1e3:.2f} ms (ratio {first['ours'] / first['theirs']:.3f}); a repeated scrape "
              f"{again['ours'] * 1e3:.2f} ms (ratio {again['ours'] / again['theirs']:.3f})")


if __name__ == "__main__":
    main()
