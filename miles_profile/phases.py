"""The phase API the trainer calls: `phase()`, `mark()`, `watch_dir()`, `annotate()`.

Without an active recorder each is a function call and nothing more. A child started by
`record --exec` finds its run directory in MILES_PROFILE_RUN_DIR and starts its own recorder there
on the first call, so its phases land in the parent's run; so does a child forked by a recorded
process. None of these ever raises for the log's sake: a run that can't be written is a warning.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from miles_profile import names, recorder
from miles_profile.cluster.env import node_run_dir
from miles_profile.errors import MilesProfileError
from miles_profile.probes.heap import heap_in_use

_env_run_dir = os.environ.get(names.RUN_DIR_ENV)


def _interval_from_env() -> float:
    """`record --interval-ms`, handed to the processes that join its run; the default when absent or bad."""
    try:
        return recorder.check_interval_ms(float(os.environ.get(names.INTERVAL_ENV, "")))
    except (ValueError, MilesProfileError):
        return recorder.DEFAULT_INTERVAL_MS


_join_interval_ms = _interval_from_env()


def _recorder() -> "recorder.Recorder | None":
    global _env_run_dir
    rec = recorder._active
    if rec is None and _env_run_dir:
        run_dir, _env_run_dir = _env_run_dir, None  # try once
        try:
            # A Ray worker on a node with logs of its own writes there (cluster/env.py).
            rec = recorder.Recorder(run_dir=node_run_dir(run_dir), interval_ms=_join_interval_ms).start()
        except (MilesProfileError, OSError) as exc:  # the job runs on, unrecorded
            recorder.log.warning("miles_profile: warning: not recording this process (pid %d): %s", os.getpid(), exc)
            rec = None
    return rec


def _after_fork_in_child() -> None:
    """A forked child records as itself or not at all: the parent's recorder is dropped, and the
    child joins the parent's run with files of its own on its first phase()/mark(), like a child
    that finds MILES_PROFILE_RUN_DIR."""
    global _env_run_dir, _join_interval_ms
    parent = recorder.forget_after_fork()
    if parent is not None and parent.run_dir is not None:
        _env_run_dir, _join_interval_ms = str(parent.run_dir), parent.interval_ms
    else:
        _env_run_dir = os.environ.get(names.RUN_DIR_ENV)


os.register_at_fork(after_in_child=_after_fork_in_child)


class _NoPhase:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> bool:
        return False


_NO_PHASE = _NoPhase()


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ()))


def _allocator_state() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "peak": torch.cuda.max_memory_allocated()}


class _Phase:
    __slots__ = ("_rec", "_name", "_attrs", "_id", "_light")

    def __init__(self, rec: "recorder.Recorder", name: str, attrs: dict[str, Any], light: bool = False):
        self._rec, self._name, self._attrs, self._id, self._light = rec, name, attrs, 0, light

    def __enter__(self) -> None:
        self._id = self._rec.begin(self._name, self._attrs, self._light)

    def __exit__(self, exc_type, exc, tb) -> bool:
        status = "ok"
        if exc is not None:
            status = names.OOM if _is_oom(exc) else names.ERROR
            if not getattr(exc, "_miles_profile_logged", False):  # log once, in the innermost phase
                attrs = {"phase": self._name, "type": type(exc).__name__, "message": str(exc)[:500]}
                if status == names.OOM:
                    attrs.update(_allocator_state())
                self._rec.event(status, self._name, attrs)
                try:
                    exc._miles_profile_logged = True
                except AttributeError:
                    pass
        self._rec.end(self._id, self._name, status, self._light)
        return False  # never swallow


def phase(name: str, **attrs: Any):
    """`with phase("offload_train", target="disk", expected_bytes=n):` tags samples and logs begin/end."""
    rec = _recorder()
    return _NO_PHASE if rec is None else _Phase(rec, name, attrs)


def step_phase(name: str, **attrs: Any):
    """`phase()` for a training step an integration tags (integrations/steps.py): the same rows and events,
    but its boundary rows leave glibc's heap unread while the process has opened no phase of its own
    (the heap at boundaries is for offload_drop, and an integration never tags an offload)."""
    rec = _recorder()
    return _NO_PHASE if rec is None else _Phase(rec, name, attrs, light=True)


def mark(name: str, **attrs: Any) -> None:
    """An instant event, e.g. `mark("oom")`."""
    rec = _recorder()
    if rec is not None:
        rec.event(names.MARK, name, attrs)


def watch_dir(path: str | os.PathLike) -> None:
    """Sample the bytes in files under `path` (an offload directory) from now on."""
    rec = _recorder()
    if rec is not None:
        rec.watch_dir(os.fspath(path))


def annotate(**fields: Any) -> None:
    """Facts about this process for its meta.json (e.g. `rollout_memory_backend="torch_memory_saver"`),
    merged into `annotations` there; JSON values. A no-op without a recorder."""
    rec = _recorder()
    if rec is not None:
        rec.annotate(fields)


def samples_heap() -> bool:
    """Whether this process is recorded with glibc's heap in use (`record --heap`, probes/heap.py), so
    that `heap_baseline()` means something. Starts no recorder."""
    rec = recorder._active
    if rec is not None:
        return rec.samples_heap
    return bool(_env_run_dir) and os.environ.get(names.HEAP_ENV) == "1"


def heap_baseline() -> None:
    """Store the heap in use now as this process's `heap_baseline` annotation: the level the report
    measures a host forecast from (runmodel/forecast.py). Call it right before the program allocates what
    its forecast counts. A no-op unless the heap is sampled."""
    rec = _recorder()
    if rec is not None and rec.samples_heap:
        rec.annotate({"heap_baseline": heap_in_use()})


def account(category: str, nbytes: int, device: Any = names.ACCOUNT_HOST, owner: str = "") -> None:
    """Say that this program now holds `nbytes` of `category` (`weights`, `gradients`,
    `optimizer_state`, `kv_cache`, `cuda_graph`, `pinned_buffers`, `offloaded_state`, ...) on
    `device` ("host", "cuda:N", a torch.device). Absolute, not a delta: call it after each change;
    an unchanged value writes nothing. `owner` tells apart two holders of one category in one
    process (the actor's weights and the rollout engine's). A no-op without a recorder. See docs/ledger.md."""
    rec = _recorder()
    if rec is not None:
        # Refused here, counted and warned about like any bad count (never raised into the job):
        # a value over int64 fits no machine and no int64 column, and once written broke every report.
        rec._guarded("events", _checked_account, rec, category, nbytes, device, owner)


ACCOUNT_MAX_BYTES = 2 ** 63 - 1


def _checked_account(rec, category: str, nbytes: int, device: Any, owner: str) -> None:
    if isinstance(nbytes, int) and not isinstance(nbytes, bool) and nbytes > ACCOUNT_MAX_BYTES:
        raise ValueError(f"account({category!r}): {nbytes} bytes is more than any machine holds "
                         f"(at most 2**63 - 1); not recorded")
    rec.account(category, nbytes, device, owner)


def account_tensors(category: str, tensors, device: Any = None, owner: str = "") -> None:
    """`account()` for the storages behind `tensors` (each storage counted once; views and tied
    weights share one). Without `device`, each tensor's own device (a CPU tensor is "host"); a
    category whose tensors left a device is declared 0 there only if `device` names it."""
    rec = _recorder()
    if rec is None:
        return
    totals: dict[str, int] = {} if device is None else {recorder.device_key(device): 0}
    seen: set[tuple[str, int]] = set()
    for tensor in tensors:
        if tensor is None:
            continue
        storage = tensor.untyped_storage()
        where = recorder.device_key(tensor.device) if device is None else recorder.device_key(device)
        key = (where, storage.data_ptr())
        if storage.nbytes() == 0 or key in seen:
            totals.setdefault(where, 0)
            continue
        seen.add(key)
        totals[where] = totals.get(where, 0) + storage.nbytes()
    for where, nbytes in totals.items():
        rec.account(category, nbytes, where, owner)
