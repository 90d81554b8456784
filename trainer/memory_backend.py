"""How the rollout engine and the actor give device memory back and take it again.

Two backends (names in `miles_profile.names`):

- `builtin`: a released buffer's storage is resized to 0 and torch's cache emptied, so the bytes go back
  to the driver (host: unmapped, then `malloc_trim`); a resumed buffer is a new allocation at a new
  address, so CUDA graphs that point into it must be captured again.
- `torch_memory_saver` (CUDA only, when the package imports): buffers are allocated inside
  `torch_memory_saver.region(tag=...)`; release pauses the tag (the physical memory is unmapped, the
  virtual addresses stay), resume maps new memory at the same addresses, so graphs stay valid and are
  never captured again. With a CPU backup a pause copies the bytes to host memory first. The
  allocator's counters (`memory_allocated`/`memory_reserved`) do not see a pause; NVML and
  `mem_get_info` do.

Hook mode: `preload` when the process was started with the package's preload library in `LD_PRELOAD`
(then graph memory is captured with the package's own `cuda_graph` helper, as SGLang does, paused with
the `cuda_graph` tag and never captured again), else `torch` (a pluggable allocator). In torch mode the
package cannot pause graph memory (0.0.10 asserts "Only hook_mode=preload supports pauseable CUDA
Graph"; capturing inside a region freed 2 of 36 MiB on the H200), so graphs live in torch's private
pool and are dropped and captured again, as with builtin, while weights and KV are paused.

The CPU backups are retained across pauses (`retain_cpu_backup`): the package's default allocates and
pins a new host buffer at every pause, which moved the actor's 16.5 GiB at 2.6 GB/s (0.05x of one pinned
copy) on the H200, against 53.7 GB/s (0.97x) retained. Retained, the backup stays in host RSS after a
resume, exactly like the builtin backend's pinned buffers.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
from typing import ContextManager, Sequence

import torch

from miles_profile.names import BUILTIN, CUDA_GRAPH, KV_CACHE, MEMORY_BACKENDS, TORCH_MEMORY_SAVER, WEIGHTS
from trainer.errors import TrainerError
from trainer.flat import alloc_storage, free_storage, is_allocated, trim_host_heap

AUTO = "auto"
CHOICES = (AUTO, *MEMORY_BACKENDS)  # trainer/args.py spells the same without importing torch
_PRELOAD_LIB = "torch_memory_saver_hook_mode_preload"


def unavailable_reason(device: str) -> str | None:
    """Why torch_memory_saver cannot be used on `device` ("cpu"/"cuda"), or None when it can."""
    if device != "cuda":
        return "needs a CUDA device"
    if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        return "does not work with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    try:
        import torch_memory_saver  # noqa: F401
    except Exception as exc:  # not installed, or a build for another CUDA
        return (f"the package torch_memory_saver is not importable ({type(exc).__name__}: {exc}); "
                "install it with pip install 'torch-memory-saver>=0.0.10' (see docs/trainer.md)")
    return None


def resolve(choice: str, device: str) -> str:
    """`auto` -> torch_memory_saver on CUDA when it imports, else builtin; other choices unchanged."""
    if choice != AUTO:
        return choice
    return TORCH_MEMORY_SAVER if unavailable_reason(device) is None else BUILTIN


def preload_library() -> str | None:
    """The package's preload library (for LD_PRELOAD of a process we start), None if not found."""
    try:
        from torch_memory_saver.utils import get_binary_path_from_package  # optional: the cuda extra
        return str(get_binary_path_from_package(_PRELOAD_LIB))
    except Exception:  # not installed, or no build for this CUDA
        return None


def hook_mode() -> str:
    preload = os.environ.get("LD_PRELOAD", "").split(":")
    return "preload" if any(_PRELOAD_LIB in p for p in preload) else "torch"


_SAVER: list = []
# Tags are process-wide. Pausing a paused tag, or resuming one that holds an active allocation, makes
# the package exit the process; memory freed into a paused tag's pool and allocated again is unmapped.
# So each tag has one live owner at a time, and a tag is paused or resumed only through here.
_PAUSED: set[str] = set()
_OWNERS: dict[str, object] = {}


def claim(tags: Sequence[str], owner: object) -> None:
    taken = [t for t in tags if _OWNERS.get(t, owner) is not owner]
    if taken:
        raise TrainerError(f"torch_memory_saver tag(s) {taken} are held by another live engine or actor in this "
                           "process; close() it first")
    _OWNERS.update({t: owner for t in tags})


def unclaim(tags: Sequence[str], owner: object) -> None:
    """Resume what `owner` left paused (its buffers then go back to the pools active) and free its tags."""
    for t in tags:
        if _OWNERS.get(t) is owner:
            resume(t)
            del _OWNERS[t]


def saver():
    """The package's singleton, its hook mode set once, before its first use."""
    if not _SAVER:
        from torch_memory_saver import torch_memory_saver as tms  # optional: the cuda extra
        if tms._impl is None:  # the setter only works before the first region/pause
            tms.hook_mode = hook_mode()
        tms.retain_cpu_backup = True  # see the module docstring: 0.97x of a pinned copy instead of 0.05x
        if hook_mode() == "torch":
            atexit.register(_keep_pools_past_exit)
        _SAVER.append(tms)
    return _SAVER[0]


