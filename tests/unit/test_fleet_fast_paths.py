"""The faster paths of issue 35's fleet round 5 give what the code they replaced gave: the events frame
put in time order before it is made (not sorted after), the phases' attribute columns made column by
column (not a frame of dicts), str columns made by pyarrow, the phase table's sorted series codes (not
np.unique of every string), and the collector settings of `visualize` undone after it."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from miles_profile.logdir.events_reader import EVENT_COLUMNS, _attr_columns, events_frame
from miles_profile.logdir.gc_pause import RELAXED_THRESHOLDS
from miles_profile.logdir.str_column import str_array
from miles_profile.runmodel.phase_table import _sorted_codes
from tests.conftest import REPO, python_env


def _event(t, kind="begin", name="train", pid=7, host="h", phase_id=1, parent=None, attrs=None):
    return {"t": t, "kind": kind, "name": name, "pid": pid, "host": host, "id": phase_id, "parent": parent,
            "attrs": {} if attrs is None else attrs}


def _sorted_after(rows: list[dict]) -> pd.DataFrame:
    """The events frame as it was made before: from the dicts, then sorted by time (stable)."""
    columns = {c: [row.get(c, np.nan) for row in rows] for c in EVENT_COLUMNS if c != "attrs"}
    columns["attrs"] = [row["attrs"] for row in rows]
    events = pd.DataFrame(columns, columns=EVENT_COLUMNS)
    events["t"] = events["t"].astype(float)
    return events.sort_values("t", kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("times", [[3, 1.5, 2, 1.5, 0], [0.0, 1.0, 2.0], [5, 5, 5, 1]])
def test_events_frame_in_time_order_as_sorted_after(times):
    # ties keep the files' order (a begin and an end at one time), ints and floats mixed as JSON has them
    rows = [_event(t, kind="begin" if k % 2 else "end", name=f"p{k}", phase_id=k, parent=None if k % 3 else 0,
                   attrs={"rollout_id": k}) for k, t in enumerate(times)]
    made = events_frame(rows)
    expected = _sorted_after(rows)
    pd.testing.assert_frame_equal(made, expected, check_exact=True)
    assert list(made["name"]) == list(expected["name"])
    assert [repr(a) for a in made["attrs"]] == [repr(a) for a in expected["attrs"]]


def test_events_frame_missing_keys_and_non_str_names():
    rows = [_event(2.0), {"t": 1, "kind": "mark", "name": "step", "attrs": {}}, _event(0.5, host=None)]
    pd.testing.assert_frame_equal(events_frame(rows), _sorted_after(rows), check_exact=True)
    assert events_frame([]).columns.tolist() == EVENT_COLUMNS


_ATTRS = [
    [{"a": None}, {"a": 1}], [{"a": None}, {"a": "x"}], [{"a": 1}, {"a": 2.5}], [{"a": True}, {}],
    [{"a": [1]}, {}], [{"a": {"x": 1}}, {}], [{"a": None}, {"a": None}], [{"a": 2 ** 70}, {}],
    [{"a": 1}, {"a": "x"}], [{"a": 1}, {}], [{"a": "x"}, {"a": None}], [{"a": True}, {"a": False}],
    [{"b": 1}, {"a": 2, "b": 3}], [{"name": "shadowed", "rollout_id": 3}, {"tags": ["kv"]}], [{}, {}],
]


@pytest.mark.parametrize("attrs", _ATTRS)
def test_attr_columns_as_a_frame_of_dicts(attrs):
    index = pd.RangeIndex(len(attrs))
    expected = pd.DataFrame([{k: v for k, v in a.items() if k not in ("name",)} for a in attrs], index=index)
    made = _attr_columns(attrs, index)
    pd.testing.assert_frame_equal(made, expected, check_exact=True)
    assert list(made.dtypes) == list(expected.dtypes)


@pytest.mark.parametrize("values", [["node1", "node0", "é", "", "node1"], ["x"], []])
def test_str_array_is_pandas_str_column(values):
    made, expected = pd.Series(str_array(values)), pd.Series(values, dtype=str)
    pd.testing.assert_series_equal(made, expected, check_exact=True)
    assert made.dtype == expected.dtype


def test_sorted_codes_as_np_unique():
    values = pd.Series(["rss", "gpu1_proc", "gpu0_proc", "rss", "gpu10_proc", "a", "gpu1_proc"], dtype=str)
    names_, codes = _sorted_codes(values)
    expected_names, expected_codes = np.unique(values.to_numpy(), return_inverse=True)
    assert names_.tolist() == expected_names.tolist()
    assert codes.tolist() == expected_codes.tolist()


# Each case in a fresh interpreter: a test worker has frozen its own objects (tests/conftest.py), and a
# freeze made here to set the scene would keep this worker's later garbage cycles forever.
GC_CASES = """
import gc, json, sys
from miles_profile.logdir.gc_pause import gc_relaxed, keep_loaded
case, seen = sys.argv[1], {}
if case == "caller froze its own":
    gc.freeze()
mine, before = gc.get_freeze_count(), gc.get_threshold()
if case == "outside a command":
    keep_loaded()
else:
    with gc_relaxed():
        seen["inside"] = list(gc.get_threshold())
        keep_loaded()
        seen["frozen_inside"] = gc.get_freeze_count() - mine
seen.update(after=gc.get_freeze_count() - mine, restored=gc.get_threshold() == before, mine=mine)
print(json.dumps(seen))
"""


def _gc_case(case: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", GC_CASES, case], capture_output=True, text=True, timeout=60,
                          env=python_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_gc_relaxed_restores_the_callers_settings():
    seen = _gc_case("a command")
    assert seen["inside"] == list(RELAXED_THRESHOLDS) and seen["restored"]
    assert seen["frozen_inside"] > 0  # the runs read are left out of the command's collections ...
    assert seen["after"] == 0  # ... and collectable again after it, in a process that lives on


def test_keep_loaded_outside_a_command_freezes_nothing():
    # visualize() called as a library (the dashboard, a test's process) lives on: a cycle frozen there would
    # never be collected
    assert _gc_case("outside a command")["after"] == 0


def test_a_command_leaves_what_its_caller_froze_frozen():
    # a test worker or a server that froze its imports: gc.unfreeze at the command's end undid that
    seen = _gc_case("caller froze its own")
    assert seen["mine"] > 0 and seen["frozen_inside"] == 0 and seen["after"] == 0 and seen["restored"]
