"""Small programs, one per class of issue 30, written as users write them and none of them a held-out
case; tests/integration/test_verdict_classes.py records each under a plain `record --exec`.

    python tests/corpus/class_programs.py memmap DIR   # a np.memmap data loader: file-backed pages only
    python tests/corpus/class_programs.py short_leak   # 4 iterations, 96 MiB of batches kept per iteration
    python tests/corpus/class_programs.py swap_kept    # each offload keeps the new state, drops the old one
    python tests/corpus/class_programs.py healthy      # the same loop, offloads that free what they declare
    python tests/corpus/class_programs.py late_thread  # offload_train's state freed by a thread inside generate
    python tests/corpus/class_programs.py own_free     # offload_train never frees; generate drops prefetched prompts
    python tests/corpus/class_programs.py own_free_after  # the same, generate always right after offload_train
    python tests/corpus/class_programs.py planned      # a loop whose meta holds a forecast of its phases
    python tests/corpus/class_programs.py planned_then_failed  # the forecast written, then exit 1 before a phase
    python tests/corpus/class_programs.py kept_mapping  # 24 MiB of anonymous mmap kept per iteration: outside malloc
    python tests/corpus/class_programs.py kept_objects  # a list of 700,000 Python ints kept per iteration
    python tests/corpus/class_programs.py two_processes  # an actor and a reference, multiprocessing's spawn
    python tests/corpus/class_programs.py spawn_ranks   # two gloo ranks started by torch.multiprocessing.spawn
"""
from __future__ import annotations

import mmap
import sys
import threading
import time
from pathlib import Path

import numpy as np

import miles_profile as mp

MiB = 1024 ** 2


def memmap(folder: Path, iters: int = 8, chunk: int = 48 * MiB) -> None:
    """A nanoGPT-style loader: each iteration reads the next 48 MiB of a memory-mapped token file. The
    pages it touched stay mapped (rss_file grows 48 MiB per iteration); its anonymous memory is flat."""
    path = folder / "tokens.bin"
    with open(path, "wb") as f:
        for _ in range(iters):
            f.write(np.random.default_rng(0).integers(0, 255, chunk, dtype=np.uint8).tobytes())
    data = np.memmap(path, dtype=np.uint8, mode="r")
    total = 0
    for it in range(iters):
        with mp.phase("train", rollout_id=it):
            batch = data[it * chunk:(it + 1) * chunk]
            total += int(batch[::4096].sum()) + int(np.asarray(batch).sum() % 7)  # touches every page
            time.sleep(0.6)  # 6 readings at the default 100 ms in each iteration, however fast the page reads
    print("checksum", total)


def _loop(iters: int, keep_batches: bool, swap_kept: bool, state_mib: int = 128) -> None:
    history, kept = [], None
    for it in range(iters):
        with mp.phase("generate", rollout_id=it):
            batch = np.ones(96 * MiB, dtype=np.uint8)
            time.sleep(0.25)
        if keep_batches:
            history.append(batch)  # "for the metrics at the end": a leak of 96 MiB per iteration
        del batch
        with mp.phase("train", rollout_id=it):
            state = np.ones(state_mib * MiB, dtype=np.uint8)
            time.sleep(0.25)
        with mp.phase("offload_train", rollout_id=it, target="disk", expected_bytes=state_mib * MiB):
            if swap_kept:
                kept = state  # "kept for the next step": the new copy kept, the previous one dropped
            del state
            time.sleep(0.1)
    print("done", len(history), kept is not None)


