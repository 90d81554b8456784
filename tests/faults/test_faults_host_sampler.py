"""The host sampler under faults: its holder killed (another process takes over), a holder that cannot
start or write (it leaves the role), a lock file that can't be opened (the program goes on)."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

import miles_profile as mp
from miles_profile import identity
from miles_profile.host_sampler import HostSampler
from miles_profile.recorder import create_run
from tests.integration.test_multiproc_record import rank_env, start_rank
from tests.unit.test_host_sampler import FakeNvml, make_run


@pytest.mark.slow
def test_another_process_takes_over_when_the_host_sampler_is_killed(tmp_path):
    run_dir = create_run(tmp_path, ["test"], 20.0)
    procs = [start_rank("-", 6, **rank_env(r, 2, run_dir)) for r in range(2)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 10
    while not list(run_dir.glob("*.host.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    holder = json.loads(next(run_dir.glob("*.host.json")).read_text())["pid"]
    killed_at = time.time()
    os.kill(holder, signal.SIGKILL)
    survivor = next(p for p in procs if p.pid != holder)
    assert survivor.wait(timeout=60) == 0
    next(p for p in procs if p.pid == holder).wait()
    run = mp.load(run_dir)
    assert sorted(h["pid"] for h in run.hosts) == sorted([holder, survivor.pid])
    after = run.host_samples[run.host_samples["t"] > killed_at + 2]
    assert len(after) >= 5  # the survivor sampled the host after taking over (1 s standby)


class BrokenNvml(FakeNvml):
    """The NVML stand-in whose device listing fails, as a broken driver would."""

    def devices(self):
        raise RuntimeError("driver gone")


def test_a_host_sampler_that_cannot_start_leaves_the_role_to_another(tmp_path):
    run_dir = make_run(tmp_path)
    broken = HostSampler(run_dir, interval_s=0.01, prefer=True, backend=BrokenNvml(), standby_s=0.05).start()
    assert broken.active  # NVML absent is not a failure: host memory and cgroup still sampled
    broken.stop()

    class Unwritable(HostSampler):
        def _activate(self):
            raise OSError(28, "No space left on device")

    failed = Unwritable(run_dir, interval_s=0.01, prefer=True, backend=FakeNvml(), standby_s=0.05).start()
    assert not failed.active
    other = HostSampler(run_dir, interval_s=0.01, prefer=True, backend=FakeNvml(), standby_s=0.05).start()
    assert other.active  # the lock was released, not kept by a sampler that samples nothing
    other.stop()
    failed.stop()


def test_an_unusable_lock_file_never_stops_the_recorded_program(tmp_path):
    run_dir = make_run(tmp_path)
    (run_dir / f"{identity.host_name()}.host.lock").mkdir()  # open() of the lock fails
    with mp.Recorder(run_dir=run_dir, interval_ms=20) as rec:
        with mp.phase("train"):
            pass
    run = mp.load(rec.run_dir)
    assert run.phases["status"].tolist() == ["ok"] and run.hosts == []
