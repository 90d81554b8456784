"""Work done on the machine's other core by a forked child, its result sent back pickled; the caller
does it in-process whenever the child did not deliver (a fork refused, the child raised, died, was
killed or ran past the wait). A one-shot command (`visualize`) runs on one core otherwise.

    with allowed():                  # a one-shot command's main: only there does start() fork
        side = start(fn, *args)      # None: not forked (not allowed, no os.fork); do the work in-process
    ok, value = side.result()        # waits at most WAIT_S; ok False: do it in-process
    side.cancel()                    # the child killed and reaped (result() does it too)

The child is a fork of this process (the loaded run is shared copy-on-write, not sent): it runs
`fn(*args)`, writes the pickle to a temporary file unlinked at once (nothing left on disk even if
both are killed) and leaves with `os._exit` (never the
parent's atexit handlers, never its buffered output); its stdout and stderr are /dev/null, so it
says nothing the command would not have said. It dies with its parent (PR_SET_PDEATHSIG); one whose
result was never asked for is killed and reaped when the block ends and at exit (exit_now runs atexit).
Only inside `allowed()`: a long-lived process (the dashboard, a test session) with its own threads
never forks.

Forking after pyarrow's thread pools have started: pyarrow (>= 12) restarts its pools in a forked
child (its at-fork handlers), mimalloc and glibc's malloc are fork-safe; bench/side_process_stress.py
forks beside the pools at work 200 times and checks none hangs (docs/benchmarks.md, round 7).
"""
from __future__ import annotations

import atexit
import ctypes
import os
import pickle
import select
import signal
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator

# A child doing ~2 s of work on a 2-core VM: far past that, it is stuck (or the machine is swamped)
# and the caller does the work itself instead of waiting longer.
WAIT_S = 30.0
_PR_SET_PDEATHSIG = 1
_allowed = 0  # open allowed() blocks
_live: set["SideProcess"] = set()  # started, not yet reaped


@contextmanager
def allowed() -> Iterator[None]:
    """start() forks inside this block only; every child still unreaped at its end is killed and reaped."""
    global _allowed
    _allowed += 1
    try:
        yield
    finally:
        _allowed -= 1
        cancel_all()


def cancel_all() -> None:
    for side in list(_live):
        side.cancel()


atexit.register(cancel_all)


class SideProcess:
    def __init__(self, pid: int, fd: int):
        self.pid, self.fd, self._done = pid, fd, False
        self._owner = os.getpid()  # a forked child holding this handle too must not reap or kill a sibling

    def result(self, wait_s: float | None = None) -> tuple[bool, Any]:
        """(True, fn's value) once the child wrote it; (False, None) when it failed or ran past `wait_s`
        (default WAIT_S)."""
        if os.getpid() != self._owner:
            return False, None
        try:
            status = self._wait(WAIT_S if wait_s is None else wait_s)
            if status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
                return False, None
            os.lseek(self.fd, 0, os.SEEK_SET)  # the child's writes moved the offset both share
            with os.fdopen(os.dup(self.fd), "rb") as f:
                return True, pickle.load(f)
        except Exception:  # noqa: BLE001 - a result that cannot be read is work to do in-process
            return False, None
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Kill the child if it still runs, reap it and close its file (twice is harmless)."""
        _live.discard(self)
        if os.getpid() != self._owner:
            return
        if not self._done:
            self._done = True
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _wait(self, wait_s: float) -> int | None:
        """The child's exit status, or None past `wait_s` (it is killed by cancel())."""
        deadline = time.monotonic() + wait_s
        fd = None
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # an old kernel: poll
            pass
        try:
            while True:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self._done = True
                    return status
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if fd is not None:
                    select.select([fd], [], [], left)
                else:
                    time.sleep(min(0.005, left))
        finally:
            if fd is not None:
                os.close(fd)


def start(fn: Callable[..., Any], *args: Any) -> SideProcess | None:
    """Fork a child that runs fn(*args); None outside allowed(), where this platform cannot fork or the
    fork failed."""
    if not _allowed or not hasattr(os, "fork"):
        return None
    try:
        handle, path = tempfile.mkstemp(prefix="miles-profile-side-", suffix=".pickle")
        os.unlink(path)  # the parent and the child share the open file: no name to leave behind
    except OSError:
        return None
    for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice (by parent and child)
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        with warnings.catch_warnings():  # Python 3.12 warns of forking a threaded process: handled above
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(handle)
        return None
    if pid == 0:  # the child: never returns
        code = 1
        try:
            _quiet_child()
            data = pickle.dumps(fn(*args), protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(data)
            while view:
                view = view[os.write(handle, view):]
            code = 0
        except BaseException:  # noqa: BLE001 - the parent does the work: exit code 1 says so
            pass
        os._exit(code)
    side = SideProcess(pid, handle)
    _live.add(side)
    return side


def _quiet_child() -> None:
    """Output to /dev/null, dying with the parent, ^C left to the parent (which reaps this child); the
    parent's other children are not this one's to reap, and a child forks no children of its own."""
    global _allowed
    _allowed = 0
    _live.clear()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # also a stream not on fd 1/2 (a test's capture)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)
    except (OSError, AttributeError):
        pass
