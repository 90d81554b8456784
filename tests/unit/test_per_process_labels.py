"""How a process of a many-process run is named in a check's summary (verdicts/per_process.py)."""
from __future__ import annotations

import numpy as np
from test_report_fakes import GiB, make_run

from miles_profile.verdicts.per_process import per_process_checks


def _two_actors():
    t = np.arange(0.0, 8.0, 0.05)
    frames = {"t": np.concatenate([t, t]), "pid": np.repeat([11, 22], len(t)),
              "rss": np.full(2 * len(t), 0.3 * GiB), "rss_peak": np.full(2 * len(t), 0.3 * GiB)}
    phases = [dict(name=name, start=1.0 * k, end=1.0 * k + 0.8, pid=pid, rollout_id=k)
              for k in range(8) for pid, name in ((11, "train"), (22, "ref_logprobs"))]
    processes = [dict(pid=pid, role="in_process", rank=0, ray_actor_class=cls,
                      probes=[{"name": "host", "active": True, "total": 64 * GiB}])
                 for pid, cls in ((11, "Policy"), (22, "Reference"))]
    return make_run(frames, phases, processes=processes)


def test_ray_actors_without_a_role_are_named_by_their_class():
    # a policy and a reference actor of one Ray job were both "trainer rank 0": every Ray worker is rank 0
    leak = next(c for c in per_process_checks(_two_actors()) if c.name == "leak")
    assert "(1 Ray actor Policy, 1 Ray actor Reference)" in leak.summary, leak.summary
    assert {f.message.split(" rank ")[0] for f in leak.findings} == {"Ray actor Policy", "Ray actor Reference"}


def test_a_role_the_program_set_wins_over_the_actor_class():
    run = _two_actors()
    for meta in run.processes:
        meta["role"] = "actor"
    leak = next(c for c in per_process_checks(run) if c.name == "leak")
    assert "Ray actor" not in leak.summary and "2 actor" in leak.summary, leak.summary
