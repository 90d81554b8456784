"""Leave a command-line process with its exit code, skipping the interpreter's teardown.

pyarrow's CPU thread pool can abort the interpreter as it finalizes ("terminate called without an
active exception", exit 134: apache/arrow#34314): a std::thread of the pool destroyed while still
joinable. Seen here on `visualize` about once in 12 runs on a loaded 2-core machine, after it had
printed its verdict; a gate then reads 134 instead of 0, 1 or 2. The verdict is the product, so a
CLI that has read logs with pyarrow ends with `os._exit` once its own work is done: our threads
joined (a cache being written), stdout and stderr flushed.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading

import psutil

CHILDREN_WAIT_S = 5.0  # a browser kaleido closed takes 1-3 s to go; then it is terminated


def exit_now(code: int) -> None:
    """Join this process's other non-daemon threads, run the atexit handlers, wait for the children
    still closing (kaleido's browser), flush stdout and stderr, and `os._exit(code)`."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what sys.exit would run before the teardown that aborts
    _reap_children()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (`| head`), a closed stream
            pass
    os._exit(code)


def _reap_children() -> None:
    """Nothing left running: children still closing (kaleido's Chromium) are waited for, then ended."""
    try:
        children = psutil.Process().children(recursive=True)
        _, alive = psutil.wait_procs(children, timeout=CHILDREN_WAIT_S)
        for child in alive:
            child.terminate()
        psutil.wait_procs(alive, timeout=CHILDREN_WAIT_S)
    except psutil.Error:
        pass
