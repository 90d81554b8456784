"""The sampler's schedule: periodic rows, full rows at boundaries, costly probes on their own interval."""
from __future__ import annotations

import time

import miles_profile as mp
from miles_profile.logdir.writer import SampleWriter
from miles_profile.sampler import Sampler


class CountingProbe:
    """A real probe shape (columns, read, describe, close) whose value is the number of reads."""

    name = "counting"
    columns = ("reads",)

    def __init__(self):
        self.reads = 0

    def read(self):
        self.reads += 1
        return (self.reads,)

    def describe(self):
        return {"name": self.name, "active": True}

    def close(self):
        pass


class EveryHundredMs(CountingProbe):
    """Like NvmlProbe: periodic reads only when due, boundary reads always."""

    name = "slow"
    columns = ("slow_reads",)
    partial_reads = True

    def __init__(self):
        super().__init__()
        self._next = 0.0

    def read(self, full=True):
        now = time.monotonic()
        if not full and now < self._next:
            return (None,)
        self._next = now + 0.1
        return super().read()


def test_costly_probes_read_on_their_interval_and_at_every_boundary(tmp_path):
    fast, slow = CountingProbe(), EveryHundredMs()
    writer = SampleWriter(tmp_path, "h-1", Sampler.columns_of([fast, slow]))
    sampler = Sampler([fast, slow], writer, interval_s=0.005, current_phase=lambda: "")
    sampler.start()
    time.sleep(0.5)
    for _ in range(5):
        sampler.sample(phase="train")  # boundary rows: always full
    sampler.stop()
    assert fast.reads >= 40  # every row
    assert 5 + 1 + 3 <= slow.reads <= 5 + 2 + 8  # boundaries, start/stop, and about every 100 ms
    lines = (tmp_path / "h-1.samples.csv").read_text().splitlines()[1:]
    boundary_rows = [line for line in lines if ",train," in line]
    assert all(not line.endswith(",") for line in boundary_rows)  # full rows carry the costly column


def test_recorder_rows_come_at_the_interval(tmp_path):
    with mp.Recorder(tmp_path, interval_ms=10) as rec:
        time.sleep(0.5)
    t = mp.load(rec.run_dir).samples["t"]
    assert 25 <= len(t) <= 60
    assert t.diff().median() < 0.02
