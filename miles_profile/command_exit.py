"""What the exit code `record --exec` stores (`names.COMMAND_EXIT`) says about how its command ended.

    command_exit(run) -> int | None          # the stored code, None where not recorded
    signal_name(number) -> "SIGTERM"
    stop_signal(code) -> "SIGTERM" | None   # stopped by a signal other than SIGKILL (not a memory death)

A negative code is the signal that ended the command; a shell in between reports it as 128 + the signal.
"""
from __future__ import annotations

import signal

from miles_profile import names


def command_exit(run) -> int | None:
    """The exit code of `record --exec`'s command (negative: its signal), or None: not recorded."""
    for p in run.processes:
        if p.get("role") == "exec_parent":
            code = (p.get("annotations") or {}).get(names.COMMAND_EXIT)
            if isinstance(code, int) and not isinstance(code, bool):
                return code
    return None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def stop_signal(code) -> str | None:
    """The signal, other than SIGKILL, that stopped the command (SIGTERM from a scheduler or a timeout,
    Ctrl-C's SIGINT), or None: it exited by itself, or was killed (SIGKILL: the oom check's business)."""
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    number = -code if code < 0 else (code - 128 if 128 < code < 160 else 0)
    if number <= 0 or number == signal.SIGKILL:
        return None
    return signal_name(number)
