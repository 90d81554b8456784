"""The stacks parser (runmodel/stacks.py) on snapshots in PyTorch's documented format (`torch.cuda.memory._snapshot`
docstring: segments/blocks/frames, device_traces), written to real pickle files; and the recorder's
online rule for which phase to record (miles_profile/stacks.py)."""
from __future__ import annotations

import pickle

import pytest

from miles_profile.runmodel.stacks import BEFORE_HISTORY, load_snapshot, peak_sites
from miles_profile.stacks import PEAK, StackHistory, phase_peak

MiB = 1024 ** 2
TORCH_F = {"filename": "/usr/lib/python3/site-packages/torch/nn/functional.py", "line": 2300, "name": "linear"}
TORCH_M = {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1750, "name": "_call_impl"}
TRAIN = {"filename": "/home/u/train.py", "line": 50, "name": "main"}


def at(line: int, name: str = "forward") -> list[dict]:
    """Frames innermost first, as PyTorch records them: torch's own code, then the model's line, then the loop."""
    return [TORCH_F, TORCH_M, {"filename": "/home/u/model.py", "line": line, "name": name}, TRAIN]


def event(action: str, addr: int, size: int, frames=(), t=0) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames), "time_us": t}


def block(addr: int, size: int, frames=(), state="active_allocated") -> dict:
    return {"address": addr, "size": size + 512, "requested_size": size, "state": state, "frames": list(frames)}


def snapshot() -> dict:
    """P lives throughout (allocated before history: no stack); Q is freed by the history before anything
    else; A (8 MiB, model.py:10) and two B (2 MiB each, model.py:20) make the peak; A is freed; C
    (1 MiB, model.py:30) is allocated after. At the end: P, B, B, C live, A's block inactive."""
    P, Q, A, B1, B2, C = 0x10000, 0x20000, 0x1000000, 0x2000000, 0x2400000, 0x1000000  # C reuses A's address
    trace = [event("free_requested", Q, 3 * MiB, at(5)), event("free_completed", Q, 3 * MiB, at(5), 1),
             event("segment_alloc", 0x1000000, 20 * MiB), event("alloc", A, 8 * MiB, at(10), 2),
             event("alloc", B1, 2 * MiB, at(20), 3), event("alloc", B2, 2 * MiB, at(20), 4),
             event("free_requested", A, 8 * MiB, at(10), 5), event("free_completed", A, 8 * MiB, at(10), 6),
             event("alloc", C, 1 * MiB, at(30), 7)]
    segments = [{"device": 0, "address": 0x10000, "total_size": 2 * MiB, "stream": 0, "segment_type": "large",
                 "allocated_size": MiB, "active_size": MiB,
                 "blocks": [block(P, MiB), block(Q, 3 * MiB, state="inactive")]},
                {"device": 0, "address": 0x1000000, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
                 "allocated_size": 5 * MiB, "active_size": 5 * MiB,
                 "blocks": [block(C, MiB, at(30)), block(B1, 2 * MiB, at(20)), block(B2, 2 * MiB, at(20))]}]
    return {"segments": segments, "device_traces": [trace]}


@pytest.fixture(scope="module")
def snapshot_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("stacks") / "vm-1.stacks.pickle"
    with open(path, "wb") as f:
        pickle.dump(snapshot(), f)
    return path


def test_sites_at_the_peak_from_a_pickled_snapshot(snapshot_file):
    (dev,) = peak_sites(load_snapshot(snapshot_file))
    assert dev.device == 0 and dev.entries == 9 and not dev.truncated
    assert dev.peak_bytes == (1 + 8 + 2 + 2) * MiB  # P + A + B + B; Q was gone, C not yet there
    assert dev.end_bytes == (1 + 2 + 2 + 1) * MiB
    assert dev.peak_entry == 5 and dev.peak_time_us == 4  # the second B
    assert [(s.site, s.bytes, s.count) for s in dev.sites] == [
        ("/home/u/model.py:10", 8 * MiB, 1), ("/home/u/model.py:20", 4 * MiB, 2), (BEFORE_HISTORY, MiB, 1)]
    top = dev.sites[0]
    assert top.function == "forward" and not top.internal
    assert top.stack[0] == "/home/u/model.py:10 (forward)" and top.stack[1].startswith("/home/u/train.py:50")


def test_limit_and_rest(snapshot_file):
    (dev,) = peak_sites(load_snapshot(snapshot_file), limit=1)
    assert [s.site for s in dev.sites] == ["/home/u/model.py:10"]
    assert (dev.other_bytes, dev.other_count) == (5 * MiB, 3)


def test_full_history_is_said():
    (dev,) = peak_sites(snapshot(), max_entries=9)
    assert dev.truncated
    (dev,) = peak_sites(snapshot(), max_entries=10)
    assert not dev.truncated


def test_all_torch_frames_stand_for_the_outermost_and_no_history_is_the_end_state():
    snap = {"segments": [{"device": 1, "address": 0, "total_size": 4 * MiB,
                          "blocks": [block(0, 4 * MiB, [TORCH_F, TORCH_M])]}], "device_traces": [[], []]}
    (dev,) = peak_sites(snap)
    assert dev.device == 1 and dev.peak_bytes == dev.end_bytes == 4 * MiB and dev.peak_entry == -1
    (site,) = dev.sites
    assert site.internal and site.site == f"{TORCH_M['filename']}:1750"


def test_refuses_a_pickle_that_would_run_code(tmp_path):
    class Runs:
        def __reduce__(self):
            return (print, ("this must never run",))

    path = tmp_path / "evil.stacks.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "x": Runs()}))
    with pytest.raises(ValueError, match="refused builtins.print"):
        load_snapshot(path)
    path.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="no readable snapshot"):
        load_snapshot(path)
    with pytest.raises(ValueError, match="not a PyTorch memory snapshot"):
        peak_sites({"segments": "no"})


def test_phase_peak_reads_the_allocator_series():
    summary = {"series": {"rss": {"peak": 10 ** 12}, "gpu0_alloc": {"peak": 7}, "gpu1_alloc": {"peak": 9},
                          "gpu0_proc": {"peak": 100}}}
    assert phase_peak(summary) == 9
    assert phase_peak({"series": {"gpu0_proc": {"peak": 100}}}) == 100
    assert phase_peak({"series": {"rss": {"peak": 5}}}) is None and phase_peak(None) is None


def test_peak_rule_records_the_kind_that_held_the_peak_when_it_runs_again(tmp_path):
    """Online: each kind's first instance ranks it; the first later phase of the holder's kind is recorded."""
    events = []
    history = StackHistory(tmp_path, "vm-1", lambda *e: events.append(e), PEAK)
    ends = [("generate", 5), ("train", 9), ("offload_train", 2), ("train", 9)]  # a tie keeps the first holder
    for k, (name, peak) in enumerate(ends):
        history.end(k + 1, name, {"series": {"gpu0_alloc": {"peak": peak}}})
    assert history._rule_for("generate", False) is None and history._rule_for("train", False) == PEAK
    history.end(9, "generate", {"series": {"gpu0_alloc": {"peak": 12}}})
    assert history._rule_for("generate", False) == PEAK and history._rule_for("train", False) is None
    named = StackHistory(tmp_path, "vm-1", lambda *e: None, "offload_train")
    assert named._rule_for("offload_train", False) == "named" and named._rule_for("train", True) == "attribute"
    assert not events
