"""The cost of the RSS split columns (rss_anon, rss_file, rss_shmem), side by side in one process:
interleaved rounds of whole samples (process, host and disk probes, the CSV writer, the phase
summaries) with the split and without it (the process probe cut to rss, rss_peak as before).

    PYTHONPATH=. python bench/rss_split_ab.py [--rounds 15] [--samples 1000]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles_profile.logdir.writer import SampleWriter  # noqa: E402
from miles_profile.phase_summary import PhaseSummaries  # noqa: E402
from miles_profile.probes.disk import DiskProbe  # noqa: E402
from miles_profile.probes.host import HostProbe  # noqa: E402
from miles_profile.probes.process import OwnProcessProbe  # noqa: E402
from miles_profile.sampler import Sampler  # noqa: E402


class UnsplitProcessProbe(OwnProcessProbe):
    """The process probe as it was: the same /proc read, two columns."""
    columns = ("rss", "rss_peak")

    def read(self):
        return super().read()[:2]


def _sampler(tmp: str, probe_cls, stem: str) -> Sampler:
    probes = [probe_cls(), HostProbe(), DiskProbe()]
    columns = Sampler.columns_of(probes)
    summaries = PhaseSummaries(columns)
    summaries.open(1)  # every row goes into an open phase's summary, as inside a phase
    return Sampler(probes, SampleWriter(Path(tmp), stem, columns, 0.5), 1.0, lambda: "train", summaries.add)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--samples", type=int, default=1000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        samplers = {"without split": _sampler(tmp, UnsplitProcessProbe, "a"), "with split": _sampler(tmp, OwnProcessProbe, "b")}
        times: dict[str, list[float]] = {name: [] for name in samplers}
        for _ in range(args.rounds):
            for name, sampler in samplers.items():
                started = time.perf_counter()
                for _ in range(args.samples):
                    sampler.sample()
                times[name].append((time.perf_counter() - started) / args.samples * 1e6)
        for sampler in samplers.values():
            sampler.stop()
    for name, values in times.items():
        print(f"{name:14s} median {statistics.median(values):6.1f} us, min {min(values):6.1f} us per sample")
    return 0


if __name__ == "__main__":
    sys.exit(main())