def late_thread(iters: int = 4) -> None:
    """An async release: offload_train hands its 128 MiB state to a thread that frees it 0.15 s into the
    next generate (0.5 s), while generate builds its 96 MiB rollout. Read at phase boundaries, generate's
    end shows the free less its own rollout: 32 MiB, where 128 MiB went (it was freed late, not still
    referenced). The thread starts its wait when generate begins, not when offload_train does: on a loaded
    machine a timer from the offload fired before offload_train had ended, inside it (a real pass)."""
    waiting: list[threading.Event] = []  # the releases whose state is freed in the next generate
    for it in range(iters):
        with mp.phase("generate", rollout_id=it):
            for release in waiting:
                release.set()
            waiting.clear()
            rollout = np.ones(96 * MiB, dtype=np.uint8)
            time.sleep(0.5)
        with mp.phase("offload_rollout", rollout_id=it, target="disk", expected_bytes=96 * MiB):
            del rollout
            time.sleep(0.05)
        with mp.phase("train", rollout_id=it):
            state = [np.ones(128 * MiB, dtype=np.uint8)]
            time.sleep(0.2)
        with mp.phase("offload_train", rollout_id=it, target="disk", expected_bytes=128 * MiB):
            release = threading.Event()
            threading.Thread(target=_free_after, args=(release, state)).start()  # "released in the background"
            waiting.append(release)
            del state
            time.sleep(0.05)
    for release in waiting:  # the last one's: after the loop, outside any phase
        release.set()
    time.sleep(0.3)


def _free_after(release: threading.Event, state: list) -> None:
    release.wait()
    time.sleep(0.15)
    state.clear()


def own_free(iters: int = 4) -> None:
    """offload_train declares the 128 MiB optimizer state and never frees it (kept by `state`), while train
    prefetches the next 160 MiB of prompts that generate drops once encoded: generate's own free, seen in
    its first instance too (the first prompts are loaded before the loop), is no late free of the state."""
    state = np.ones(128 * MiB, dtype=np.uint8)
    prompts = np.ones(160 * MiB, dtype=np.uint8)
    for it in range(iters):
        with mp.phase("generate", rollout_id=it):
            del prompts  # encoded
            rollout = np.ones(32 * MiB, dtype=np.uint8)
            time.sleep(0.3)
        with mp.phase("offload_rollout", rollout_id=it, target="disk", expected_bytes=32 * MiB):
            del rollout
            time.sleep(0.05)
        with mp.phase("train", rollout_id=it):
            state += 1
            prompts = np.ones(160 * MiB, dtype=np.uint8)  # the next step's prompts, prefetched
            time.sleep(0.2)
        with mp.phase("offload_train", rollout_id=it, target="disk", expected_bytes=128 * MiB):
            time.sleep(0.05)  # saved to disk, but `state` still holds it
    print("done", int(state[0]))


def own_free_after(iters: int = 3) -> None:
    """own_free with train first: generate (dropping the 224 MiB of prompts train prefetched, building a
    32 MiB rollout) ALWAYS follows offload_train, which declares its 128 MiB state and never frees it. No
    generate follows no offload, so nothing tells generate's own fall (192 MiB) from a late free."""
    state = np.ones(128 * MiB, dtype=np.uint8)
    for it in range(iters):
        with mp.phase("train", rollout_id=it):
            state += 1
            prompts = np.ones(224 * MiB, dtype=np.uint8)  # the next step's prompts, prefetched
            time.sleep(0.2)
        with mp.phase("offload_train", rollout_id=it, target="disk", expected_bytes=128 * MiB):
            time.sleep(0.05)  # saved to disk, but `state` still holds it
        with mp.phase("generate", rollout_id=it):
            del prompts  # encoded
            rollout = np.ones(32 * MiB, dtype=np.uint8)
            time.sleep(0.3)
        with mp.phase("offload_rollout", rollout_id=it, target="disk", expected_bytes=32 * MiB):
            del rollout
            time.sleep(0.05)
    print("done", int(state[0]))


