"""Where training state goes when it leaves the device: host memory or disk.

The state is a list of `StateTensor`s, each a flat buffer that owns its storage (see `flat`). Offload
frees the storage (`resize_(0)`), so every view, parameter and optimizer reference survives; onload
gives it back and restores the bytes. A tensor with a `mirror` (the host copy of the weights kept by a
host-side optimizer, identical after every step) is freed without being saved and restored from it.

- `HostOffloader` (target cpu): one host buffer per device tensor, allocated and pinned once (CUDA),
  reused every cycle. Host tensors stay where they are, so on a CPU run nothing moves.
- `DiskOffloader` (target disk): every tensor, host ones included (disk offload exists to free host
  memory), goes to chunk files (`disk_store`) written by a small thread pool; device tensors pass
  through reused pinned staging buffers. Memory is freed only once every chunk and the manifest are on
  disk, so any write error leaves the state intact. Onload first checks that the manifest lists exactly
  the chunks written (every element of every tensor once), then reads and verifies each chunk; any
  damage is an `OffloadError` and leaves the state offloaded, so onload can be retried.
- `SaverOffloader` (target cpu, backend torch_memory_saver, CUDA): the device state was allocated in a
  region tagged `train_state` with a CPU backup; offload pauses the tag (the package copies the bytes
  to a host buffer and unmaps the device memory), onload resumes it at the same addresses, as Miles'
  Megatron actor sleeps and wakes.
"""
from __future__ import annotations

import errno
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from miles_profile.names import BUILTIN, OFFLOADED_STATE, PINNED_BUFFERS, TORCH_MEMORY_SAVER, TRAIN_STATE
from trainer import disk_store, memory_backend
from trainer.disk_store import ChunkEntry
from trainer.errors import OffloadError
from trainer.flat import alloc_storage, check_flat, free_storage, trim_host_heap


@dataclass(frozen=True)
class StateTensor:
    name: str
    tensor: torch.Tensor
    chunks: list[tuple[int, int]]  # element ranges, cut at parameter boundaries
    mirror: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()


def host_buffer(like: torch.Tensor) -> torch.Tensor:
    """A host tensor shaped like `like`; page-locked when `like` is on CUDA. Allocated by torch and
    registered with CUDA, rather than taken from the pinned caching allocator, which rounds every
    request up to a power of two (a 4.4 GB buffer would pin 8 GiB)."""
    buf = torch.empty(like.shape, dtype=like.dtype)
    if like.device.type == "cuda" and not pin_in_place(buf):
        buf = torch.empty(like.shape, dtype=like.dtype, pin_memory=True)
    return buf


# Registered buffers by data pointer, kept alive here until `unpin`. Memory freed while still
# registered leaves its range registered to the *old* physical pages: once glibc returns them
# (free, malloc_trim), a new buffer at that address reads as pinned, and DMA copies from it read the
# stale pages, not what the program wrote (the H200's 1e-2 host-optimizer mismatch: the disk offload
# freed the registered master weights). So every free of a registered buffer goes through `unpin`.
_REGISTERED: dict[int, torch.Tensor] = {}


def pin_in_place(buf: torch.Tensor) -> bool:
    """Page-lock `buf`'s own memory (cudaHostRegister); False if CUDA refused, `buf` unchanged."""
    if buf.data_ptr() in _REGISTERED:
        return True
    try:
        err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), buf.numel() * buf.element_size(), 0)
    except (AttributeError, RuntimeError):
        return False
    if int(err) != 0:
        _clear_cuda_error()
        return False
    _REGISTERED[buf.data_ptr()] = buf
    if buf.is_pinned():
        return True
    unpin(buf)
    return False


def _clear_cuda_error() -> None:
    """A failed runtime call leaves its error as the thread's 'last error', which torch would raise at
    the next unrelated kernel launch; a launch here reads and clears it."""
    try:
        torch.zeros(1, device="cuda")
    except Exception:
        pass


def is_registered(buf: torch.Tensor) -> bool:
    return buf.data_ptr() in _REGISTERED


def unpin(buf: torch.Tensor) -> None:
    """Unregister a buffer pinned by `host_buffer` before it is freed (else its pages stay locked)."""
    if _REGISTERED.pop(buf.data_ptr(), None) is not None:
        torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())


