"""The follower rendering ahead (host_state.py, server.metrics_app), stepped by hand on a clock the test moves,
over real files and prometheus_client's real encoders through the endpoint's WSGI app: two endpoints read
the same files on the same schedule, one rendering ahead and one whose scrapes render (the endpoint without
it), and every scrape of the first must answer the second's bytes, each spike in exactly one scrape's peak
gauge. tests/integration/test_metrics_follower.py does the same over real HTTP with the follower a thread."""
from __future__ import annotations

import collections
import random
import re
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from miles_profile.metrics.host_state import HostState
from miles_profile.metrics.server import collector, metrics_app
from tests.metrics_run import HOST, MiB, row, run  # noqa: F401 - run is a fixture
from tests.unit.test_metrics_follower_schedule import Clock

# What Debian's Prometheus 2.42 sends, and curl.
PROMETHEUS = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
CURL = "*/*"
RSS_PEAK = re.compile(rb'miles_profile_process_resident_memory_peak_bytes\{[^}]*phase="(\w+)"[^}]*\} (\S+)')


class Endpoint:
    """One HostState stepped by hand behind the endpoint's WSGI app, rendering ahead or not."""

    def __init__(self, run_dir, clock, render_ahead: bool, collect_interval_s: float | None = 1.0):
        self.state = HostState(run_dir, HOST, collect_interval_s=collect_interval_s, clock=clock,
                               follower_thread=False)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector(self.state))
        self.app = metrics_app(registry, self.state if render_ahead else None)

    def scrape(self, accept: str = PROMETHEUS) -> tuple[str, bytes]:
        got = {}

        def start_response(status, headers, exc_info=None):
            got.update(status=status, headers=dict(headers))
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "", "HTTP_ACCEPT": accept}
        body = b"".join(self.app(environ, start_response))
        assert got["status"] == "200 OK"
        return got["headers"]["Content-Type"], body


class Pair:
    """The endpoint rendering ahead and the one that does not, stepped and scraped together."""

    def __init__(self, run_dir, clock):
        self.ahead, self.scraped = Endpoint(run_dir, clock, True), Endpoint(run_dir, clock, False)

    def step(self) -> None:
        for one in (self.ahead, self.scraped):
            one.state.follow_step()

    def scrape(self, accept: str = PROMETHEUS) -> bytes:
        """The answer of the endpoint rendering ahead, after checking it is the other's, byte for byte."""
        answer = self.ahead.scrape(accept)
        assert answer == self.scraped.scrape(accept)
        return answer[1]


def rss_peaks(body: bytes) -> dict[str, float]:
    return {phase.decode(): float(value) / MiB for phase, value in RSS_PEAK.findall(body)}


def scraped_once(run) -> tuple[Pair, Clock, Any]:
    """Both endpoints over `run`, its first row (100 MiB in train at 1 s) written and scraped once."""
    run_dir, samples, _ = run
    clock = Clock()
    pair = Pair(run_dir, clock)
    row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    pair.scrape()
    return pair, clock, samples


def test_the_scrape_is_answered_with_the_bytes_rendered_after_the_last_pass_before_it(run):
    pair, clock, samples = scraped_once(run)
    state = pair.ahead.state
    for _ in range(3):
        clock.now += 1
        pair.step()
    pair.scrape()  # a 3 s scraper: passes every 1 s, at 1, 2 and 3 s after it
    # Nothing rendered ahead before a second scrape shows the interval (passes every 1 s meanwhile).
    assert (state.passes, state.renders_ahead, state.served_ahead) == (3, 0, 0)
    for k in range(3):
        row(samples, 2.0 + k, "train", (110 + k) * MiB, rss_peak=(500 + k) * MiB)
        samples.flush()
        clock.now += 1
        pair.step()
        # Only the passes the scrape is expected before (within a tenth of an interval) render ahead: the
        # one at 2 s (the next pass, at 3 s, may come after the scrape) and the one at 3 s; not the one at 1 s.
        assert (state.passes, state.renders_ahead) == (4 + k, k)
    # The pass at 3 s and the scrape at 3 s: the pass first here, so the scrape takes what it rendered.
    assert rss_peaks(pair.scrape()) == {"train": 502}
    assert state.served_ahead == 1
    clock.now += 0.5
    assert rss_peaks(pair.scrape()) == {"train": 112}  # taken once: the last level, rendered by the scrape
    assert state.served_ahead == 1


