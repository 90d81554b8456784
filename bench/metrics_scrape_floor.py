"""What a scrape would cost if it parsed no row at all: each process's new rows only split into lines and
the last one read for the levels; no per-phase peaks. The floor that any reader-side speed-up of the
rows can reach, and so what an aggregation written by the recorded processes themselves would leave:
the events, the bytes read and the rendering (docs/prometheus.md, Cost). An experiment on
`metrics_scrape_cpu.py`'s host, not the endpoint's behaviour:

    python bench/metrics_scrape_floor.py [--processes 64] [--phase-seconds 10]

Run `python bench/metrics_scrape_cpu.py` with the same arguments beside it for the endpoint as it is.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles_profile.metrics import process_state, row_peaks  # noqa: E402


def _last_row_only(self, data: bytes, folded) -> None:
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: nothing
    if lines:
        self._recent, self._recent_t = lines[-2:], []
        self._levels(lines[-1].split(b","))


def main(argv: list[str] | None = None) -> int:
    process_state.ProcessState._rows = _last_row_only
    row_peaks.fold = lambda *args, **kwargs: None  # host_state imports it at the scrape: this one
    import metrics_scrape_cpu
    return metrics_scrape_cpu.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
