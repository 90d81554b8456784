"""Damaged disk offload (trainer/disk_store.py, DiskOffloader): real chunk files written by a real
DiskOffloader on CPU are damaged one way at a time; each damage must be one OffloadError line, leave the
state offloaded (nothing half-restored), fail the same way on a retry, and once the files are repaired
the onload must give back the state bit for bit."""
from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, python_env
from trainer import disk_store
from trainer.actor import Actor
from trainer.config import ModelConfig
from trainer.errors import OffloadError
from trainer.flat import is_allocated

CFG = ModelConfig(vocab_size=16, d_model=32, n_layer=2, n_head=4, max_seq_len=10)


def _fill(actor: Actor, seed: int) -> None:
    """Random values in every buffer: a pattern that no zeroed or uninitialised onload reproduces
    (a training step would leave the gradients at zero). A mirrored tensor equals its mirror, as after
    every optimizer step."""
    g = torch.Generator().manual_seed(seed)
    for s in actor.state:
        s.tensor.copy_(torch.randn(s.tensor.numel(), generator=g))
    for s in actor.state:
        if s.mirror is not None:
            s.tensor.copy_(s.mirror)


def _snapshot(actor: Actor) -> dict[str, torch.Tensor]:
    return {s.name: s.tensor.clone() for s in actor.state}


def _assert_same(actor: Actor, snap: dict[str, torch.Tensor]) -> None:
    for s in actor.state:
        assert torch.equal(s.tensor, snap[s.name]), s.name  # bit for bit (the state is NaN-free)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def _restore(directory: Path, files: dict[str, bytes]) -> None:
    """Put back exactly the files the offload wrote: whatever a damage left (a directory, a FIFO, a
    link, an extra file) goes first."""
    for p in directory.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    for name, data in files.items():
        (directory / name).write_bytes(data)


@dataclass
class Offloaded:
    actor: Actor
    dir: Path
    snap: dict[str, torch.Tensor]
    files: dict[str, bytes]


@pytest.fixture
def offloaded(tmp_path):
    """An actor whose whole state (with a host optimizer: a mirrored tensor too) is on disk in ~70
    chunks of at most 12 KiB."""
    directory = tmp_path / "off"
    actor = Actor(CFG, torch.device("cpu"), lr=1e-2, seed=0, use_critic=False, optimizer_cpu_offload=True,
                  micro_batch_size=16, offload_target="disk", disk_dir=directory, chunk_bytes=8192)
    _fill(actor, 0)
    snap = _snapshot(actor)
    actor.offload()
    yield Offloaded(actor, directory, snap, _files(directory))
    actor.close()


# --- damages ----------------------------------------------------------------------------------------

def _doc(d: Path) -> dict:
    return json.loads((d / disk_store.MANIFEST).read_text())


def _edit(change):
    """A damage that edits the manifest's JSON document in place."""
    def damage(d: Path) -> None:
        doc = _doc(d)
        change(doc)
        (d / disk_store.MANIFEST).write_text(json.dumps(doc))
    return damage


def _replace_manifest(raw: bytes):
    return lambda d: (d / disk_store.MANIFEST).write_bytes(raw)


def _of(doc: dict, tensor: str) -> list[dict]:
    return [c for c in doc["chunks"] if c["tensor"] == tensor]


def _drop(tensor: str, which: int):
    return _edit(lambda doc: doc["chunks"].remove(_of(doc, tensor)[which]))


def _set(field: str, value, which: int = 0):
    return _edit(lambda doc: doc["chunks"][which].__setitem__(field, value))


def _set_entry(value):
    return _edit(lambda doc: doc["chunks"].__setitem__(0, value))


def _grow(which: int, field: str, by: int):
    return _edit(lambda doc: doc["chunks"][which].__setitem__(field, doc["chunks"][which][field] + by))


def _swap_names(doc: dict) -> None:
    a, b = doc["chunks"][0], doc["chunks"][1]
    a["file"], b["file"] = b["file"], a["file"]


def _add(d: Path, **changes) -> None:
    """An extra entry (and its file): a copy of entry 1 with `changes`."""
    doc = _doc(d)
    extra = dict(doc["chunks"][1], file="extra.00999.safetensors", **changes)
    shutil.copyfile(d / doc["chunks"][1]["file"], d / extra["file"])
    doc["chunks"].append(extra)
    (d / disk_store.MANIFEST).write_text(json.dumps(doc))


def _chunk(d: Path, which: int = 0) -> Path:
    return d / _doc(d)["chunks"][which]["file"]


def _rewrite_chunk(change, which: int = 0, tensor: str | None = None):
    def damage(d: Path) -> None:
        path = _chunk(d, which) if tensor is None else d / _of(_doc(d), tensor)[which]["file"]
        path.write_bytes(change(bytearray(path.read_bytes())))
    return damage