def test_a_spike_read_after_the_render_is_in_that_scrape_and_never_in_the_next(run):
    pair, clock, samples = scraped_once(run)
    state = pair.ahead.state
    clock.now += 1
    pair.scrape()  # a 1 s scraper: every pass renders ahead
    clock.now += 1
    pair.step()
    assert state.renders_ahead == 1
    row(samples, 2.0, "train", 100 * MiB, rss_peak=700 * MiB)  # a spike the render did not see
    samples.flush()
    clock.now += 2  # the follower held up: 2 s without a pass, so the scrape reads the files itself
    assert rss_peaks(pair.scrape()) == {"train": 700}
    assert state.served_ahead == 0  # the rendered bytes went stale: never served
    for _ in range(3):  # gaps of 1 s then 3 s: no fixed period, every pass renders ahead
        clock.now += 1
        pair.step()
    assert state.renders_ahead == 4
    assert rss_peaks(pair.scrape()) == {"train": 100}  # the spike once: the next scrape has the level
    assert state.served_ahead == 1


def test_another_format_gets_its_own_answer_and_only_asked_formats_are_rendered(run):
    pair, clock, samples = scraped_once(run)
    state = pair.ahead.state
    clock.now += 1
    pair.scrape()
    for t in range(2, 5):
        row(samples, t, "generate", t * MiB, rss_peak=300 * MiB + t)
        samples.flush()
        clock.now += 1
        pair.step()
        if t < 4:  # Prometheus' alone until curl came
            assert set(state._rendered[1]) == {"application/openmetrics-text; version=1.0.0; charset=utf-8; "
                                               "escaping=allow-utf-8"}
        content_type, body = pair.ahead.scrape(CURL) if t == 3 else (None, pair.scrape())
        if t == 3:  # curl between two scrapes of Prometheus: text 0.0.4, rendered by the scrape, correct
            assert (content_type, body) == pair.scraped.scrape(CURL)
            assert content_type.startswith("text/plain; version=0.0.4") and state.served_ahead == 1
            peak = next(f for f in text_string_to_metric_families(body.decode())
                        if f.name == "miles_profile_process_resident_memory_peak_bytes")
            assert [(s.labels["phase"], s.value) for s in peak.samples] == [("generate", 300 * MiB + 3)]
    assert state.served_ahead == 2  # the scrape after curl's: curl took what was rendered for it
    clock.now += 1
    pair.step()
    assert len(state._rendered[1]) == 2  # curl asked among the latest 4 scrapes: its format too
    assert pair.ahead.scrape(CURL) == pair.scraped.scrape(CURL) and state.served_ahead == 3
    for _ in range(4):  # four scrapes of Prometheus alone: curl's format no more
        clock.now += 1
        pair.step()
        pair.scrape()
    clock.now += 1
    pair.step()
    assert len(state._rendered[1]) == 1 and state.served_ahead == 7


