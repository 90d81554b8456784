"""The faster paths of issue 35's fleet round 5 give what the code they replaced gave: the events frame
put in time order before it is made (not sorted after), the phases' attribute columns made column by
column (not a frame of dicts), str columns made by pyarrow, the phase table's sorted series codes (not
np.unique of every string), and the collector settings of `visualize` undone after it."""
from __future__ import annotations

import gc

import numpy as np
import pandas as pd
import pytest

from miles_profile.logdir.events_reader import EVENT_COLUMNS, _attr_columns, events_frame
from miles_profile.logdir.gc_pause import RELAXED_THRESHOLDS, gc_relaxed, keep_loaded
from miles_profile.logdir.str_column import str_array
from miles_profile.runmodel.phase_table import _sorted_codes


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


def test_gc_relaxed_restores_the_callers_settings():
    before = gc.get_threshold()
    with gc_relaxed():
        assert gc.get_threshold() == RELAXED_THRESHOLDS
        keep_loaded()
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0  # what the command froze is collectable again in a test's process


def test_keep_loaded_outside_a_command_freezes_nothing():
    # visualize() called as a library (the dashboard, a test's process) lives on: a cycle frozen there would
    # never be collected
    keep_loaded()
    assert gc.get_freeze_count() == 0