def _header_len(raw: bytearray) -> int:
    return struct.unpack("<Q", raw[:8])[0]


def _huge_header_length(raw: bytearray) -> bytearray:
    return struct.pack("<Q", 2**63) + raw[8:]


def _garble_header(raw: bytearray) -> bytearray:
    n = _header_len(raw)
    return raw[:8] + b"x" * n + raw[8 + n:]


def _flip_data_bit(raw: bytearray) -> bytearray:
    raw[-5] ^= 0x01
    return raw


def _zero_data(raw: bytearray) -> bytearray:
    start = 8 + _header_len(raw)
    return raw[:start] + bytes(len(raw) - start)


def _swap_contents(d: Path) -> None:
    """The same range of two tensors trades places: each file is a valid chunk, of the wrong tensor."""
    doc = _doc(d)
    a, b = (d / _of(doc, "policy.grads")[0]["file"]), (d / _of(doc, "policy.exp_avg")[0]["file"])
    raw_a, raw_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(raw_b)
    b.write_bytes(raw_a)


def _replace_chunk(kind: str, tensor: str = "policy.grads"):
    def damage(d: Path) -> None:
        path = d / _of(_doc(d), tensor)[2]["file"]
        path.unlink()
        if kind == "dir":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)  # opening it for reading would wait for a writer forever
        else:
            path.symlink_to("/dev/zero")
    return damage


def _replace_manifest_by(kind: str):
    def damage(d: Path) -> None:
        path = d / disk_store.MANIFEST
        path.unlink()
        if kind == "dir":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "dev_zero":
            path.symlink_to("/dev/zero")
        elif kind == "huge":
            with open(path, "wb") as f:  # sparse: costs no disk, reading it would cost 65 MB
                f.truncate(disk_store.MAX_MANIFEST_BYTES + 1)
    return damage


NO_CHUNK = r"elements \d+\.\.\d+ of policy\.\w+ are in no chunk"
NOT_A_MANIFEST = r"is not a miles-trainer-offload version 1 manifest"
BAD_ENTRY = r"chunk entry 0 "

