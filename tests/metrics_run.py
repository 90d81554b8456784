"""A run directory with one recording process (rank 3, actor) written with the recorder's own writers,
for the metrics endpoint's tests (tests/unit/test_metrics_*.py, tests/integration/test_metrics_bad_input.py)."""
from __future__ import annotations

import pytest

from miles_profile.logdir.writer import EventWriter, SampleWriter, write_process_meta, write_run_meta

MiB = 1024**2
HOST = "metricshost"
COLUMNS = ["rss", "rss_peak", "gpu0_alloc", "gpu0_alloc_peak", "gpu0_reserved"]


@pytest.fixture
def run(tmp_path):
    """(run directory, the process's SampleWriter, its EventWriter); rows reach the file on flush()."""
    write_run_meta(tmp_path, {"run_id": "m", "command": [], "host": HOST, "pid": 1, "start_time": 0, "interval_ms": 100})
    write_process_meta(tmp_path, f"{HOST}-77", {"host": HOST, "pid": 77, "rank": 3, "role": "actor"})
    samples = SampleWriter(tmp_path, f"{HOST}-77", COLUMNS, flush_interval_s=1e9)
    events = EventWriter(tmp_path, f"{HOST}-77")
    yield tmp_path, samples, events
    samples.close()
    events.close()


def row(samples, t, phase, rss, rss_peak=None, alloc=None):
    """One row: RSS (its peak, else the level) and the allocator's allocated, peak and reserved (or empty)."""
    samples.append(t, phase, [rss, rss_peak or rss, alloc, alloc, alloc])
