"""Chunk files for disk offload: safetensors format, a CRC-32 per chunk, a manifest written last.

Each chunk file is a valid safetensors file holding one 1-D tensor named "data", its CRC-32 and origin
in the header metadata. The data is written from, and read into, the caller's memory with no
intermediate copy. `manifest.json` (written atomically after every chunk is on disk) lists the chunks
and their checksums; a directory without it holds no valid copy.

"Verified" before the caller may free memory means: every byte written, `fsync` returned, the size on
disk matches. Reading the file back at that point would only read the page cache, so it would prove
nothing about the medium; the checksum is checked at every read instead. After `fsync` the pages are
dropped from the page cache (POSIX_FADV_DONTNEED): disk offload exists to free host memory, and the
cache would otherwise hold a second host copy of the state.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import struct
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from trainer.errors import OffloadError

MANIFEST = "manifest.json"
FORMAT, VERSION = "miles-trainer-offload", 1
BLOCK = 1024 * 1024  # I/O and checksum step: small enough to stay in a core's cache
_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64",
           torch.uint8: "U8"}


@dataclass(frozen=True)
class ChunkEntry:
    file: str
    tensor: str
    start: int  # first element of the chunk within its tensor
    numel: int
    dtype: str
    crc32: int


def byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous host tensor, without a copy. Not through `.numpy()`: that marks the
    storage non-resizable for good, and offload frees storages by resizing them. The caller keeps `t`
    alive while the view is in use."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("byte_view needs a contiguous host tensor")
    nbytes = t.numel() * t.element_size()
    return memoryview((ctypes.c_ubyte * nbytes).from_address(t.data_ptr())).cast("B")


def write_chunk(path: Path, data: torch.Tensor, tensor: str, start: int) -> ChunkEntry:
    """Write `data` (contiguous, host) to `path`; returns its manifest entry once it is on disk.
    The CRC is computed block by block just before each block is written, while the block is in the
    CPU cache; the header, whose width does not depend on the CRC, is rewritten at the end."""
    body = byte_view(data)
    entry = ChunkEntry(path.name, tensor, start, data.numel(), _DTYPES[data.dtype], 0)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        header = _header(entry, len(body))
        _write_all(fd, header)
        crc = 0
        for offset in range(0, len(body), BLOCK):
            block = body[offset:offset + BLOCK]
            crc = zlib.crc32(block, crc)
            _write_all(fd, block)
        entry = ChunkEntry(path.name, tensor, start, data.numel(), entry.dtype, crc)
        os.pwrite(fd, _header(entry, len(body)), 0)
        os.fsync(fd)
        if os.fstat(fd).st_size != len(header) + len(body):
            raise OSError(errno.EIO, "size on disk differs from bytes written", str(path))
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return entry


def read_chunk(path: Path, entry: ChunkEntry, dst: torch.Tensor) -> None:
    """Read a chunk into `dst` (contiguous, host, entry.numel elements) and check its CRC-32, block by
    block while each block is still in the CPU cache."""
    body = byte_view(dst)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise OffloadError(f"offload chunk {path} cannot be opened: {exc.strerror}") from None
    try:
        header_len = _read_header_len(fd, path, len(body))
        os.lseek(fd, 8 + header_len, os.SEEK_SET)
        crc = 0
        for offset in range(0, len(body), BLOCK):
            block = body[offset:offset + BLOCK]
            if _read_all(fd, block) != len(block):
                raise OffloadError(f"offload chunk {path} is truncated")
            crc = zlib.crc32(block, crc)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if crc != entry.crc32:
        raise OffloadError(f"offload chunk {path} is corrupted: CRC-32 {crc:08x}, expected "
                           f"{entry.crc32:08x}; the training state in it cannot be restored")


def write_manifest(directory: Path, entries: list[ChunkEntry]) -> None:
    tmp = directory / (MANIFEST + ".tmp")
    doc = {"format": FORMAT, "version": VERSION, "chunks": [asdict(e) for e in entries]}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, json.dumps(doc).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / MANIFEST)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself must survive a crash
    finally:
        os.close(dir_fd)


def read_manifest(directory: Path) -> list[ChunkEntry]:
    try:
        doc = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise OffloadError(f"offload manifest in {directory} is missing or unreadable: {exc}") from None
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise OffloadError(f"offload manifest in {directory} has an unknown format")
    return [ChunkEntry(**c) for c in doc["chunks"]]


def _header(entry: ChunkEntry, nbytes: int) -> bytes:
    meta = {"tensor": entry.tensor, "start": str(entry.start), "crc32": f"{entry.crc32:08x}"}
    doc = {"__metadata__": meta, "data": {"dtype": entry.dtype, "shape": [entry.numel],
                                          "data_offsets": [0, nbytes]}}
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
    return struct.pack("<Q", len(raw)) + raw


def _read_header_len(fd: int, path: Path, nbytes: int) -> int:
    head = os.read(fd, 8)
    if len(head) != 8:
        raise OffloadError(f"offload chunk {path} is truncated")
    (header_len,) = struct.unpack("<Q", head)
    try:
        header = json.loads(os.read(fd, header_len))
        end = header["data"]["data_offsets"][1]
    except (ValueError, KeyError, TypeError, IndexError):
        raise OffloadError(f"offload chunk {path} has a corrupted header") from None
    if end != nbytes:
        raise OffloadError(f"offload chunk {path} holds {end} bytes, expected {nbytes}")
    return header_len


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]  # Linux writes at most ~2 GiB per call


def _read_all(fd: int, body: memoryview) -> int:
    done = 0
    while done < len(body):
        n = os.readv(fd, [body[done:]])
        if n == 0:
            break
        done += n
    return done
