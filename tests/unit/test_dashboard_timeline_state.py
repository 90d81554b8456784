"""What the timeline draws next is decided from state, so a dropped browser response loses no zoom."""
from __future__ import annotations

from dashboards.panels.refresh import SUMMARY_EVERY_S, due
from dashboards.panels.runs import default_run
from dashboards.panels.timeline import focus_window, plan_window
from dashboards.runs import RunSummary


def zoom_window(zoom):
    if zoom.get("auto"):
        return None
    return tuple(zoom["range"]) if zoom["range"][1] > zoom["range"][0] else False


def plan(zoom=None, focus=None, view=None, rendered=None, version=0, triggers=frozenset({"page-poll"}), run="a"):
    return plan_window(run, version, zoom, focus, view, rendered, set(triggers), zoom_window)


def test_a_new_run_starts_unzoomed_and_spends_earlier_requests():
    window, key = plan(zoom={"range": [1, 2], "at": 5}, rendered={"run": "b", "zoom_at": 1})
    assert window is None and key["zoom_at"] == 5 and key["run"] == "a"


def test_a_check_clicked_before_the_new_runs_first_drawing_is_still_shown():
    window, key = plan(focus={"run": "a", "span": [10, 20], "at": 9}, rendered={"run": "b", "focus_at": 1},
                       triggers={"checks-focus"})
    assert window == focus_window([10, 20]) and key["focus_at"] == 9


def test_a_check_of_another_run_or_an_already_drawn_one_does_not_zoom():
    assert plan(focus={"run": "b", "span": [10, 20], "at": 9}, rendered={"run": "b", "focus_at": 1})[0] is None
    rendered = {"run": "a", "version": 0, "zoom_at": None, "focus_at": 9}
    assert plan(focus={"run": "a", "span": [10, 20], "at": 9}, rendered=rendered) is None


def test_a_poll_with_nothing_new_draws_nothing():
    rendered = {"run": "a", "version": 3, "zoom_at": 5, "focus_at": None}
    assert plan(zoom={"range": [1, 2], "at": 5}, view=[1, 2], rendered=rendered, version=3) is None


def test_new_samples_keep_the_window():
    rendered = {"run": "a", "version": 3, "zoom_at": 5, "focus_at": None}
    window, key = plan(zoom={"range": [1, 2], "at": 5}, view=[1, 2], rendered=rendered, version=4)
    assert window == (1, 2) and key["version"] == 4


def test_a_zoom_whose_answer_was_dropped_is_drawn_by_the_next_poll():
    rendered = {"run": "a", "version": 3, "zoom_at": 5, "focus_at": None}
    window, key = plan(zoom={"range": [3, 4], "at": 6}, view=[1, 2], rendered=rendered, version=3)
    assert window == (3, 4) and key["zoom_at"] == 6


def test_autorange_shows_everything_and_a_useless_zoom_keeps_the_window():
    rendered = {"run": "a", "version": 3, "zoom_at": 5, "focus_at": None}
    assert plan(zoom={"auto": True, "at": 7}, view=[1, 2], rendered=rendered, version=3)[0] is None
    assert plan(zoom={"range": [2, 2], "at": 8}, view=[1, 2], rendered=rendered, version=3)[0] == (1, 2)


def test_a_clicked_check_wins_over_an_older_zoom():
    rendered = {"run": "a", "version": 3, "zoom_at": 5, "focus_at": None}
    window, _ = plan(zoom={"range": [3, 4], "at": 6}, focus={"run": "a", "span": [10, 20], "at": 1.5}, view=[1, 2],
                     rendered=rendered, version=3, triggers={"checks-focus"})
    assert window == focus_window([10, 20]) and window[0] < 10 and window[1] > 20


def test_focus_pads_short_spans_and_ignores_garbage():
    lo, hi = focus_window([5, 5])
    assert lo < 5 < hi
    assert focus_window("x") is None and focus_window([None, 1]) is None


def test_summaries_recompute_for_a_new_run_at_once_and_for_new_data_at_most_every_few_seconds():
    assert due("a", 1, None, now=100.0) == {"run": "a", "version": 1, "at": 100.0}
    rendered = {"run": "a", "version": 1, "at": 100.0}
    assert due("a", 1, rendered, now=200.0) is None
    assert due("a", 2, rendered, now=100.0 + SUMMARY_EVERY_S / 2) is None
    assert due("a", 2, rendered, now=100.0 + SUMMARY_EVERY_S) is not None
    assert due("b", 1, rendered, now=100.0) is not None


def test_the_page_opens_on_a_live_run_else_the_newest_readable_one():
    def run(run_id, live=False, problem=""):
        return RunSummary(run_id, 0.0, 0.0, live, "", 1, problem)
    assert default_run([run("new", problem="damaged"), run("old")]) == "old"
    assert default_run([run("new"), run("old", live=True)]) == "old"
    assert default_run([run("bad", problem="damaged")]) == "bad"
    assert default_run([]) is None