def test_bytes_and_peaks_hold_over_random_writes_passes_and_scrapes(run):
    """Rows with spikes, passes, scrapes every 3 s (now and then 2 or 4) with jitter, curls, back-to-back
    scrapes, a follower held up, at random (seeded): every answer is the bytes the scrape would render,
    every spike in one.
    Each spike is in a phase of its own, so that no later spike of its phase hides it."""
    run_dir, samples, _ = run
    rng = random.Random(32)
    clock = Clock()
    pair = Pair(run_dir, clock)
    state = pair.ahead.state
    t, spikes, seen = 1.0, [], []
    paths = collections.Counter()  # (rendered ahead before the scrape, scraper, answered with it)

    def scrape(accept: str) -> None:
        rendered, served = state._rendered is not None, state.served_ahead
        seen.append(rss_peaks(pair.scrape(accept)))
        paths[rendered, "curl" if accept == CURL else "prometheus", state.served_ahead > served] += 1

    row(samples, t, "train", 100 * MiB)
    samples.flush()
    scrape(PROMETHEUS)
    for interval in [rng.choice([2.0, 3.0, 3.0, 3.0, 4.0]) for _ in range(40)]:  # mostly a fixed period
        for _ in range(int(interval * 4)):  # rows every 0.25 s, a pass when due
            t += 0.25
            phase, spike = rng.choice(["train", "generate", "offload_train"]), None
            if rng.random() < 0.3:
                spike = 1000 + len(spikes)
                spikes.append(spike)
                phase = f"spike_{spike}"
            row(samples, t, phase, rng.randrange(100, 200) * MiB, rss_peak=spike and spike * MiB)
            samples.flush()
            clock.now += 0.25
            if rng.random() < 0.9:  # else the follower is held up
                pair.step()
        # A scrape on time or late; now and then 6.5 s late with the follower held up meanwhile: the scrape
        # reads the files itself (nothing read them for two of the follower's intervals, 2 x 9.5 s / 3).
        clock.now += rng.choice([0.0, 0.0, 0.25, 0.5, 6.5])
        scrape(rng.choice([PROMETHEUS, PROMETHEUS, CURL]))
        if rng.random() < 0.2:  # a second scraper right after the first
            scrape(PROMETHEUS)
    for spike in spikes:
        assert sum(spike in peaks.values() for peaks in seen) == 1, spike
    # Every path was taken: answered ahead; rendered ahead but stale (read since, or taken by another
    # scraper) or for the other format, then rendered by the scrape.
    assert paths[True, "prometheus", True] >= 5 and paths[True, "curl", True] >= 1, paths
    assert paths[True, "prometheus", False] >= 2 and paths[True, "curl", False] >= 2, paths


def test_no_follower_renders_nothing_ahead(run):
    run_dir, samples, _ = run
    clock = Clock()
    endpoint = Endpoint(run_dir, clock, True, collect_interval_s=None)
    row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    for _ in range(3):
        endpoint.scrape()
        clock.now += 1
        assert endpoint.state.follow_step() is None
    assert (endpoint.state.passes, endpoint.state.renders_ahead, endpoint.state.served_ahead) == (0, 0, 0)


def test_a_fixed_period_renders_once_an_interval_and_two_scrapers_after_every_pass(run):
    run_dir, samples, _ = run
    clock = Clock()
    endpoint = Endpoint(run_dir, clock, True)
    state = endpoint.state

    def wait(seconds: float) -> tuple[int, int]:
        """(passes, renders ahead) while `seconds` go by, the follower woken every 0.25 s."""
        passes, renders = state.passes, state.renders_ahead
        for _ in range(int(seconds * 4)):
            clock.now += 0.25
            state.follow_step()
        return state.passes - passes, state.renders_ahead - renders

    endpoint.scrape()
    # The passes 0.75 s before the scrapes: within a tenth of their interval (0.5 s), the pass 5 s
    # before would render too (the next pass might come after the scrape).
    wait(2.75)
    for _ in range(3):
        wait(15)
        endpoint.scrape()  # Prometheus every 15 s: passes every 5 s
    served = state.served_ahead
    for _ in range(3):
        assert wait(15) == (3, 1)  # only the pass before the scrape renders
        endpoint.scrape()
    assert state.served_ahead == served + 3
    for gap in (4, 11, 4, 11):  # two Prometheus servers 4 s apart: no period, every pass renders
        passes, renders = wait(gap)
        assert renders == passes
        endpoint.scrape()
    assert state.served_ahead == served + 3 + 3  # the first of these came before the passes knew


def test_a_scrapes_reading_is_its_own_while_the_follower_renders_ahead(run):
    """A scrape renders its reading outside the state's lock: a pass and a render ahead meanwhile must not
    change the peaks it took (they are the next scrape's)."""
    run_dir, samples, _ = run
    clock = Clock()
    endpoint = Endpoint(run_dir, clock, True)
    row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    endpoint.scrape()
    clock.now += 1
    reading = endpoint.state.read()  # a scrape, its reading not yet rendered
    assert reading.processes[0].peaks == {"train": (None, 100 * MiB)}
    row(samples, 2.0, "train", 100 * MiB, rss_peak=700 * MiB)
    samples.flush()
    clock.now += 1
    endpoint.state.follow_step()
    assert endpoint.state.renders_ahead == 1
    assert reading.processes[0].peaks == {"train": (None, 100 * MiB)}
