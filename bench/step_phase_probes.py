"""Where a phase's CPU goes, probe by probe, in a process recorded as `record --exec` records a child:
each probe's read, the event lines and the CUDA note, timed (this thread's CPU) around 100 phases opened
after 50 ms busy-wait steps. Run it under record (it joins the run from the environment):

    PYTHONPATH=. python -m miles_profile.record --log-dir /tmp/x --exec -- python bench/step_phase_probes.py cpu
    PYTHONPATH=. python -m miles_profile.record --log-dir /tmp/x --exec -- python bench/step_phase_probes.py cuda

Wraps the recorder's probes (private attributes: a bench, not an API).
"""
import collections
import statistics
import sys
import time

import torch
import transformers  # noqa: F401 -- a trainer's heap

import miles_profile as mp
from miles_profile import phases, recorder

if sys.argv[1:] == ["cuda"]:
    torch.zeros(1, device="cuda")
mp.annotate(bench="step_phase_probes")
rec = recorder.active()
print([p.name for p in rec._sampler._probes])
spent = collections.defaultdict(list)


def timed(owner, attr: str, key: str) -> None:
    inner = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        c = time.thread_time_ns()
        result = inner(*args, **kwargs)
        spent[key].append(time.thread_time_ns() - c)
        return result
    setattr(owner, attr, wrapper)


for probe in rec._sampler._probes:
    timed(probe, "read", "probe." + probe.name)
timed(rec._events, "write", "event.write")
timed(rec, "_note_cuda", "note_cuda")


def busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


total = []
for i in range(100):
    busy(0.05)
    c0 = time.thread_time_ns()
    with phases.step_phase("train", step=i) if hasattr(phases, "step_phase") else phases.phase("train", step=i):
        c1 = time.thread_time_ns()
        busy(0.05)
        c2 = time.thread_time_ns()
    total.append(c1 - c0 + time.thread_time_ns() - c2)
print(sys.argv[1:], "phase (begin + end) CPU median us", statistics.median(total) / 1e3)
for key, values in spent.items():  # periodic rows included: the median is mostly the boundaries' (2 a phase)
    print(" ", key, len(values), "reads, median us", statistics.median(values) / 1e3, "max", max(values) / 1e3)