def _free(t: torch.Tensor) -> bool:
    """Free a state tensor's memory, unregistering it first if it is a registered host buffer;
    True if it was, so `_realloc` registers the new memory again."""
    registered = t.device.type == "cpu" and is_registered(t)
    if registered:
        unpin(t)
    free_storage(t)
    return registered


def _realloc(t: torch.Tensor, pinned: bool) -> None:
    alloc_storage(t)
    if pinned:
        pin_in_place(t)  # if CUDA refuses, the buffer stays pageable: slower copies, same bytes


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _return_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    trim_host_heap()


class HostOffloader:
    target, backend = "cpu", BUILTIN

    def __init__(self, state: list[StateTensor]):
        for s in state:
            check_flat(s.tensor)
        self.state = [s for s in state if s.tensor.device.type != "cpu"]
        self._host: dict[str, torch.Tensor] = {}
        self.offloaded = False

    def expected_bytes(self) -> int:
        return sum(s.nbytes for s in self.state)

    def offload(self) -> None:
        for s in self.state:
            if s.mirror is None:
                if s.name not in self._host:
                    self._host[s.name] = host_buffer(s.tensor)
                self._host[s.name].copy_(s.tensor, non_blocking=True)
        for s in self.state:
            _sync(s.tensor.device)
            free_storage(s.tensor)
        self.offloaded = True
        if self.state:
            _return_memory(self.state[0].tensor.device)

    def onload(self) -> None:
        for s in self.state:
            alloc_storage(s.tensor)
            s.tensor.copy_(s.mirror if s.mirror is not None else self._host[s.name], non_blocking=True)
        for s in self.state:
            _sync(s.tensor.device)
        self.offloaded = False

    def close(self) -> None:
        for buf in self._host.values():
            unpin(buf)
        self._host.clear()

    def host_bytes(self) -> dict[str, int]:
        """Its host buffers for the ledger: the offloaded state while offloaded, else idle pinned buffers."""
        held = sum(b.untyped_storage().nbytes() for b in self._host.values())
        return {OFFLOADED_STATE: held if self.offloaded else 0, PINNED_BUFFERS: 0 if self.offloaded else held}

    def host_copy(self, name: str) -> torch.Tensor | None:
        """The host tensor holding `name`'s bytes while offloaded (None: read the tensor itself)."""
        s = next((s for s in self.state if s.name == name), None)
        if not self.offloaded or s is None:
            return None
        return s.mirror if s.mirror is not None else self._host[s.name]


