"""A page showing a finished run that the server has read polls every QUIET_POLL_MS instead of every
--poll-ms (dashboards/panels/runs.py): nothing of that run is left to show, and each poll was about nine
requests answered "unchanged". A run started meanwhile still appears in the list within that time."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from dashboards.panels.runs import QUIET_POLL_MS
from dashboards.serve import dashboard_process

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # mostly waits: 10 s of quiet poll, up to 5 s for a new run

SAMPLE_RUN = Path(__file__).resolve().parents[2] / "sample_logs" / "cpu"
WINDOW_S = 10.0


def test_a_finished_run_polls_quietly_and_a_new_run_still_appears(browser, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(SAMPLE_RUN, logs / "finished")
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    callbacks: list[float] = []
    with dashboard_process(logs) as url:
        page = context.new_page()
        page.on("request", lambda r: callbacks.append(time.monotonic()) if "_dash-update-component" in r.url else None)
        try:
            page.goto(url)
            page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 3", timeout=60_000)
            page.wait_for_timeout(QUIET_POLL_MS + 1000)  # the first polls, before the run was read, are --poll-ms
            start = time.monotonic()
            page.wait_for_timeout(WINDOW_S * 1000)
            quiet = sum(1 for t in callbacks if t >= start)
            # every 1 s this page sends about nine callbacks a poll (90 in the window); every 5 s about 20
            assert quiet < 45, f"{quiet} callbacks in {WINDOW_S:g} s of a finished run"
            shutil.copytree(SAMPLE_RUN, logs / "started-later")
            appeared = time.monotonic()
            page.wait_for_function("() => document.querySelectorAll('#runs-list .runs-item').length == 2",
                                   timeout=(QUIET_POLL_MS + 10_000))
            print(f"\n{quiet} callbacks in {WINDOW_S:g} s quiet; a new run listed after "
                  f"{time.monotonic() - appeared:.1f} s")
        finally:
            context.close()
