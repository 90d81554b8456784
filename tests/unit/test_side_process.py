"""logdir/side_process.py: a forked child's result comes back; a child that raises, dies, hangs or is
never asked for never costs the caller its answer or leaves a process or file behind."""
from __future__ import annotations

import os
import signal
import time

import pytest

from miles_profile.logdir import side_process


def _gone(side) -> bool:
    """The child reaped (no zombie left either) and its file closed (it never had a name on disk)."""
    try:
        os.waitpid(side.pid, os.WNOHANG)
    except ChildProcessError:
        return side.fd == -1
    return False


def _value(n):
    print("said by the child")  # must not reach the parent's output
    return {"n": n, "squares": [k * k for k in range(n)]}


def _raises():
    raise RuntimeError("boom")


def _dies():
    os.kill(os.getpid(), signal.SIGKILL)


def _hangs():
    time.sleep(60)


def test_only_inside_allowed_does_it_fork():
    assert side_process.start(_value, 3) is None


def test_the_value_comes_back_and_the_child_is_reaped(capfd):
    with side_process.allowed():
        side = side_process.start(_value, 5)
        assert side is not None
        assert side.result() == (True, {"n": 5, "squares": [0, 1, 4, 9, 16]})
    assert _gone(side)
    out, err = capfd.readouterr()
    assert "said by the child" not in out + err


@pytest.mark.parametrize("fn", [_raises, _dies])
def test_a_child_that_raises_or_dies_gives_no_value(fn):
    with side_process.allowed():
        side = side_process.start(fn)
        assert side.result() == (False, None)
    assert _gone(side)


def test_a_hung_child_is_waited_for_a_bounded_time_then_killed():
    with side_process.allowed():
        side = side_process.start(_hangs)
        started = time.monotonic()
        assert side.result(wait_s=0.3) == (False, None)
        assert time.monotonic() - started < 5
    assert _gone(side)


def test_a_child_never_asked_for_is_killed_when_the_block_ends():
    with side_process.allowed():
        side = side_process.start(_hangs)
    assert _gone(side)


def _asks_for(sibling):
    """In a child: a handle of the parent's, inherited with the fork, asked for and cancelled."""
    return sibling.result(wait_s=0.1), side_process.start(_value, 1)


def test_a_child_never_reaps_or_kills_its_parents_other_children():
    with side_process.allowed():
        sibling = side_process.start(_value, 3)
        child = side_process.start(_asks_for, sibling)
        assert child.result() == (True, ((False, None), None))  # no value, and no fork of its own
        assert sibling.result() == (True, {"n": 3, "squares": [0, 1, 4]})