class DiskOffloader:
    target, backend = "disk", BUILTIN

    def __init__(self, state: list[StateTensor], directory: Path, workers: int | None = None):
        for s in state:
            check_flat(s.tensor)
        # Enough threads to overlap checksums with I/O; each staged one holds a chunk-sized pinned buffer.
        self.workers = workers or max(4, min(8, os.cpu_count() or 4))
        self.state, self.directory = state, Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._staging: list[torch.Tensor | None] = []  # pinned on CUDA, allocated once, reused
        self._pinned: set[str] = set()  # registered host tensors freed by offload, registered again by onload
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="offload-io")
        self._cleanup: Future = self._pool.submit(lambda: None)
        self._written: frozenset[ChunkEntry] | None = None  # what the last offload put on disk
        self.offloaded = False

    def expected_bytes(self) -> int:
        device = next((s.tensor.device for s in self.state if s.tensor.device.type != "cpu"), None)
        return sum(s.nbytes for s in self.state if device is None or s.tensor.device == device)

    def disk_bytes(self) -> int:
        return sum(s.nbytes for s in self.state if s.mirror is None)

    # --- offload --------------------------------------------------------------------------------

    def offload(self) -> None:
        self._cleanup.result()
        try:
            self._remove_files()  # the state in memory is newer than any copy on disk
            self._check_space()
            self._written = None
            entries = self._write_all()
            disk_store.write_manifest(self.directory, entries)
            self._written = frozenset(entries)
        except OSError as exc:
            self._remove_files(ignore_errors=True)
            raise OffloadError(self._describe(exc)) from None
        for s in self.state:  # only now: every byte is on disk
            if _free(s.tensor):
                self._pinned.add(s.name)
        self.offloaded = True
        _return_memory(self.state[0].tensor.device)

    def _write_all(self) -> list[ChunkEntry]:
        jobs: list[Future] = []
        slots: dict[int, Future] = {}  # staging slot -> the write that last used it
        try:
            for i, (s, start, end) in enumerate(self._chunks()):
                path = self.directory / f"{s.name}.{i:05d}.safetensors"
                src, slot = s.tensor[start:end], len(jobs) % self.workers
                if src.device.type != "cpu":  # through a pinned staging buffer, once it is free again
                    if slot in slots:
                        slots[slot].result()
                    staged = self._stage(slot, src.numel(), src.dtype)
                    staged.copy_(src)
                    src = staged
                jobs.append(self._pool.submit(disk_store.write_chunk, path, src, s.name, start))
                if s.tensor.device.type != "cpu":
                    slots[slot] = jobs[-1]
            return [job.result() for job in jobs]
        finally:
            wait(jobs)  # every writer is done before the caller deletes files or frees memory

    def _check_space(self) -> None:
        need = self.disk_bytes()
        free = shutil.disk_usage(self.directory).free
        if free < need:
            raise OffloadError(f"offload dir {self.directory} is full: the training state needs {need} "
                               f"bytes, {free} are free; nothing was moved")

    def _describe(self, exc: OSError) -> str:
        where = f"offload dir {self.directory}"
        if exc.errno == errno.ENOSPC:
            return f"{where} is full ({exc.filename}: {exc.strerror}); the state stays in memory"
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return f"{where} is not writable ({exc.strerror}); the state stays in memory"
        return f"writing to {where} failed ({exc.filename}: {exc.strerror}); the state stays in memory"

    # --- onload ---------------------------------------------------------------------------------

    def onload(self) -> None:
        entries = self._manifest()  # before any memory is touched: a bad manifest changes nothing
        by_name = {s.name: s for s in self.state}
        for s in self.state:
            _realloc(s.tensor, s.name in self._pinned)
        try:
            self._read_all(entries, by_name)
        except BaseException:
            for s in self.state:  # the state is still offloaded: the disk copy is the only copy
                _free(s.tensor)
            raise
        self._pinned.clear()
        for s in self.state:
            if s.mirror is not None:
                s.tensor.copy_(s.mirror)
        _sync(self.state[0].tensor.device)
        self.offloaded = False
        # Stale now: delete in the background (a failure costs only disk space); offload waits for it.
        self._cleanup = self._pool.submit(self._remove_files, True)

    def _read_all(self, entries: list[ChunkEntry], by_name: dict[str, StateTensor]) -> None:
        jobs: list[Future] = []
        staged: dict[int, tuple[Future, torch.Tensor, torch.Tensor]] = {}  # slot -> read, buffer, dest
        try:
            for e in entries:
                dst = by_name[e.tensor].tensor[e.start:e.start + e.numel]
                path = self.directory / e.file
                if dst.device.type == "cpu":
                    jobs.append(self._pool.submit(disk_store.read_chunk, path, e, dst))
                    continue
                slot = len(jobs) % self.workers
                if slot in staged:
                    _finish_read(*staged.pop(slot))
                buf = self._stage(slot, dst.numel(), dst.dtype)
                jobs.append(self._pool.submit(disk_store.read_chunk, path, e, buf))
                staged[slot] = (jobs[-1], buf, dst)
            for item in staged.values():
                _finish_read(*item)
            for job in jobs:
                job.result()
        finally:
            wait(jobs)  # no reader may still be writing into memory the caller is about to free

    def iter_chunks(self, name: str) -> Iterator[tuple[int, torch.Tensor]]:
        """(start element, verified host tensor) for each chunk of `name` (or of its mirror) while
        offloaded; the tensor is a reused buffer, valid until the next item."""
        s = next(s for s in self.state if s.name == name)
        source = name if s.mirror is None else next(m.name for m in self.state if m.tensor is s.mirror)
        for e in self._manifest():
            if e.tensor == source:
                buf = self._stage(0, e.numel, s.tensor.dtype)
                disk_store.read_chunk(self.directory / e.file, e, buf)
                yield e.start, buf
        if self._staging and not self._staging[0].is_pinned():
            self._staging[0] = None  # a CPU run frees it: pinned staging is kept only to avoid re-pinning

    # --- helpers --------------------------------------------------------------------------------

    def host_bytes(self) -> dict[str, int]:
        """Its staging buffers for the ledger (the state itself is on disk while offloaded)."""
        return {PINNED_BUFFERS: sum(b.untyped_storage().nbytes() for b in self._staging if b is not None),
                OFFLOADED_STATE: 0}

    def _manifest(self) -> list[ChunkEntry]:
        """The manifest on disk, checked to cover every offloaded element exactly once and to list
        exactly the chunks (files and checksums) that the last offload wrote."""
        entries = disk_store.read_manifest(self.directory)
        layout = {s.name: (s.tensor.numel(), disk_store.dtype_name(s.tensor.dtype))
                  for s in self.state if s.mirror is None}
        disk_store.check_coverage(self.directory, entries, layout)
        if self._written is not None and frozenset(entries) != self._written:
            differ = len(self._written.symmetric_difference(entries))
            raise OffloadError(f"offload manifest {self.directory / disk_store.MANIFEST} is not the one "
                               f"written at offload ({differ} entries differ in file or checksum)")
        return entries

    def _chunks(self) -> Iterator[tuple[StateTensor, int, int]]:
        for s in self.state:
            if s.mirror is None:
                for start, end in s.chunks:
                    yield s, start, end

    def _stage(self, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A reused host buffer (pinned on a CUDA run) of the largest chunk's size, as `numel` x `dtype`."""
        while len(self._staging) <= slot:
            self._staging.append(None)
        if self._staging[slot] is None:
            size = max((e - b) * s.tensor.element_size() for s in self.state for b, e in s.chunks)
            on_cuda = any(s.tensor.device.type == "cuda" for s in self.state)
            buf = torch.empty(size, dtype=torch.uint8)
            if on_cuda and not pin_in_place(buf):
                buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            self._staging[slot] = buf
        itemsize = torch.empty((), dtype=dtype).element_size()
        return self._staging[slot][:numel * itemsize].view(dtype)

    def _remove_files(self, ignore_errors: bool = False) -> None:
        try:
            for path in [*self.directory.glob("*.safetensors"), self.directory / disk_store.MANIFEST]:
                path.unlink(missing_ok=True)
        except OSError:
            if not ignore_errors:
                raise

    def close(self) -> None:
        self._cleanup.result()
        self._pool.shutdown(wait=True)
        for buf in self._staging:
            if buf is not None:
                unpin(buf)
        self._staging.clear()
        if not self.offloaded:
            self._remove_files(ignore_errors=True)


class SaverOffloader:
    """The state's device tensors must have been allocated inside `region()`."""

    target, backend = "cpu", TORCH_MEMORY_SAVER

    def __init__(self, state: list[StateTensor], owner: object):
        self.state = [s for s in state if s.tensor.device.type != "cpu"]
        self._owner = owner
        self.offloaded = False
        self.backed_up = False  # the package's CPU backup exists once a pause made it

    @staticmethod
    def region(owner: object):
        """Where the actor allocates its device state; claims the tag for `owner` until `close()`."""
        memory_backend.claim([TRAIN_STATE], owner)
        return memory_backend.saver().region(tag=TRAIN_STATE, enable_cpu_backup=True)

    def expected_bytes(self) -> int:
        return sum(s.nbytes for s in self.state)

    def offload(self) -> None:
        memory_backend.pause(TRAIN_STATE)
        self.offloaded = self.backed_up = True
        torch.cuda.empty_cache()  # the training step's cached activations go too, as with builtin

    def onload(self) -> None:
        memory_backend.resume(TRAIN_STATE)
        self.offloaded = False

    def host_bytes(self) -> dict[str, int]:
        """The package's CPU backup holds the state while paused, and stays allocated after the resume
        (torch_memory_saver #90: on the H200 the host's RssShmem kept all of it through every train
        phase), so from the first pause on it is pinned host memory."""
        held = self.expected_bytes() if self.backed_up else 0
        return {OFFLOADED_STATE: held if self.offloaded else 0, PINNED_BUFFERS: 0 if self.offloaded else held}

    def host_copy(self, name: str) -> torch.Tensor | None:
        """The CPU backup of `name` while paused (a view into the package's buffer)."""
        s = next((s for s in self.state if s.name == name), None)
        if not self.offloaded or s is None:
            return None
        return s.mirror if s.mirror is not None else memory_backend.cpu_backup(s.tensor)

    def close(self) -> None:
        memory_backend.unclaim([TRAIN_STATE], self._owner)  # resumes first: a paused buffer is never freed
        self.offloaded = False


def _finish_read(job: Future, buf: torch.Tensor, dst: torch.Tensor) -> None:
    job.result()
    dst.copy_(buf)  # staging (pinned host) -> device
