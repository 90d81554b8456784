"""Parameters as views into one flat buffer.

Every offload in this trainer moves whole flat buffers: one big copy or a few chunked files instead of
hundreds of small tensors, and freeing a flat buffer's storage (`storage.resize_(0)`) really returns
its memory (a single large allocation: the CUDA allocator releases it on `empty_cache`, glibc unmaps it
on the host) while every view, `nn.Parameter` and optimizer reference stays valid for the onload.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn


@dataclass(frozen=True)
class Slot:
    name: str
    offset: int  # elements
    numel: int
    shape: tuple[int, ...]


class FlatParams:
    """Replaces `module`'s parameters by views into `self.flat` (uninitialised; the caller fills it)."""

    def __init__(self, module: nn.Module, device: torch.device, dtype: torch.dtype, requires_grad: bool):
        self.slots: list[Slot] = []
        offset = 0
        for name, p in module.named_parameters():
            self.slots.append(Slot(name, offset, p.numel(), tuple(p.shape)))
            offset += p.numel()
        self.numel = offset
        self.flat = torch.empty(offset, device=device, dtype=dtype)
        for slot, (_, view) in zip(self.slots, self.views(self.flat)):
            owner, attr = _owner(module, slot.name)
            setattr(owner, attr, nn.Parameter(view, requires_grad=requires_grad))

    def views(self, buffer: torch.Tensor, start: int = 0, end: int | None = None,
              buffer_start: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, view) for the slots inside elements [start, end) of a buffer with this layout whose
        first element is element `buffer_start` of the whole (a chunk read back from disk)."""
        end = self.numel if end is None else end
        base = buffer_start
        for s in self.slots:
            if start <= s.offset and s.offset + s.numel <= end:
                yield s.name, buffer[s.offset - base:s.offset - base + s.numel].view(s.shape)

    def chunk_ranges(self, max_bytes: int, itemsize: int) -> list[tuple[int, int]]:
        """Element ranges covering the buffer, cut at slot boundaries, each <= max_bytes unless one
        slot alone is larger. Offload chunks and weight updates share them, so a chunk read back from
        disk always holds whole parameters."""
        ranges, start = [], 0
        for s in self.slots:
            end = s.offset + s.numel
            if (end - start) * itemsize > max_bytes and s.offset > start:
                ranges.append((start, s.offset))
                start = s.offset
        ranges.append((start, self.numel))
        return ranges


def _owner(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attr = name.rpartition(".")
    return (module.get_submodule(path) if path else module), attr


def is_allocated(t: torch.Tensor) -> bool:
    return t.untyped_storage().nbytes() > 0


def free_storage(t: torch.Tensor) -> None:
    """Drop `t`'s memory; its views survive with an empty storage until `alloc_storage`."""
    t.untyped_storage().resize_(0)


def alloc_storage(t: torch.Tensor) -> None:
    """Give `t` its memory back (contents undefined) after `free_storage`."""
    t.untyped_storage().resize_(t.numel() * t.element_size())


def check_flat(t: torch.Tensor) -> None:
    """Offload moves whole storages: a tensor must be the only user of its storage."""
    if not (t.dim() == 1 and t.is_contiguous() and t.storage_offset() == 0
            and t.untyped_storage().nbytes() == t.numel() * t.element_size()):
        raise ValueError("offloadable tensors must be 1-D and own their whole storage")


def trim_host_heap() -> None:
    """Return freed host pages to the OS now. glibc raises its mmap threshold after a free (up to
    32 MiB), so a later buffer below that size may live on the heap, where `free` alone keeps the
    pages; `malloc_trim(0)` hands them back. A no-op where glibc is absent."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


_LIBC: list = []


def _libc():
    if not _LIBC:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.append(lib if hasattr(lib, "malloc_trim") else None)
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]
