"""Chunk files for disk offload: safetensors format, a CRC-32 per chunk, a manifest written last.

Each chunk file is a valid safetensors file holding one 1-D tensor named "data", its CRC-32 and origin
in the header metadata. The data is written from, and read into, the caller's memory with no
intermediate copy. `manifest.json` (written atomically after every chunk is on disk) lists the chunks
and their checksums; a directory without it holds no valid copy.

At onload nothing is trusted: the manifest must be a well-formed list of entries that tiles every
offloaded tensor exactly (`check_coverage`), each chunk file a regular file of exactly the expected
size whose header is byte for byte the one written for its entry, and its data must match the CRC-32.
Any damage is one `OffloadError` line.

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
import re
import stat
import struct
import zlib
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from trainer.errors import OffloadError

MANIFEST = "manifest.json"
FORMAT, VERSION = "miles-trainer-offload", 1
BLOCK = 1024 * 1024  # I/O and checksum step: small enough to stay in a core's cache
_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64",
           torch.uint8: "U8"}
# A manifest has one ~150-byte entry per chunk and chunks hold whole parameters: a few hundred entries.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
_CHUNK_FILE = re.compile(r"[\w.-]+\.safetensors")  # a plain name in the directory, never a path


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


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPES[dtype]


def read_chunk(path: Path, entry: ChunkEntry, dst: torch.Tensor) -> None:
    """Read a chunk into `dst` (contiguous, host, entry.numel elements) and check its CRC-32, block by
    block while each block is still in the CPU cache. The file must be exactly the one written for
    `entry`: its size and header are checked before a byte lands in `dst`."""
    body = byte_view(dst)
    header = _header(entry, len(body))
    fd = _open_regular(path, "offload chunk")
    try:
        size = os.fstat(fd).st_size
        if size != len(header) + len(body):
            state = "is truncated" if size < len(header) + len(body) else "has trailing bytes"
            raise OffloadError(f"offload chunk {path} {state}: {size} bytes, expected "
                               f"{len(header) + len(body)}")
        found = os.pread(fd, len(header), 0)
        if found != header:
            raise OffloadError(f"offload chunk {path} has {_header_mismatch(found, header)}")
        os.lseek(fd, len(header), os.SEEK_SET)
        crc = 0
        for offset in range(0, len(body), BLOCK):
            block = body[offset:offset + BLOCK]
            if _read_all(fd, block) != len(block):
                raise OffloadError(f"offload chunk {path} is truncated")
            crc = zlib.crc32(block, crc)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as exc:
        raise OffloadError(f"offload chunk {path} cannot be read: {exc.strerror or exc}") from None
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
    """The manifest's entries, each well-formed; whether they cover the state is `check_coverage`'s."""
    path = directory / MANIFEST
    fd = _open_regular(path, "offload manifest")
    try:
        size = os.fstat(fd).st_size
        if size > MAX_MANIFEST_BYTES:
            raise OffloadError(f"offload manifest {path} is {size} bytes, more than any manifest")
        raw = os.read(fd, MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise OffloadError(f"offload manifest {path} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: absurdly nested JSON
        raise OffloadError(f"offload manifest {path} is not valid JSON") from None
    if not (isinstance(doc, dict) and doc.get("format") == FORMAT and _is_int(doc.get("version"))
            and doc["version"] == VERSION and isinstance(doc.get("chunks"), list)):
        raise OffloadError(f"offload manifest {path} is not a {FORMAT} version {VERSION} manifest")
    entries = []
    for i, item in enumerate(doc["chunks"]):
        problem = _entry_problem(item)
        if problem:
            raise OffloadError(f"offload manifest {path}: chunk entry {i} {problem}")
        entries.append(ChunkEntry(**item))
    return entries


def check_coverage(directory: Path, entries: list[ChunkEntry], layout: dict[str, tuple[int, str]]) -> None:
    """Raise unless `entries` tile each tensor of `layout` (name -> (numel, dtype name)) exactly:
    every element in one chunk, no element twice, no chunk of anything else, no file listed twice."""
    where = f"offload manifest {directory / MANIFEST}"
    by_tensor: dict[str, list[ChunkEntry]] = defaultdict(list)
    files: set[str] = set()
    for e in entries:
        if e.file in files:
            raise OffloadError(f"{where} lists {e.file} twice")
        if e.tensor not in layout:
            raise OffloadError(f"{where} lists {e.file} for {e.tensor!r}, which is no offloaded tensor")
        files.add(e.file)
        by_tensor[e.tensor].append(e)
    for name, (numel, dtype) in layout.items():
        covered = 0
        for e in sorted(by_tensor[name], key=lambda e: (e.start, e.numel)):
            if e.dtype != dtype:
                raise OffloadError(f"{where}: {e.file} holds {e.dtype}, {name} is {dtype}")
            if e.start > covered:
                raise OffloadError(f"{where}: elements {covered}..{e.start} of {name} are in no chunk")
            if e.start < covered:
                raise OffloadError(f"{where}: {e.file} overlaps elements {e.start}..{covered} of {name}")
            covered = e.start + e.numel
        if covered < numel:
            raise OffloadError(f"{where}: elements {covered}..{numel} of {name} are in no chunk")
        if covered > numel:
            raise OffloadError(f"{where}: chunks of {name} end at element {covered}, past its {numel}")


_FIELDS = {f.name for f in fields(ChunkEntry)}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entry_problem(item) -> str | None:
    if not isinstance(item, dict) or set(item) != _FIELDS:
        return f"is not an object with exactly the fields {', '.join(sorted(_FIELDS))}"
    if not (isinstance(item["file"], str) and _CHUNK_FILE.fullmatch(item["file"])):
        return f"names file {str(item['file'])[:80]!r}, not a chunk file in the directory"
    if not (isinstance(item["tensor"], str) and item["dtype"] in _DTYPES.values()):
        return "has a bad tensor name or dtype"
    if not all(_is_int(item[k]) and item[k] >= 0 for k in ("start", "numel", "crc32")):
        return "has a start, numel or crc32 that is not a non-negative integer"
    if item["crc32"] >= 2**32:
        return "has a crc32 wider than 32 bits"
    return None


def _header(entry: ChunkEntry, nbytes: int) -> bytes:
    meta = {"tensor": entry.tensor, "start": str(entry.start), "crc32": f"{entry.crc32:08x}"}
    doc = {"__metadata__": meta, "data": {"dtype": entry.dtype, "shape": [entry.numel],
                                          "data_offsets": [0, nbytes]}}
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
    return struct.pack("<Q", len(raw)) + raw


def _header_mismatch(found: bytes, expected: bytes) -> str:
    """What differs between a chunk's header and the one its manifest entry implies, in a few words."""
    if len(found) < len(expected):
        return "a truncated header"
    (length,) = struct.unpack("<Q", found[:8])
    if length != len(expected) - 8:
        return f"a corrupted header: length {length}, expected {len(expected) - 8}"
    try:
        got = _header_fields(json.loads(found[8:]))
    except (ValueError, RecursionError):
        return "a corrupted header: not valid JSON"
    want = _header_fields(json.loads(expected[8:]))
    for key in want:
        if got[key] != want[key]:
            return (f"a header that does not match its manifest entry: {key} {repr(got[key])[:80]}, "
                    f"expected {want[key]!r}")
    return "a header that does not match its manifest entry"


def _header_fields(doc) -> dict:
    meta = doc.get("__metadata__") if isinstance(doc, dict) else None
    data = doc.get("data") if isinstance(doc, dict) else None
    meta, data = (meta if isinstance(meta, dict) else {}), (data if isinstance(data, dict) else {})
    return {"tensor": meta.get("tensor"), "start": meta.get("start"), "crc32": meta.get("crc32"),
            "dtype": data.get("dtype"), "shape": data.get("shape"), "data_offsets": data.get("data_offsets")}


def _open_regular(path: Path, what: str) -> int:
    """A read-only descriptor of a regular file. O_NONBLOCK: opening a FIFO must not wait for a writer
    (it has no effect on reads from a regular file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise OffloadError(f"{what} {path} cannot be opened: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OffloadError(f"{what} {path} is not a regular file")
    return fd


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
