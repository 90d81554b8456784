"""Offload/onload throughput of the actor's training state against plain copies of the same bytes,
measured in the same run (issue 3's targets: ratio >= 0.9).

- CUDA: offload_train/onload_train with target cpu against one plain pinned copy (D2H / H2D).
- CPU and CUDA: target disk against a raw sequential write (+ fsync) / read of the same bytes from
  host memory, one file, page cache dropped the same way (POSIX_FADV_DONTNEED) on both sides. The raw
  write starts from committed memory, the raw read fills a fresh buffer, as offload/onload do.

    PYTHONPATH=. python3 bench/bench_offload.py --preset cpu --disk-dir /tmp/bench-offload
    PYTHONPATH=. python3 bench/bench_offload.py --preset gpu --device cuda --disk-dir /local/nvme/x --out r.json

Ratio = plain seconds / trainer seconds (best of --repeats), so 1.0 means as fast as the plain copy.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

from trainer.actor import Actor
from trainer.config import GiB, PRESETS, model_config
from trainer.disk_store import byte_view
from trainer.offload import host_buffer, unpin


def best_of(repeats: int, fn, sync: torch.device) -> float:
    times = []
    for _ in range(repeats):
        _sync(sync)
        start = time.perf_counter()
        fn()
        _sync(sync)
        times.append(time.perf_counter() - start)
    return min(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_actor(preset: str, device: torch.device, target: str, disk_dir: Path | None) -> Actor:
    p = PRESETS[preset]
    return Actor(model_config(p, p.digits), device, lr=p.lr, seed=0, use_critic=False,
                 optimizer_cpu_offload=False, micro_batch_size=p.micro_batch_size,
                 offload_target=target, disk_dir=disk_dir, chunk_bytes=p.chunk_bytes)


def plain_pinned_copy(nbytes: int, device: torch.device, repeats: int) -> tuple[float, float]:
    """Best seconds of one device->host and one host->device copy of `nbytes` through a pinned buffer:
    what an offload of that many bytes is measured against."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = host_buffer(src)
    d2h = best_of(repeats, lambda: dst.copy_(src, non_blocking=True), device)
    h2d = best_of(repeats, lambda: src.copy_(dst, non_blocking=True), device)
    unpin(dst)
    del src, dst
    torch.cuda.empty_cache()
    return d2h, h2d


def bench_pinned(actor: Actor, repeats: int) -> dict:
    """Target cpu on CUDA against one plain pinned copy of the same number of bytes."""
    device, nbytes = actor.device, actor.state_bytes()
    plain_d2h, plain_h2d = plain_pinned_copy(nbytes, device, repeats)
    actor.offload(), actor.onload()  # the first cycle allocates and pins the host buffers
    off, on = _cycle(actor, repeats)
    return _result(nbytes, plain_d2h, off, plain_h2d, on, "pinned copy", "cpu")


def _cycle(actor: Actor, repeats: int) -> tuple[float, float]:
    offs, ons = [], []
    for _ in range(repeats):
        offs.append(best_of(1, actor.offload, actor.device))
        ons.append(best_of(1, actor.onload, actor.device))
    return min(offs), min(ons)


def bench_disk(actor: Actor, disk_dir: Path, repeats: int) -> dict:
    """Target disk against a raw sequential write + fsync / read of the same bytes. The four
    measurements alternate within each repeat, so a busy machine slows both sides alike."""
    nbytes, cpu = actor.offloader.disk_bytes(), torch.device("cpu")
    buf = torch.empty(nbytes, dtype=torch.uint8)
    buf.fill_(7)  # commit the pages: the trainer's state is resident when offload starts
    raw = disk_dir / "raw.bin"
    times: dict[str, list[float]] = {"raw_write": [], "offload": [], "raw_read": [], "onload": []}
    for _ in range(repeats):  # the raw file is gone before the state is written: one copy on disk
        times["raw_write"].append(best_of(1, lambda: _raw_write(raw, buf), cpu))
        # An onload reads into memory given back at offload; the raw read gets a fresh buffer too.
        times["raw_read"].append(best_of(1, lambda: _raw_read(raw, torch.empty(nbytes, dtype=torch.uint8)), cpu))
        raw.unlink()
        times["offload"].append(best_of(1, actor.offload, actor.device))
        times["onload"].append(best_of(1, actor.onload, actor.device))
    best = {k: min(v) for k, v in times.items()}
    return _result(nbytes, best["raw_write"], best["offload"], best["raw_read"], best["onload"],
                   "raw sequential file", "disk")


def _raw_write(path: Path, buf: torch.Tensor) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = byte_view(buf)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _raw_read(path: Path, buf: torch.Tensor) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        view, done = byte_view(buf), 0
        while done < len(view):
            done += os.readv(fd, [view[done:]])
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _result(nbytes: int, plain_out: float, off: float, plain_in: float, on: float, baseline: str,
            target: str) -> dict:
    return {"target": target, "baseline": baseline, "bytes": nbytes,
            "plain_out_s": plain_out, "offload_s": off, "offload_ratio": plain_out / off,
            "plain_in_s": plain_in, "onload_s": on, "onload_ratio": plain_in / on}


def report(r: dict) -> None:
    rate = lambda s: f"{r['bytes'] / s / GiB:6.2f} GiB/s"  # noqa: E731
    print(f"target {r['target']:4s} ({r['bytes'] / GiB:.3f} GiB) against a {r['baseline']}:")
    print(f"  offload_train {rate(r['offload_s'])}  plain {rate(r['plain_out_s'])}  ratio {r['offload_ratio']:.2f}")
    print(f"  onload_train  {rate(r['onload_s'])}  plain {rate(r['plain_in_s'])}  ratio {r['onload_ratio']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/bench_offload.py", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--disk-dir", type=Path, default=Path("bench/out/offload"),
                        help="a directory on the disk to measure (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-disk", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON (bytes as ints)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and cuda) else "cpu")
    results = []
    print(f"bench_offload: preset {args.preset} on {device} ({platform.node()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__})", flush=True)
    if device.type == "cuda":
        actor = make_actor(args.preset, device, "cpu", None)
        results.append(bench_pinned(actor, args.repeats))
        report(results[-1])
        actor.close()
        del actor
        torch.cuda.empty_cache()
    if not args.skip_disk:
        work = args.disk_dir / f"bench-{os.getpid()}"
        work.mkdir(parents=True, exist_ok=True)
        try:
            actor = make_actor(args.preset, device, "disk", work / "state")
            results.append(bench_disk(actor, work, args.repeats))
            report(results[-1])
            actor.close()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if args.out:
        meta = {"preset": args.preset, "device": str(device), "host": platform.node(),
                "torch": torch.__version__, "argv": sys.argv}
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
