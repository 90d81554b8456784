"""glibc's heap in use (probes/heap.py) on real allocations, and the recorder's opt-in."""
from __future__ import annotations

import time

import torch

import miles_profile as mp
from miles_profile.probes.heap import HeapProbe, heap_in_use

MiB = 1024**2


def test_heap_in_use_follows_a_torch_tensor_and_its_free():
    before = heap_in_use()
    tensor = torch.ones(64 * MiB // 4)  # 64 MiB of float32, malloc'd by torch's CPU allocator
    held = heap_in_use()
    del tensor
    after = heap_in_use()
    assert 64 * MiB <= held - before < 65 * MiB
    assert abs(after - before) < MiB


def test_the_probes_peak_keeps_the_read_before_so_a_drop_still_shows_the_level_entering_it():
    probe = HeapProbe()
    tensor = torch.ones(32 * MiB // 4)
    level, _ = probe.read()
    del tensor
    now, peak = probe.read()
    assert level - now >= 32 * MiB and peak == level  # the interval's start counts
    again, peak = probe.read()
    assert peak == max(again, now)


def test_the_recorder_samples_the_heap_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("MILES_PROFILE_HEAP", "0")  # what `record --no-heap` sets
    with mp.Recorder(tmp_path / "off", interval_ms=5) as off:
        assert not off.samples_heap and not mp.samples_heap()
    monkeypatch.setenv("MILES_PROFILE_HEAP", "1")  # what `record --heap` sets for every process of the run
    with mp.Recorder(tmp_path / "on", interval_ms=5) as on:
        assert on.samples_heap and mp.samples_heap()
        mp.heap_baseline()
        with mp.phase("train"):
            tensor = torch.ones(16 * MiB // 4)
        del tensor  # held at the phase's end: its closing row reads it (a spike in between can be missed)
    run = mp.load(tmp_path / "on")
    assert not [c for c in mp.load(tmp_path / "off").samples.columns if c.startswith("heap")]
    baseline = run.processes[0]["annotations"]["heap_baseline"]
    summary = run.phase_summaries.set_index("series").loc["heap_used"]
    assert summary["peak"] - baseline >= 16 * MiB
    assert {"heap_used", "heap_used_peak"} <= set(run.samples.columns)


def test_by_default_the_heap_is_read_at_phase_boundaries_only(tmp_path, monkeypatch):
    """No flag: offload_drop gets the heap before, at the end of and after each phase, at two reads per
    phase; periodic rows leave it empty, and no host forecast is judged on it (samples_heap is off)."""
    monkeypatch.delenv("MILES_PROFILE_HEAP", raising=False)
    with mp.Recorder(tmp_path / "default", interval_ms=5) as rec:
        assert not rec.samples_heap
        for _ in range(3):
            with mp.phase("train"):
                time.sleep(0.1)
    run = mp.load(tmp_path / "default")
    heap = run.samples["heap_used"]
    assert heap.notna().sum() >= 6 and heap.isna().sum() > heap.notna().sum()  # boundaries, not the 5 ms rows
    probe = next(p for p in run.processes[0]["probes"] if p["name"] == "heap")
    assert probe["reads"] == "phase boundaries"


def test_an_integrations_step_phase_leaves_the_heap_unread_until_the_program_opens_a_phase_of_its_own(
        tmp_path, monkeypatch):
    """A step phase (integrations/steps.py) skips the two mallinfo2 walks, its largest cost: the heap at
    boundaries is for offload_drop, and an integration tags no offload. Once the program opens a phase of
    its own (an offload, maybe), every boundary reads the heap again, the steps' too."""
    from miles_profile.integrations import steps as integration_steps
    monkeypatch.delenv("MILES_PROFILE_HEAP", raising=False)
    monkeypatch.setattr(integration_steps, "_owner", None)  # the process's claim is undone after the test
    steps = integration_steps.StepPhases("bench")
    with mp.Recorder(tmp_path, interval_ms=60_000):  # no periodic rows: boundary rows only
        for n in range(2):
            steps.begin(step=n)
            steps.end()
        with mp.phase("offload_train"):
            pass
        steps.begin(step=2)
        steps.end()
    run = mp.load(next(tmp_path.iterdir()))
    rows = run.samples.sort_values("t")
    read = rows["heap_used"].notna().tolist()
    # the start row, 2 steps x (before, after), the offload's two rows, the third step's two, the last row
    assert len(read) == 1 + 4 + 2 + 2 + 1, rows[["t", "phase", "heap_used"]]
    assert read[1:5] == [False] * 4 and read[5:9] == [True] * 4, rows[["t", "phase", "heap_used"]]


def test_a_process_with_gpu_columns_reads_no_heap_at_its_boundaries():
    """Its columns make the run's gpu_indices non-empty, where nothing reads the heap at boundaries
    (the next test): the two mallinfo2 walks a phase are skipped (a Ray actor's largest boundary cost)."""
    from miles_profile.probes.heap import boundary_heap_unread
    assert boundary_heap_unread(["rss", "rss_peak", "host_available", "gpu0_boundary_proc", "disk"])
    assert boundary_heap_unread(["rss", "gpu3_alloc", "gpu3_alloc_peak"])
    assert boundary_heap_unread(["rss", "rss_peak", "rss_anon", "host_available", "disk"]) == ""


def _with_gpu_column(src, dst, drop_heap: bool) -> None:
    """A copy of the run at `src` whose process also has an empty `gpu0_boundary_proc` column (what a
    process on a GPU host records before its own GPU is known), and, with `drop_heap`, no heap columns."""
    import csv
    import shutil
    shutil.copytree(src, dst)
    for path in dst.glob("*.samples.csv"):
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        keep = [k for k, c in enumerate(rows[0]) if not (drop_heap and c.startswith("heap_used"))]
        with open(path, "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerows([[row[k] for k in keep] + (["gpu0_boundary_proc"] if n == 0 else [""])
                              for n, row in enumerate(rows)])


def test_on_a_run_with_gpu_columns_no_verdict_reads_the_heap(tmp_path, monkeypatch):
    """What boundary_heap_unread relies on: a run with a GPU column (even an empty one) judges its offloads
    on GPU series, so every verdict is the same with or without the heap read at boundaries."""
    monkeypatch.delenv("MILES_PROFILE_HEAP", raising=False)
    with mp.Recorder(tmp_path / "rec", interval_ms=60_000):
        for _ in range(2):
            with mp.phase("train"):
                state = torch.ones(48 * MiB // 4)
            with mp.phase("offload_train", expected_bytes=48 * MiB, target="disk"):
                del state
    src = next((tmp_path / "rec").iterdir())
    assert mp.load(src).samples["heap_used"].notna().any()
    _with_gpu_column(src, tmp_path / "heap", drop_heap=False)
    _with_gpu_column(src, tmp_path / "noheap", drop_heap=True)
    from miles_profile.verdicts.engine import judge
    with_heap, without = mp.load(tmp_path / "heap"), mp.load(tmp_path / "noheap")
    assert with_heap.gpu_indices == [0] and "heap_used" in with_heap.samples and "heap_used" not in without.samples
    judged = [[(c.name, c.status, c.summary, [(f.status, f.message) for f in c.findings]) for c in judge(run).checks]
              for run in (with_heap, without)]
    assert judged[0] == judged[1]
    assert [c for c in judged[0] if c[0] == "offload_drop"][0][3], judged[0]  # two offloads judged