def _keep_pools_past_exit() -> None:
    """Torch hook mode: a pool destroyed at interpreter exit frees its blocks outside any region, which
    the package treats as fatal ("only support interesting region", exit status 1) after the program
    has finished (seen on the H200: every recorded run exited 1). The driver takes the memory back when
    the process ends, so the pools are never destroyed."""
    impl = getattr(_SAVER[0], "_impl", None) if _SAVER else None
    for pool in list(getattr(impl, "_mem_pools", {}).values()):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(pool))


def pause(tag: str) -> None:
    if tag in _PAUSED:
        return
    torch.cuda.synchronize()  # kernels still in flight may use the memory about to be unmapped
    saver().pause(tag)
    _PAUSED.add(tag)


def resume(tag: str) -> None:
    if tag not in _PAUSED:
        return
    saver().resume(tag)
    _PAUSED.discard(tag)


def is_paused(tag: str) -> bool:
    return tag in _PAUSED


def cpu_backup(t: torch.Tensor) -> torch.Tensor | None:
    """The host copy of a paused tensor allocated in a region with a CPU backup (a view, no copy)."""
    return saver().get_cpu_backup(t, zero_copy=True)


# --- the engine's side ----------------------------------------------------------------------------

class BuiltinMemory:
    name = BUILTIN
    keeps_graphs = False     # resumed buffers get new addresses: graphs into them must be recaptured
    backs_up_weights = False  # the engine keeps its own host copy when asked for one

    def region(self, tag: str, cpu_backup: bool = False) -> ContextManager:
        return contextlib.nullcontext()

    def graph(self, graph: "torch.cuda.CUDAGraph") -> ContextManager:
        # thread_local: the recorder's sampler thread may query the allocator during the capture.
        return torch.cuda.graph(graph, capture_error_mode="thread_local")

    def release(self, tag: str, tensors: Sequence[torch.Tensor]) -> None:
        for t in tensors:
            free_storage(t)
        trim_host_heap()

    def resume(self, tag: str, tensors: Sequence[torch.Tensor]) -> None:
        for t in tensors:
            alloc_storage(t)

    def held(self, tag: str, tensors: Sequence[torch.Tensor]) -> bool:
        return all(is_allocated(t) for t in tensors)

    def settle(self, device: torch.device) -> None:
        """Return what the releases freed to the driver, inside the call."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            # cuBLAS keeps a workspace (32 MiB + 1 MiB on Hopper) per stream it ran on, cached for the
            # life of the process: the graph's warm-up and capture streams each left one, the capture's
            # inside the graph's private pool, which it kept alive (measured on the H200: 66 of 130 MiB
            # came back without this, all of it with). torch's own CUDA-graph trees clear them too.
            clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear_workspaces is not None:
                clear_workspaces()
            torch.cuda.empty_cache()

    def close(self) -> None:
        pass


class SaverMemory:
    name = TORCH_MEMORY_SAVER
    backs_up_weights = True  # the `weights` region is made with enable_cpu_backup when asked
    TAGS = (WEIGHTS, KV_CACHE, CUDA_GRAPH)

    def __init__(self):
        claim(self.TAGS, self)
        # Graph memory is pausable only in preload mode (module docstring); in torch mode graphs are
        # dropped and captured again, as with builtin.
        self.keeps_graphs = hook_mode() == "preload"

    def region(self, tag: str, cpu_backup: bool = False) -> ContextManager:
        return saver().region(tag=tag, enable_cpu_backup=cpu_backup)

    def graph(self, graph: "torch.cuda.CUDAGraph") -> ContextManager:
        if self.keeps_graphs:
            return saver().cuda_graph(graph, tag=CUDA_GRAPH, capture_error_mode="thread_local")
        return torch.cuda.graph(graph, capture_error_mode="thread_local")

    def release(self, tag: str, tensors: Sequence[torch.Tensor]) -> None:
        pause(tag)

    def resume(self, tag: str, tensors: Sequence[torch.Tensor]) -> None:
        resume(tag)

    def held(self, tag: str, tensors: Sequence[torch.Tensor]) -> bool:
        return not is_paused(tag)

    def settle(self, device: torch.device) -> None:
        # A pause returns its own bytes; torch's cache (generate's activations) goes back as with builtin.
        if self.keeps_graphs:  # not cuBLAS's per-stream workspaces: the kept graphs recorded one
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
        else:
            BuiltinMemory.settle(self, device)

    def close(self) -> None:
        unclaim(self.TAGS, self)


def engine_memory(name: str) -> BuiltinMemory | SaverMemory:
    if name == TORCH_MEMORY_SAVER:
        return SaverMemory()
    if name == BUILTIN:
        return BuiltinMemory()
    raise ValueError(f"unknown memory backend {name!r}; choose from {', '.join(CHOICES[1:])}")