def planned(iters: int = 6) -> None:
    """A loop that writes a forecast of its phases into its meta, as the trainer does (mp.annotate)."""
    mp.annotate(forecast={"version": 1, "device": "cpu", "phases": [
        {"phase": "offload_train", "device": "host", "peak": 64 * MiB, "allocator": 64 * MiB, "process": "trainer"}]})
    for it in range(iters):
        with mp.phase("train", rollout_id=it):
            state = np.ones(64 * MiB, dtype=np.uint8)
            time.sleep(0.2)
        with mp.phase("offload_train", rollout_id=it, target="disk", expected_bytes=64 * MiB):
            del state
            time.sleep(0.1)


def kept_per_iteration(kind: str, iters: int = 8) -> None:
    """Memory kept every iteration that glibc's heap does not hold in full: `mapping`, 24 MiB of anonymous
    memory mapped by hand (a library's own buffer), all outside malloc; `objects`, a list of 700,000 Python
    ints (~25 MiB: the ints in Python's own arenas, the list's 5.6 MiB item array malloc'd)."""
    kept = []
    for it in range(iters):
        with mp.phase("train", rollout_id=it):
            if kind == "mapping":
                buffer = mmap.mmap(-1, 24 * MiB)
                buffer.write(b"\1" * (24 * MiB))  # every page touched: resident
                kept.append(buffer)
            else:
                kept.append(list(range(it * 10 ** 6, it * 10 ** 6 + 700_000)))
            time.sleep(0.3)
        with mp.phase("eval", rollout_id=it):
            time.sleep(0.2)
    print("kept", len(kept))


def two_processes(iters: int = 6) -> None:
    """An actor and a reference model in two processes (multiprocessing, spawn), each ~64 MiB, passing
    batches over queues, as a loop without Ray does; neither sets a rank or a role."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=reference, args=(inbox, outbox))
    child.start()
    weights = np.ones(64 * MiB, dtype=np.uint8)
    for it in range(iters):
        with mp.phase("train", rollout_id=it):
            inbox.put(it)
            outbox.get()
            time.sleep(0.2)
    inbox.put(None)
    child.join()
    print("actor done", int(weights[0]))


def reference(inbox, outbox) -> None:
    weights = np.ones(64 * MiB, dtype=np.uint8)
    while (it := inbox.get()) is not None:
        with mp.phase("ref_logprobs", rollout_id=it):
            time.sleep(0.1)
        outbox.put(int(weights[it]))


def spawn_ranks() -> None:
    """Two data-parallel ranks started by torch.multiprocessing.spawn, which sets no RANK: each says its
    rank through torch.distributed (gloo) only."""
    import socket

    import torch.multiprocessing
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(spawned_rank, args=(2, port), nprocs=2)


def spawned_rank(rank: int, world: int, port: int) -> None:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for it in range(3):
        with mp.phase("train", rollout_id=it):
            dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()


def planned_then_failed() -> None:
    """A rank that wrote its forecast and failed before its first phase (the trainer's rank asked for a
    GPU the host lacks): exit 1 after a second of samples."""
    mp.annotate(forecast={"version": 1, "device": "cpu", "phases": [
        {"phase": "offload_train", "device": "host", "peak": 64 * MiB, "allocator": 64 * MiB, "process": "trainer"}]})
    time.sleep(1.0)
    sys.exit("trainer: error: rank 1 needs GPU 1 (one GPU a rank), but this host has 1")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "memmap":
        memmap(Path(sys.argv[2]))
    elif mode == "short_leak":
        _loop(4, keep_batches=True, swap_kept=False)
    elif mode == "late_thread":
        late_thread()
    elif mode == "own_free":
        own_free()
    elif mode == "own_free_after":
        own_free_after()
    elif mode == "planned":
        planned()
    elif mode == "planned_then_failed":
        planned_then_failed()
    elif mode in ("kept_mapping", "kept_objects"):
        kept_per_iteration(mode.removeprefix("kept_"))
    elif mode == "two_processes":
        two_processes()
    elif mode == "spawn_ranks":
        spawn_ranks()
    elif mode == "swap_kept":
        _loop(4, keep_batches=False, swap_kept=True)
    else:
        _loop(4, keep_batches=False, swap_kept=False)
