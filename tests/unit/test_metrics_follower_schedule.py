"""The follower's schedule (miles_profile/metrics/host_state.py), stepped by hand on a clock the test moves:
when it passes over the files, that its passes fold into the peaks the next scrape takes, and when it
stops. tests/integration/test_metrics_follower.py runs it as a thread behind a real HTTP endpoint."""
from __future__ import annotations

from miles_profile.metrics.host_state import HostState
from tests.metrics_run import HOST, MiB, row, run  # noqa: F401 - run is a fixture


class Clock:
    """Monotonic seconds that move only when the test says (by binary fractions: sums stay exact)."""

    def __init__(self):
        self.now = 1024.0

    def __call__(self) -> float:
        return self.now


def stepped(run_dir, clock, idle_stop_s=300.0) -> HostState:
    return HostState(run_dir, HOST, collect_interval_s=1.0, idle_stop_s=idle_stop_s, clock=clock,
                     follower_thread=False)


def test_no_follower_and_nothing_read_before_the_first_scrape(run):
    run_dir, samples, _ = run
    row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    clock = Clock()
    state = stepped(run_dir, clock)
    clock.now += 10
    assert state.follow_step() is None and not state.following
    assert state.passes == 0 and state._processes == {}  # not even listed
    state.read()
    assert state.following


def test_a_pass_comes_when_nothing_read_the_files_for_the_interval(run):
    run_dir, samples, _ = run
    clock = Clock()
    state = stepped(run_dir, clock)
    state.read()  # the first scrape reads the files itself
    clock.now += 0.25
    assert state.follow_step() == 0.75 and state.passes == 0  # the scrape read 0.25 s ago: not due
    clock.now += 0.75
    assert state.follow_step() == 1.0 and state.passes == 1
    clock.now += 0.5
    state.read()  # answers from the pass: reads nothing, so the next pass stays due 1 s after the last
    clock.now += 0.5
    assert state.follow_step() == 1.0 and state.passes == 2


def stepped_with_a_first_row(run):
    """A stepped state over `run` on a clock of its own, the run's first row (100 MiB in train) written."""
    run_dir, samples, _ = run
    clock = Clock()
    state = stepped(run_dir, clock)
    row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    return state, clock, samples


def test_a_scrape_answers_from_the_last_pass_and_reads_itself_when_none_came_for_two_intervals(run):
    state, clock, samples = stepped_with_a_first_row(run)
    assert state.read().processes[0].resident == 100 * MiB
    row(samples, 2.0, "train", 120 * MiB)
    samples.flush()
    clock.now += 1.75
    assert state.read().processes[0].resident == 100 * MiB  # read 1.75 s ago: the follower's to read
    clock.now += 0.25
    assert state.read().processes[0].resident == 120 * MiB  # 2 s: the follower held up, the scrape reads


def test_a_spike_the_follower_folded_is_in_the_next_scrape_once(run):
    state, clock, samples = stepped_with_a_first_row(run)
    assert state.read().processes[0].peaks == {"train": (None, 100 * MiB)}
    row(samples, 1.1, "train", 100 * MiB, rss_peak=700 * MiB)  # a spike between two rows and two scrapes
    row(samples, 1.2, "generate", 110 * MiB)
    samples.flush()
    clock.now += 1.0
    assert state.follow_step() == 1.0 and state.passes == 1  # the follower read the spike's row
    row(samples, 2.0, "generate", 120 * MiB)
    samples.flush()
    clock.now += 0.5
    # The scrape answers from the pass: the row after it is the next pass's, and the next scrape's.
    assert state.read().processes[0].peaks == {"train": (None, 700 * MiB), "generate": (None, 110 * MiB)}
    clock.now += 0.5
    assert state.follow_step() == 1.0 and state.passes == 2
    assert state.read().processes[0].peaks == {"generate": (None, 120 * MiB)}  # the spike once: not again


def test_the_follower_stops_after_ten_of_the_longest_gaps_between_scrapes(run):
    clock = Clock()
    state = stepped(run[0], clock, idle_stop_s=5.0)
    state.read()
    clock.now += 2.0
    state.read()  # a gap of 2 s: idle means no scrape for max(5, 10 x 2) s
    clock.now += 19.5
    assert state.follow_step() == 1.0 and state.following
    clock.now += 1.0
    assert state.follow_step() is None and not state.following
    clock.now += 100.0
    state.read()  # the scraper is back: the follower too; the 120.5 s it was away is no gap of its own
    assert state.following
    clock.now += 20.5
    assert state.follow_step() is None


def test_a_closed_state_stops_its_follower_and_reads_nothing(run):
    clock = Clock()
    state = stepped(run[0], clock)
    state.read()
    state.close()
    clock.now += 1.0
    assert state.follow_step() is None and state.passes == 0


def test_the_passes_are_paced_to_a_third_of_the_scrape_interval_between_1_and_5_s(run):
    run_dir, samples, _ = run
    clock = Clock()
    state = stepped(run_dir, clock)
    state.read()
    assert state.collect_every() == 1.0  # one scrape: no interval known yet
    clock.now += 15
    state.read()  # a 15 s scraper: passes every 5 s, each big enough for pyarrow's batch
    assert state.collect_every() == 5.0
    clock.now += 2
    assert state.follow_step() == 3.0 and state.passes == 0  # due 5 s after the scrape's read, not 1 s
    clock.now += 3
    assert state.follow_step() == 5.0 and state.passes == 1
    clock.now += 1
    state.read()  # 6 s after the previous scrape: a third of it
    assert state.collect_every() == 2.0
    clock.now += 2
    state.read()  # a 2 s gap: never under 1 s
    assert state.collect_every() == 1.0
    clock.now += 120
    state.read()  # a scraper back after 2 minutes: never over 5 s
    assert state.collect_every() == 5.0
