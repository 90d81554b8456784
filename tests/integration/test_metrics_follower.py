"""The endpoint's follower as a thread behind a real HTTP endpoint (miles_profile/metrics/host_state.py):
none before the first scrape, rows folded between scrapes into the next scrape's peaks, none left after
stop(), stopped when idle and started again by the next scrape, an exception in a pass contained, the
answers it renders ahead the bytes a scrape would render. The schedule itself, step by step:
tests/unit/test_metrics_follower_schedule.py, test_metrics_render_ahead.py."""
from __future__ import annotations

import logging
import re
import threading
import time
import urllib.request

from miles_profile.metrics import serve
from miles_profile.metrics.process_state import ProcessState
from tests.metrics_run import HOST, MiB, row, run  # noqa: F401 - run is a fixture

FOLLOWER = "miles_profile-metrics-follower"
# What Debian's Prometheus 2.42 sends, and curl.
PROMETHEUS = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
CURL = "*/*"
RSS_PEAK = re.compile(rb'miles_profile_process_resident_memory_peak_bytes\{[^}]*phase="(\w+)"[^}]*\} (\S+)')


def followers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == FOLLOWER]


def scrape(server) -> dict[str, float]:
    """The RSS peak gauge per phase of one scrape."""
    return peaks(get(server)[1])


def get(server, accept: str = "") -> tuple[str, bytes]:
    """(Content-Type, body) of one scrape sending `accept`."""
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.headers["Content-Type"], answer.read()


def peaks(body: bytes) -> dict[str, float]:
    return {phase.decode(): float(value) / MiB for phase, value in RSS_PEAK.findall(body)}


def wait_for(what: str, condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.01)


def served_with_a_first_row(run):
    """The endpoint (a follower every 0.02 s) over `run`, whose first row (100 MiB in train) is written."""
    run_dir, samples, _ = run
    row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    return serve(run_dir, 0, "127.0.0.1", hostname=HOST, collect_interval_s=0.02), samples


def test_none_before_the_first_scrape_and_none_left_after_stop(run):
    server, samples = served_with_a_first_row(run)
    try:
        time.sleep(0.3)  # fifteen intervals: nothing starts on its own, nothing is rendered ahead
        assert followers() == [] and not server.state.following and server.state._processes == {}
        assert server.state.renders_ahead == 0
        assert scrape(server) == {"train": 100}
        assert len(followers()) == 1
        wait_for("two passes", lambda: server.state.passes >= 2)
    finally:
        server.stop()
    assert followers() == [] and not server.state.following


def test_a_spike_folded_between_scrapes_is_in_the_next_scrape_once(run):
    server, samples = served_with_a_first_row(run)
    try:
        assert scrape(server) == {"train": 100}
        row(samples, 1.1, "train", 100 * MiB, rss_peak=700 * MiB)  # a spike between two rows
        row(samples, 1.2, "generate", 110 * MiB)
        samples.flush()
        passes = server.state.passes
        wait_for("two passes over the spike", lambda: server.state.passes >= passes + 2)
        assert scrape(server) == {"train": 700, "generate": 110}
        assert scrape(server) == {"generate": 110}  # reported once; no new row: the last level
    finally:
        server.stop()


def test_an_idle_follower_stops_and_the_next_scrape_starts_it(run):
    server = serve(run[0], 0, "127.0.0.1", hostname=HOST, collect_interval_s=0.02, idle_stop_s=1.0)
    try:
        scrape(server)
        first = followers()
        assert len(first) == 1
        wait_for("the idle stop", lambda: not first[0].is_alive())
        assert not server.state.following
        scrape(server)
        again = followers()
        assert len(again) == 1 and again[0] is not first[0] and server.state.following
    finally:
        server.stop()
    assert followers() == []


def test_an_exception_in_a_pass_is_logged_once_and_the_follower_goes_on(run, monkeypatch, caplog):
    run_dir, samples, _ = run
    row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    failures = []
    read_new = ProcessState.read_new

    def failing(self, meta=True):  # an exception raised inside the follower's passes only, while asked
        if threading.current_thread().name == FOLLOWER and len(failures) < 5:
            failures.append(1)
            raise OSError("disk on fire")
        return read_new(self, meta)

    monkeypatch.setattr(ProcessState, "read_new", failing)
    server = serve(run_dir, 0, "127.0.0.1", hostname=HOST, collect_interval_s=0.02)
    try:
        with caplog.at_level(logging.WARNING, logger="miles_profile"):
            scrape(server)
            wait_for("five failed passes", lambda: len(failures) == 5)
            row(samples, 1.1, "train", 100 * MiB, rss_peak=300 * MiB)
            samples.flush()
            passes = server.state.passes
            wait_for("a pass after them", lambda: server.state.passes > passes)
            assert followers() and server.state.following
            assert scrape(server) == {"train": 300}
        assert [r.getMessage() for r in caplog.records] == [
            "miles_profile: metrics collection between scrapes failed (said once): OSError('disk on fire')"]
    finally:
        server.stop()
    assert followers() == []


def test_over_http_an_answer_rendered_ahead_is_the_bytes_the_scrape_would_render(run):
    """Two endpoints over the same files, one rendering ahead and one whose scrapes render, scraped in turn
    by Prometheus 2.42 and curl: the same bytes and Content-Type, some answered ahead; a spike written
    meanwhile in one scrape of each, once."""
    run_dir, samples, _ = run
    row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    ahead = serve(run_dir, 0, "127.0.0.1", hostname=HOST, collect_interval_s=0.02)
    scraped = serve(run_dir, 0, "127.0.0.1", hostname=HOST, collect_interval_s=0.02, render_ahead=False)
    try:
        def both(accept: str) -> bytes:
            answer = get(ahead, accept)
            assert answer == get(scraped, accept)
            return answer[1]

        assert peaks(both(PROMETHEUS)) == {"train": 100}
        deadline = time.monotonic() + 20
        while ahead.state.served_ahead < 3:
            assert time.monotonic() < deadline, "waited 20 s for scrapes answered ahead"
            time.sleep(0.05)  # passes in between: bytes rendered ahead, one format or both
            for accept in (PROMETHEUS, PROMETHEUS, CURL):
                assert peaks(both(accept)) == {"train": 100}  # no new row: the last level
        row(samples, 1.1, "train", 100 * MiB, rss_peak=700 * MiB)
        row(samples, 1.2, "generate", 110 * MiB)
        samples.flush()
        passes = [ahead.state.passes, scraped.state.passes]
        wait_for("two passes of each over the spike",
                 lambda: ahead.state.passes >= passes[0] + 2 and scraped.state.passes >= passes[1] + 2)
        assert peaks(both(PROMETHEUS)) == {"train": 700, "generate": 110}
        assert peaks(both(CURL)) == {"generate": 110}
    finally:
        ahead.stop()
        scraped.stop()
    assert followers() == []
