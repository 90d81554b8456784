"""The two memory backends side by side in one run (CUDA): builtin against torch_memory_saver.

- Rollout engine (`--preset`'s model, KV pool and decode graphs, weights with a CPU backup so they come
  back by themselves): seconds to release kv_cache + weights + cuda_graph, bytes back to the driver
  inside the call (`mem_get_info`), seconds to resume weights + KV, then seconds to resume cuda_graph
  (builtin: the graphs are captured again; torch_memory_saver: unpaused, never captured again) and the
  captures counted. "Graph seconds saved" = builtin's cuda_graph resume minus torch_memory_saver's.
- Actor (`--preset`'s training state): offload_train / onload_train with builtin pinned buffers, with
  torch_memory_saver's CPU backup (the package's default: a pinned host buffer allocated at each pause
  and freed at each resume) and with `retain_cpu_backup` (the buffer kept, as builtin keeps its own),
  each against one plain pinned copy of the same bytes (ratio = plain seconds / backend seconds), and
  the host RSS above the start after each onload (torch_memory_saver #90: a backup that stays resident).

    PYTHONPATH=. python3 bench/bench_tms.py --preset gpu --out bench_tms.json

Needs CUDA (exit 2 without it); without torch_memory_saver only the builtin columns are measured
(exit 1). Best of --repeats for every time.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_offload import plain_pinned_copy  # noqa: E402
from miles_profile.names import BUILTIN, TORCH_MEMORY_SAVER  # noqa: E402
from trainer import memory_backend, task  # noqa: E402
from trainer.actor import Actor  # noqa: E402
from trainer.config import GiB, PRESETS, model_config  # noqa: E402
from trainer.rollout_engine import RolloutEngine  # noqa: E402

CUDA = torch.device("cuda")
TAGS = ["kv_cache", "weights", "cuda_graph"]


def _free() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


# --- engine ----------------------------------------------------------------------------------------

def bench_engine(preset: str, backend: str, repeats: int) -> dict:
    p = PRESETS[preset]
    cfg = model_config(p, p.digits)
    engine = RolloutEngine(cfg, CUDA, p.kv_cache_bytes, cuda_graph=True, weights_cpu_backup=True,
                           memory_backend=backend)
    try:
        g = torch.Generator(CUDA).manual_seed(0)
        engine.update_weights_from_tensor((n, torch.randn(t.shape, device=CUDA, generator=g) * 0.02)
                                          for n, t in engine.model.named_parameters())
        prompts = task.sample_prompts(p.rollout_batch_size, p.digits, torch.Generator().manual_seed(0))
        prompts = prompts.repeat_interleave(p.n_samples_per_prompt, dim=0)
        first = engine.generate(prompts, p.digits, seed=1)  # captures the decode graph
        rows = []
        for _ in range(repeats):
            expected, captures, free = engine.occupied_bytes(TAGS), engine.graph_captures, _free()
            release_s = _timed(lambda: engine.release_memory_occupation(TAGS))
            freed = _free() - free
            resume_s = _timed(lambda: engine.resume_memory_occupation(["weights", "kv_cache"]))
            graph_s = _timed(lambda: engine.resume_memory_occupation(["cuda_graph"]))
            same = bool(torch.equal(engine.generate(prompts, p.digits, seed=1), first))
            rows.append(dict(release_s=release_s, freed_bytes=freed, expected_bytes=expected, resume_s=resume_s,
                             resume_graph_s=graph_s, captures=engine.graph_captures - captures, same_output=same))
        best = lambda key: min(r[key] for r in rows)  # noqa: E731
        return {"backend": backend, "release_s": best("release_s"), "resume_s": best("resume_s"),
                "resume_graph_s": best("resume_graph_s"), "freed_bytes": min(r["freed_bytes"] for r in rows),
                "expected_bytes": rows[0]["expected_bytes"], "captures_per_resume": rows[-1]["captures"],
                "same_output": all(r["same_output"] for r in rows), "repeats": rows}
    finally:
        engine.close()
        del engine
        torch.cuda.empty_cache()


# --- actor -----------------------------------------------------------------------------------------

def _actor(preset: str, backend: str) -> Actor:
    p = PRESETS[preset]
    return Actor(model_config(p, p.digits), CUDA, lr=p.lr, seed=0, use_critic=False, optimizer_cpu_offload=False,
                 micro_batch_size=p.micro_batch_size, chunk_bytes=p.chunk_bytes, offload_backend=backend)


def plain_pinned(nbytes: int, repeats: int) -> tuple[float, float]:
    return plain_pinned_copy(nbytes, CUDA, repeats)


def bench_actor(preset: str, variant: str, repeats: int, plain: tuple[float, float]) -> dict:
    backend = BUILTIN if variant == BUILTIN else TORCH_MEMORY_SAVER
    if backend == TORCH_MEMORY_SAVER:
        memory_backend.saver().retain_cpu_backup = variant.endswith("retain")
    rss0 = _rss()
    actor = _actor(preset, backend)
    try:
        nbytes = actor.offloader.expected_bytes()
        offs, ons, freed, rss_after = [], [], [], []
        # builtin pins its buffers in the first cycle, retain allocates its backup there: both reuse them after
        warm = variant != TORCH_MEMORY_SAVER
        for _ in range(repeats + warm):
            free = _free()
            offs.append(_timed(actor.offload))
            freed.append(_free() - free)
            ons.append(_timed(actor.onload))
            rss_after.append(_rss() - rss0)
        first = (offs[0], ons[0])
        off, on = min(offs[warm:]), min(ons[warm:])
        return {"variant": variant, "bytes": nbytes, "offload_s": off, "onload_s": on,
                "first_offload_s": first[0], "first_onload_s": first[1],
                "offload_gbps": nbytes / off / 1e9, "onload_gbps": nbytes / on / 1e9,
                "offload_ratio": plain[0] / off, "onload_ratio": plain[1] / on,
                "freed_bytes": min(freed), "rss_after_onload_bytes": rss_after}
    finally:
        actor.close()
        del actor
        torch.cuda.empty_cache()
        if backend == TORCH_MEMORY_SAVER:
            memory_backend.saver().retain_cpu_backup = False


# --- report ----------------------------------------------------------------------------------------

def print_engine(rows: list[dict]) -> None:
    print("engine release/resume (kv_cache + weights with CPU backup + cuda_graph):")
    print(f"  {'backend':20s} {'release s':>10s} {'back to driver':>16s} {'resume w+kv s':>14s} "
          f"{'resume graph s':>15s} {'captures':>9s} same output")
    for r in rows:
        back = f"{r['freed_bytes'] / GiB:.2f}/{r['expected_bytes'] / GiB:.2f} GiB"
        print(f"  {r['backend']:20s} {r['release_s']:10.4f} {back:>16s} {r['resume_s']:14.4f} "
              f"{r['resume_graph_s']:15.4f} {r['captures_per_resume']:9d} {r['same_output']}")
    by = {r["backend"]: r for r in rows}
    if BUILTIN in by and TORCH_MEMORY_SAVER in by:
        saved = by[BUILTIN]["resume_graph_s"] - by[TORCH_MEMORY_SAVER]["resume_graph_s"]
        print(f"  graph seconds saved by not recapturing: {saved:.4f} s per resume")


def print_actor(rows: list[dict], plain: tuple[float, float], nbytes: int) -> None:
    print(f"actor offload/onload ({nbytes / GiB:.2f} GiB of training state; one pinned copy: "
          f"D2H {nbytes / plain[0] / 1e9:.1f} GB/s, H2D {nbytes / plain[1] / 1e9:.1f} GB/s):")
    for r in rows:
        rss = ", ".join(f"{b / GiB:+.2f}" for b in r["rss_after_onload_bytes"])
        print(f"  {r['variant']:31s} offload {r['offload_gbps']:6.1f} GB/s (ratio {r['offload_ratio']:.2f})  "
              f"onload {r['onload_gbps']:6.1f} GB/s (ratio {r['onload_ratio']:.2f})  "
              f"freed {r['freed_bytes'] / GiB:.2f} GiB  host RSS after onload [{rss}] GiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/bench_tms.py", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpu")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", choices=["engine", "actor"], action="append")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON (bytes as ints)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_tms: needs a CUDA device: torch_memory_saver is CUDA only, so there is nothing to "
              "compare on this machine", file=sys.stderr)
        return 2
    missing = memory_backend.unavailable_reason("cuda")
    backends = [BUILTIN] + ([] if missing else [TORCH_MEMORY_SAVER])
    print(f"bench_tms: preset {args.preset} on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"torch_memory_saver {'unavailable: ' + missing if missing else 'hook mode ' + memory_backend.hook_mode()}",
          flush=True)
    only = set(args.only or ["engine", "actor"])
    result: dict = {"meta": {"preset": args.preset, "device": torch.cuda.get_device_name(0), "host": platform.node(),
                             "torch": torch.__version__, "hook_mode": memory_backend.hook_mode(),
                             "argv": sys.argv, "date": time.strftime("%Y-%m-%d")}}
    if "engine" in only:
        result["engine"] = [bench_engine(args.preset, b, args.repeats) for b in backends]
        print_engine(result["engine"])
    if "actor" in only:
        nbytes = _actor_bytes(args.preset)
        plain = plain_pinned(nbytes, args.repeats)
        variants = [BUILTIN] + ([] if missing else ["torch_memory_saver", "torch_memory_saver retain"])
        result["actor"] = {"plain_d2h_s": plain[0], "plain_h2d_s": plain[1],
                           "variants": [bench_actor(args.preset, v, args.repeats, plain) for v in variants]}
        print_actor(result["actor"]["variants"], plain, nbytes)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 1 if missing else 0


def _actor_bytes(preset: str) -> int:
    """The training state's bytes: weights, gradients and both AdamW moments, fp32."""
    p = PRESETS[preset]
    return 4 * 4 * model_config(p, p.digits).num_params()


if __name__ == "__main__":
    sys.exit(main())