DAMAGES = [
    # the manifest: entries missing, extra, or with wrong ranges, dtypes, files
    ("entry_missing_first", _drop("policy.grads", 0), NO_CHUNK),
    ("entry_missing_last", _drop("policy.exp_avg", -1), NO_CHUNK),
    ("entry_missing_middle", _drop("policy.master", 3), NO_CHUNK),
    ("entry_listed_twice", _edit(lambda doc: doc["chunks"].append(doc["chunks"][1])), r"lists \S+ twice"),
    ("entry_extra_overlapping", _add, r"extra\.00999\.safetensors overlaps elements"),
    ("entry_unknown_tensor", lambda d: _add(d, tensor="policy.bogus"), r"'policy\.bogus', which is no"),
    ("entry_for_mirrored_tensor", lambda d: _add(d, tensor="policy.params"), "which is no offloaded tensor"),
    ("numel_larger_at_end", _grow(-1, "numel", 1), r"end at element \d+, past its \d+"),
    ("numel_smaller", _grow(0, "numel", -1), NO_CHUNK),
    ("start_later", _grow(1, "start", 1), NO_CHUNK),
    ("start_earlier", _grow(1, "start", -1), r"overlaps elements"),
    ("numel_huge", _set("numel", 10**30), r"overlaps elements"),
    ("dtype_wrong", _set("dtype", "F16"), r"holds F16, policy\.grads is F32"),
    ("crc32_changed", _grow(4, "crc32", 1), r"is not the one written at offload \(2 entries differ"),
    ("files_named_crosswise", _edit(_swap_names), r"is not the one written at offload \(4 entries differ"),
    ("file_parent_dir", _set("file", "../x.safetensors"), r"names file '\.\./x\.safetensors', not a chunk"),
    ("file_absolute", _set("file", "/etc/passwd"), r"not a chunk file in the directory"),
    ("file_nul", _set("file", "a\x00.safetensors"), r"not a chunk file in the directory"),
    ("field_missing", _edit(lambda doc: doc["chunks"][0].pop("crc32")), BAD_ENTRY + "is not an object"),
    ("field_extra", _set("comment", "x"), BAD_ENTRY + "is not an object"),
    ("field_bool", _set("start", False), BAD_ENTRY + "has a start, numel or crc32"),
    ("field_negative", _set("start", -1), BAD_ENTRY + "has a start, numel or crc32"),
    ("field_float", _set("numel", 2.0), BAD_ENTRY + "has a start, numel or crc32"),
    ("field_string", _set("crc32", "00000000"), BAD_ENTRY + "has a start, numel or crc32"),
    ("crc32_wide", _set("crc32", 2**32), BAD_ENTRY + "has a crc32 wider"),
    ("dtype_unknown", _set("dtype", "F64"), BAD_ENTRY + "has a bad tensor name or dtype"),
    ("tensor_not_string", _set("tensor", ["policy.grads"]), BAD_ENTRY + "has a bad tensor name or dtype"),
    ("entry_not_object", _set_entry([1, 2]), BAD_ENTRY + "is not an object"),
    ("chunks_not_list", _edit(lambda doc: doc.__setitem__("chunks", {})), NOT_A_MANIFEST),
    ("chunks_missing", _edit(lambda doc: doc.pop("chunks")), NOT_A_MANIFEST),
    ("chunks_empty", _edit(lambda doc: doc.__setitem__("chunks", [])), NO_CHUNK),
    ("version_true", _edit(lambda doc: doc.__setitem__("version", True)), NOT_A_MANIFEST),
    ("version_2", _edit(lambda doc: doc.__setitem__("version", 2)), NOT_A_MANIFEST),
    ("format_other", _edit(lambda doc: doc.__setitem__("format", "safetensors")), NOT_A_MANIFEST),
    ("manifest_empty_list", _replace_manifest(b"[]"), NOT_A_MANIFEST),
    ("manifest_object", _replace_manifest(b"{}"), NOT_A_MANIFEST),
    ("manifest_null", _replace_manifest(b"null"), NOT_A_MANIFEST),
    ("manifest_string", _replace_manifest(b'"chunks"'), NOT_A_MANIFEST),
    ("manifest_number", _replace_manifest(b"42"), NOT_A_MANIFEST),
    ("manifest_empty_file", _replace_manifest(b""), r"is not valid JSON"),
    ("manifest_cut", lambda d: (d / disk_store.MANIFEST).write_bytes(
        (d / disk_store.MANIFEST).read_bytes()[:-40]), r"is not valid JSON"),
    ("manifest_not_utf8", _replace_manifest(b"\xff\xfe{}"), r"is not valid JSON"),
    ("manifest_deeply_nested", _replace_manifest(b"[" * 200_000 + b"]" * 200_000), r"is not valid JSON"),
    ("manifest_missing", lambda d: (d / disk_store.MANIFEST).unlink(), r"cannot be opened: No such file"),
    ("manifest_is_dir", _replace_manifest_by("dir"), r"is not a regular file"),
    ("manifest_is_fifo", _replace_manifest_by("fifo"), r"is not a regular file"),
    ("manifest_is_dev_zero", _replace_manifest_by("dev_zero"), r"is not a regular file"),
    ("manifest_huge", _replace_manifest_by("huge"), r"bytes, more than any manifest"),
    # the chunk files: missing, cut, grown, wrong header, wrong data, not a file
    ("chunk_missing", lambda d: _chunk(d, 5).unlink(), r"cannot be opened: No such file"),
    ("chunk_empty", _rewrite_chunk(lambda raw: b""), r"is truncated: 0 bytes, expected \d+"),
    ("chunk_cut_in_header", _rewrite_chunk(lambda raw: raw[:4]), r"is truncated: 4 bytes"),
    ("chunk_cut_in_data", _rewrite_chunk(lambda raw: raw[:-1]), r"is truncated"),
    ("chunk_trailing_bytes", _rewrite_chunk(lambda raw: raw + b"\0"), r"has trailing bytes"),
    ("header_length_huge", _rewrite_chunk(_huge_header_length),
     r"corrupted header: length 9223372036854775808, expected \d+"),
    ("header_length_zero", _rewrite_chunk(lambda raw: struct.pack("<Q", 0) + raw[8:]),
     r"corrupted header: length 0, expected"),
    ("header_not_json", _rewrite_chunk(_garble_header), r"corrupted header: not valid JSON"),
    ("header_start_changed", _rewrite_chunk(lambda raw: raw.replace(b'"start":"0"', b'"start":"9"', 1)),
     r"does not match its manifest entry: start '9', expected '0'"),
    ("header_dtype_changed", _rewrite_chunk(lambda raw: raw.replace(b'"F32"', b'"I32"', 1)),
     r"does not match its manifest entry: dtype 'I32', expected 'F32'"),
    ("chunk_contents_swapped", _swap_contents,
     r"does not match its manifest entry: tensor 'policy.exp_avg', expected 'policy.grads'"),
    ("data_bit_flipped", _rewrite_chunk(_flip_data_bit, 1, "policy.exp_avg"),
     r"is corrupted: CRC-32 [0-9a-f]{8}, expected [0-9a-f]{8}"),
    ("data_zeroed", _rewrite_chunk(_zero_data, 1, "policy.exp_avg"), r"is corrupted: CRC-32"),
    ("chunk_is_dir", _replace_chunk("dir"), r"is not a regular file"),
    ("chunk_is_fifo", _replace_chunk("fifo"), r"is not a regular file"),
    ("chunk_is_dev_zero", _replace_chunk("dev_zero"), r"is not a regular file"),
]


