"""Children die with the process that started them, even when it is killed with SIGKILL.

`kill -9` of `record` (or of the torchrun it started) used to leave its child, the ranks and their
engine servers running, reparented to init, holding memory and writing into the run. Linux's
PR_SET_PDEATHSIG has the kernel signal a process when its parent dies. It fires when the parent
*thread* that forked it exits, so the fork must happen on a thread that lives as long as the parent
(the main thread everywhere here). Elsewhere than Linux this is a no-op.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _resolve_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved at import: a forked child (preexec_fn) must not dlopen, which takes a lock another
# thread of the parent may have held at the fork.
_PRCTL = _resolve_prctl()


def die_with_parent(signum: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Have the kernel send `signum` to this process when its parent dies. `parent`: the pid it must
    have; when it is no longer our parent, the parent died before the call and we die now (the
    kernel would not tell us). Returns whether the kernel took the request."""
    if _PRCTL is None or _PRCTL(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)
    return True


def child_dies_with_us(signum: int = signal.SIGKILL) -> Callable[[], None]:
    """A `preexec_fn` for subprocess.Popen: the child gets `signum` when we die. Call Popen from a
    thread that lives as long as this process (see the module's docstring)."""
    parent = os.getpid()
    return lambda: die_with_parent(signum, parent)
