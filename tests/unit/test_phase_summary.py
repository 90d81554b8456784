"""Phase summaries: what the `end` events carry equals what the samples give, and the statistics that
whole-run analysis computes from summaries alone."""
from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import miles_profile as mp
from miles_profile.identity import host_name
from miles_profile.logdir.layout import new_run_dir
from miles_profile.logdir.summaries import summaries_frame
from miles_profile.logdir.writer import EventWriter, write_process_meta, write_run_meta
from miles_profile.phase_summary import PhaseSummaries, series_plan
from miles_profile.runmodel.summary_stats import summary_instances, summary_table

MiB = 1024 ** 2


def expected_from_rows(rows: pd.DataFrame, columns: list[str]) -> dict:
    """The summary by definition, from the rows of a phase: peak over level and *_peak, floor, first, last."""
    out = {}
    for series, level, peak in series_plan(columns):
        y = rows[series].to_numpy(dtype=float, na_value=np.nan)
        top = np.fmax(y, rows[columns[peak]].to_numpy(dtype=float, na_value=np.nan)) if peak is not None else y
        seen = y[np.isfinite(y)]
        if not len(seen) and not np.isfinite(top).any():
            continue
        out[series] = {"peak": int(np.nanmax(top)),
                       "floor": int(seen.min()) if len(seen) else None,
                       "first": int(seen[0]) if len(seen) else None,
                       "last": int(seen[-1]) if len(seen) else None}
    return out


# -- a real recorder, real allocations ---------------------------------------------------------
# A program: a list of steps; ("phase", name, mib, children) allocates `mib` inside a phase, holds it
# while its children run, and frees it before the phase ends; ("spike", mib) allocates and frees at
# once (a peak no periodic row need see: only rss_peak keeps it).
step = st.recursive(
    st.tuples(st.just("spike"), st.integers(1, 24)),
    lambda inner: st.tuples(st.just("phase"), st.sampled_from(["generate", "train", "offload_train"]),
                            st.integers(0, 24), st.lists(inner, max_size=3)),
    max_leaves=6)


def run_program(steps, rollout_id=0) -> None:
    for s in steps:
        if s[0] == "spike":
            block = bytearray(s[1] * MiB)
            block[:: 4096] = b"x" * len(block[:: 4096])  # touch every page: real RSS
            del block
        else:
            _, name, mib, children = s
            with mp.phase(name, rollout_id=rollout_id):
                block = bytearray(mib * MiB)
                block[:: 4096] = b"x" * len(block[:: 4096])
                time.sleep(0.004)
                run_program(children, rollout_id)
                del block


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=st.lists(step, max_size=3))
def test_summaries_equal_what_the_samples_give(tmp_path, program):
    with mp.Recorder(tmp_path, interval_ms=2) as rec:
        run_program([("phase", "train", 0, program)])
    run = mp.load(rec.run_dir)
    columns = run.processes[0]["columns"]
    assert "rss_peak" in columns
    samples = run.samples
    ends = run.events[run.events["kind"] == "end"]
    assert len(ends) == len(run.phases) and len(run.phases) > 0
    for _, phase in run.phases.iterrows():
        summary = ends[ends["id"] == phase["id"]].iloc[0]["attrs"]["summary"]
        # The phase's rows: after the row right before it began, up to and including the row right
        # before it ended; the same rows as the event-time window start < t <= end.
        by_events = samples[(samples["t"] > phase["start"]) & (samples["t"] <= phase["end"])]
        by_bounds = samples[(samples["t"] >= summary["t_first"]) & (samples["t"] <= summary["t_last"])]
        assert by_events.index.tolist() == by_bounds.index.tolist()
        assert summary["rows"] == len(by_events) >= 1
        assert summary["series"] == expected_from_rows(by_events, columns)


def test_a_spike_between_samples_is_the_phase_peak(tmp_path):
    with mp.Recorder(tmp_path, interval_ms=1000) as rec:  # no periodic row inside the phase
        with mp.phase("generate"):
            block = bytearray(64 * MiB)
            block[:: 4096] = b"x" * len(block[:: 4096])
            del block
    run = mp.load(rec.run_dir)
    row = run.phase_summaries.set_index("series").loc["rss"]
    assert row["rows"] == 1  # only the closing row
    assert row["peak"] - row["last"] >= 60 * MiB  # freed before the row, still the phase's peak