@pytest.mark.slow
@pytest.mark.parametrize("damage, message", [d[1:] for d in DAMAGES], ids=[d[0] for d in DAMAGES])
def test_damage_is_one_error_and_the_state_survives_it(offloaded, damage, message):
    o = offloaded
    damage(o.dir)
    for _ in range(2):  # a retry meets the same damage the same way: the first try consumed nothing
        with pytest.raises(OffloadError, match=message) as info:
            o.actor.onload()
        assert "\n" not in str(info.value)
        assert o.actor.offloader.offloaded
        assert not any(is_allocated(s.tensor) for s in o.actor.state)  # freed again, not half-restored
    _restore(o.dir, o.files)
    o.actor.onload()
    _assert_same(o.actor, o.snap)


STREAM_DAMAGES = [
    ("entry_missing", _drop("policy.exp_avg", 3), NO_CHUNK),  # not even the streamed tensor's
    ("manifest_empty_list", _replace_manifest(b"[]"), NOT_A_MANIFEST),
    ("master_chunk_is_fifo", _replace_chunk("fifo", "policy.master"), r"is not a regular file"),
    ("master_header_length_huge", _rewrite_chunk(_huge_header_length, 0, "policy.master"), r"length 9223"),
    ("master_data_bit_flipped", _rewrite_chunk(_flip_data_bit, 1, "policy.master"), r"is corrupted: CRC-32"),
]


@pytest.mark.parametrize("damage, message", [d[1:] for d in STREAM_DAMAGES], ids=[d[0] for d in STREAM_DAMAGES])
def test_weights_never_stream_from_a_damaged_offload(offloaded, damage, message):
    """update_weights streams the policy's weights from the chunks (here: of the host master copy, its
    mirror) while the state is offloaded; a damaged offload must stop it, not feed the engine."""
    damage(offloaded.dir)
    with pytest.raises(OffloadError, match=message):
        for _ in offloaded.actor.weight_chunks():
            pass
    _restore(offloaded.dir, offloaded.files)
    offloaded.actor.onload()
    _assert_same(offloaded.actor, offloaded.snap)


def test_a_consistent_copy_of_an_older_offload_is_refused(offloaded):
    """Every file and the manifest of the previous offload, intact and self-consistent, but not the
    state now offloaded: restoring it would silently roll training back one step."""
    o = offloaded
    o.actor.onload()
    _fill(o.actor, 1)
    snap = _snapshot(o.actor)
    o.actor.offload()
    current = _files(o.dir)
    assert current.keys() == o.files.keys() and current != o.files
    _restore(o.dir, o.files)
    with pytest.raises(OffloadError, match=r"is not the one written at offload \(\d+ entries differ"):
        o.actor.onload()
    _restore(o.dir, current)
    o.actor.onload()
    _assert_same(o.actor, snap)


@pytest.mark.slow
def test_the_trainer_stops_on_a_damaged_manifest_with_one_line(tmp_path):
    """The issue's case end to end: a manifest that lost one chunk's entry while a real
    `python -m trainer.train` had its state on disk. Before, onload filled that range with whatever
    the fresh allocation held and training went on to exit 0 (the engine never sees the optimizer
    state, so nothing else notices)."""
    offload = tmp_path / "offload"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.train", "--preset", "tiny", "--num-rollout", "200", "--offload-train",
         "--offload-train-target", "disk", "--offload-train-disk-dir", str(offload)],
        cwd=REPO, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    damaged, last = 0, None
    try:
        while proc.poll() is None:  # damage every manifest the trainer writes, as soon as it appears
            for manifest in offload.glob("trainer-*/manifest.json"):
                try:
                    if manifest.stat().st_ino == last:
                        continue
                    doc = json.loads(manifest.read_text())  # written by rename: never half a file
                except (OSError, ValueError):
                    continue
                doc["chunks"].remove(_of(doc, "policy.exp_avg")[0])  # not streamed to the engine
                tmp = manifest.with_name("damaged.tmp")
                tmp.write_text(json.dumps(doc))
                os.replace(tmp, manifest)
                last, damaged = manifest.stat().st_ino, damaged + 1
            time.sleep(0.002)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert damaged >= 1
    assert proc.returncode == 1, (out, err)
    assert err.startswith("trainer: error: offload manifest ") and "of policy.exp_avg are in no chunk" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not list(offload.glob("trainer-*"))  # the run still removed its offload directory