def test_summaries_of_phases_from_threads(tmp_path):
    with mp.Recorder(tmp_path, interval_ms=2) as rec:
        def worker(k):
            for _ in range(3):
                with mp.phase("generate", worker=k):
                    block = bytearray((k + 1) * 4 * MiB)
                    block[:: 4096] = b"x" * len(block[:: 4096])
                    time.sleep(0.003)
                    del block
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    run = mp.load(rec.run_dir)
    columns = run.processes[0]["columns"]
    ends = run.events[run.events["kind"] == "end"].set_index("id")
    for _, phase in run.phases.iterrows():
        rows = run.samples[(run.samples["t"] > phase["start"]) & (run.samples["t"] <= phase["end"])]
        assert ends.loc[phase["id"], "attrs"]["summary"]["series"] == expected_from_rows(rows, columns)


# -- the running summary against brute force, any order of opens and closes --------------------
ops = st.lists(st.one_of(st.tuples(st.just("row"), st.lists(st.one_of(st.none(), st.integers(0, 100)),
                                                               min_size=3, max_size=3)),
                         st.tuples(st.just("open")), st.tuples(st.just("close"), st.integers(0, 20))),
               max_size=60)


@given(ops)
def test_running_summaries_match_brute_force_for_any_interleaving(sequence):
    columns = ["a", "a_peak", "b"]
    tracker = PhaseSummaries(columns)
    rows: list[tuple[float, list]] = []
    open_at: dict[int, int] = {}
    next_id = 0
    for op in sequence:
        if op[0] == "row":
            t = float(len(rows))
            rows.append((t, op[1]))
            tracker.add(t, op[1])
        elif op[0] == "open":
            tracker.open(next_id)
            open_at[next_id] = len(rows)
            next_id += 1
        elif open_at:
            phase_id = sorted(open_at)[op[1] % len(open_at)]
            got = tracker.close(phase_id)
            mine = rows[open_at.pop(phase_id):]
            frame = pd.DataFrame([v for _, v in mine], columns=columns, dtype="Float64")
            assert got["rows"] == len(mine)
            assert got["series"] == (expected_from_rows(frame, columns) if mine else {})


# -- reading, and statistics from summaries alone ---------------------------------------------
def test_version_1_ends_without_summaries_give_no_rows(tmp_path):
    events = pd.DataFrame([{"t": 1.0, "kind": "end", "name": "train", "pid": 1, "host": "h", "id": 1,
                            "parent": None, "attrs": {"status": "ok"}}])
    assert summaries_frame(events).empty


def summary_event(writer, t, phase_id, name, rss, gpu):
    series = {"rss": dict(zip(("peak", "floor", "first", "last"), rss))}
    if gpu:
        series["gpu0_alloc"] = dict(zip(("peak", "floor", "first", "last"), gpu))
    writer.write("end", name, {"status": "ok", "summary": {"rows": 3, "t_first": t - 0.5, "t_last": t,
                                                           "series": series}}, t=t, id=phase_id)


def test_summary_table_from_summaries_alone(tmp_path):
    run_dir = new_run_dir(tmp_path)
    write_run_meta(run_dir, {"interval_ms": 20.0, "run_id": "r"})
    write_process_meta(run_dir, "h-7", {"pid": 7, "host": "h", "role": "actor"})
    ev = EventWriter(run_dir, "h-7")
    big = 2 ** 40 + 3  # bytes stay exact integers
    for k, (rss_train, gpu) in enumerate([((big, 10, 11, 12), (8, 1, 2, 3)), ((big + 5, 9, 13, 14), None)]):
        ev.write("begin", "train", {"rollout_id": k}, t=10.0 * k + 1, id=2 * k + 1)
        summary_event(ev, 10.0 * k + 5, 2 * k + 1, "train", rss_train, gpu)
        ev.write("begin", "offload_train", {"rollout_id": k}, t=10.0 * k + 6, id=2 * k + 2)
        summary_event(ev, 10.0 * k + 8, 2 * k + 2, "offload_train", (20, 4, 19, 4 + k), None)
    ev.close()
    (run_dir / "h-7.samples.csv").write_text("t,phase,rss\n0.5,,1\n")
    run = mp.load(run_dir)
    table = summary_table(run.phases, run.phase_summaries).set_index(["name", "series"])
    assert table.loc[("train", "rss")].tolist() == [2, big + 5, 9, 11, 14]  # count, peak, floor, first, last
    assert table.loc[("train", "gpu0_alloc")].tolist() == [1, 8, 1, 2, 3]
    assert table.loc[("offload_train", "rss")].tolist() == [2, 20, 4, 19, 5]
    per_iteration = summary_table(run.phases, run.phase_summaries, by_iteration=True)
    floors = per_iteration[(per_iteration["name"] == "offload_train") & (per_iteration["series"] == "rss")]
    assert floors["iteration"].tolist() == [0, 1] and floors["last"].tolist() == [4, 5]
    instances = summary_instances(run.phases, run.phase_summaries)
    assert set(instances["host"]) == {host_name()} and len(instances) == 5
