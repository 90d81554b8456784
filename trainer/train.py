"""python -m trainer.train [flags]: the RL loop. Each step runs inside a `miles_profile.phase` whose
attributes say what moved (`tags`, `target`, `expected_bytes`, `rollout_id`); without a recorder a
phase costs one function call. The two orders follow Miles (see docs/trainer.md).

Under torchrun (`torchrun --nproc-per-node N -m trainer.train ...`) every rank runs this same loop on
its share of the prompts, with its own rollout engine (by default in a process of its own, driven
over HTTP like an SGLang server); gradients are averaged across ranks inside `Actor.train`.
"""
from __future__ import annotations

import dataclasses

import os
import shutil
import signal
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    from trainer import gc_startup
    gc_startup.defer_collections()  # torch's import: 175,000 lasting objects (trainer/gc_startup.py)
    if "--plan" not in sys.argv[1:]:  # a typo or --help answered before torch loads
        from trainer.args import check_flags
        from trainer.ray_launch import without_nproc
        check_flags(without_nproc(sys.argv[1:]))  # --nproc-per-node goes with --launcher ray only

import torch  # noqa: E402

import miles_profile as mp
from miles_profile.names import (CLEAR_MEMORY, CUDA_GRAPH, GENERATE, KV_CACHE, OFFLOAD_KV, OFFLOAD_ROLLOUT,
                                 OFFLOAD_TRAIN, OFFLOAD_WEIGHTS, ONLOAD_KV, ONLOAD_TRAIN, ONLOAD_WEIGHTS,
                                 TORCH_MEMORY_SAVER, TRAIN, UPDATE_WEIGHTS, WEIGHTS)
from trainer import dist, memory_backend, offload_dirs, plan_cli, task
from trainer.actor import Actor, Batch, TrainStats
from trainer.args import RunConfig, parse_args
from trainer.config import gib, model_config
from trainer.engine_client import ROLE_ENV, RemoteEngine
from trainer.errors import TrainerError
from trainer.model import settle_torch
from trainer.plan import forecast
from trainer.progress import Progress
from trainer.rollout_engine import RolloutEngine


def rollout_cpu_peak(i: int, cfg: RunConfig, actor: Actor, engine: RolloutEngine) -> tuple[Batch, TrainStats]:
    """generate -> offload_rollout -> train -> offload_train -> onload_weights -> update_weights -> onload_kv"""
    batch = generate(i, cfg, engine)
    if cfg.offload_rollout:
        release(engine, OFFLOAD_ROLLOUT, (*cfg.offload_rollout_tags, CUDA_GRAPH), i)
    if cfg.offload_train:
        onload_train(actor, i)
    stats = train(actor, batch, i)
    if cfg.offload_train:
        offload_train(actor, i)
    else:
        clear_memory(actor, i)
    if cfg.offload_rollout and WEIGHTS in cfg.offload_rollout_tags:
        resume(engine, ONLOAD_WEIGHTS, (WEIGHTS,), i)
    update_weights(actor, engine, i)
    if cfg.offload_rollout:
        resume(engine, ONLOAD_KV, (KV_CACHE, CUDA_GRAPH), i)
    return batch, stats


def rollout_gpu_peak(i: int, cfg: RunConfig, actor: Actor, engine: RolloutEngine) -> tuple[Batch, TrainStats]:
    """generate -> offload_kv -> onload_train -> offload_weights -> train -> clear_memory
    -> onload_weights -> offload_train -> update_weights -> onload_kv (the device never holds the
    KV pool and the training state at once; the engine's weights are away while the actor trains)"""
    levels = cfg.offload_rollout_tags
    batch = generate(i, cfg, engine)
    if KV_CACHE in levels:
        release(engine, OFFLOAD_KV, (KV_CACHE, CUDA_GRAPH), i)
    onload_train(actor, i)
    if WEIGHTS in levels:
        release(engine, OFFLOAD_WEIGHTS, (WEIGHTS,), i)
    stats = train(actor, batch, i)
    clear_memory(actor, i)
    if WEIGHTS in levels:
        resume(engine, ONLOAD_WEIGHTS, (WEIGHTS,), i)
    offload_train(actor, i)
    update_weights(actor, engine, i)
    resume(engine, ONLOAD_KV, (KV_CACHE, CUDA_GRAPH), i)
    return batch, stats


# --- one phase each ------------------------------------------------------------------------------

def generate(i: int, cfg: RunConfig, engine: RolloutEngine) -> Batch:
    with mp.phase(GENERATE, rollout_id=i):
        rank = dist.from_env()
        prompts = task.sample_prompts(cfg.rollout_batch_size, cfg.digits, _generator(cfg.seed, i, 0))
        prompts = prompts.chunk(cfg.world_size)[rank.rank]  # this rank's share of the same global batch
        prompts = prompts.repeat_interleave(cfg.n_samples_per_prompt, dim=0)  # groups of identical prompts
        responses = engine.generate(prompts, cfg.digits, seed=_seed(cfg.seed, i, 1 + rank.rank))
        return Batch(prompts, responses, task.reward(prompts, responses), cfg.n_samples_per_prompt)


def release(engine: RolloutEngine, name: str, tags: tuple[str, ...], i: int) -> None:
    with mp.phase(name, rollout_id=i, tags=list(tags), expected_bytes=engine.occupied_bytes(tags),
                  backend=engine.memory_backend):
        engine.release_memory_occupation(tags)


def resume(engine: RolloutEngine, name: str, tags: tuple[str, ...], i: int) -> None:
    with mp.phase(name, rollout_id=i, tags=list(tags), expected_bytes=engine.released_bytes(tags),
                  backend=engine.memory_backend):
        engine.resume_memory_occupation(tags)


def onload_train(actor: Actor, i: int | None) -> None:
    with mp.phase(ONLOAD_TRAIN, **_ids(i), target=actor.offloader.target, backend=actor.offloader.backend,
                  expected_bytes=actor.offloader.expected_bytes()):
        actor.onload(i)


def train(actor: Actor, batch: Batch, i: int) -> TrainStats:
    with mp.phase(TRAIN, rollout_id=i):
        return actor.train(batch, i)


def offload_train(actor: Actor, i: int | None) -> None:
    with mp.phase(OFFLOAD_TRAIN, **_ids(i), target=actor.offloader.target, backend=actor.offloader.backend,
                  expected_bytes=actor.offloader.expected_bytes()):
        actor.offload(i)


def clear_memory(actor: Actor, i: int) -> None:
    with mp.phase(CLEAR_MEMORY, rollout_id=i):
        actor.clear_memory(i)


def update_weights(actor: Actor, engine: RolloutEngine, i: int | None) -> None:
    with mp.phase(UPDATE_WEIGHTS, **_ids(i), weights_bytes=engine.weights_bytes):
        for chunk in actor.weight_chunks():
            engine.update_weights_from_tensor(chunk)


# --- setup ---------------------------------------------------------------------------------------

def run(cfg: RunConfig, critic=None) -> list[tuple[float, TrainStats]]:
    """Train; returns (mean reward, stats) per rollout. `critic`: the value model in a process of its
    own (trainer/critic.py; `--launcher ray` passes its actor), else --use-critic keeps it here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.preset.torch_threads or threads)
    try:
        return _run(cfg, critic)
    finally:
        torch.set_num_threads(threads)  # `record` runs us in process: leave its settings as found


def _run(cfg: RunConfig, critic=None) -> list[tuple[float, TrainStats]]:
    torch.manual_seed(cfg.seed)
    rank = dist.from_env()
    # the report sets it beside what was measured; a critic in its own process (Ray) is not this one's memory
    mp.annotate(forecast=forecast(dataclasses.replace(cfg, use_critic=False) if critic is not None else cfg).to_json())
    if mp.samples_heap():  # `record --heap`: the level the host forecast is measured from
        settle_torch(model_config(cfg.preset, cfg.digits))
        mp.heap_baseline()
    device = _device(cfg, rank)
    dist.init(rank, device)  # nothing without torchrun's environment
    try:
        return _run_rank(cfg, device, critic)
    finally:
        dist.shutdown()


def _run_rank(cfg: RunConfig, device: torch.device, critic=None) -> list[tuple[float, TrainStats]]:
    model_cfg = model_config(cfg.preset, cfg.digits)
    disk_dir = own_disk_dir(cfg)
    actor = engine = None
    try:  # from the directory's claim on: a Ctrl-C while the model is built left it behind
        actor = Actor(model_cfg, device, lr=cfg.lr, seed=cfg.seed, use_critic=cfg.use_critic,
                      optimizer_cpu_offload=cfg.optimizer_cpu_offload, micro_batch_size=cfg.micro_batch_size,
                      offload_target=cfg.offload_train_target, disk_dir=disk_dir, chunk_bytes=cfg.chunk_bytes,
                      offload_backend=cfg.offload_train_backend, critic=critic)
        if cfg.offload_train:  # before the engine exists (as in Miles): the two footprints never meet
            offload_train(actor, None)
        engine = _start_engine(cfg, model_cfg, device)
        _print_setup(cfg, actor, engine)
        _announce_backends(actor, engine)
        update_weights(actor, engine, None)  # the engine starts empty
        return _loop(cfg, actor, engine)
    finally:
        if engine is not None:
            engine.close()
        if actor is not None:
            actor.close()
        if disk_dir is not None:
            shutil.rmtree(disk_dir, ignore_errors=True)


def _loop(cfg: RunConfig, actor: Actor, engine: RolloutEngine) -> list[tuple[float, TrainStats]]:
    step = rollout_gpu_peak if cfg.colocate_memory_peak_device == "gpu" else rollout_cpu_peak
    progress, history = Progress(cfg.num_rollout), []
    try:
        for i in range(cfg.num_rollout):
            start = time.monotonic()
            batch, stats = step(i, cfg, actor, engine)
            reward = batch.rewards.mean().reshape(1)
            dist.average_(reward)  # the whole data-parallel batch's mean
            history.append((float(reward), stats))
            if dist.from_env().rank == 0:
                progress.update(i, history[-1][0], stats.loss, time.monotonic() - start)
    finally:
        progress.close()
    return history


def _device(cfg: RunConfig, rank: dist.Rank) -> torch.device:
    """One GPU per rank: the local rank's."""
    if cfg.device == "cuda" and rank.distributed:
        gpus = torch.cuda.device_count()
        if rank.local_rank >= gpus:  # else CUDA's "invalid device ordinal" and a traceback
            raise TrainerError(f"rank {rank.rank} needs GPU {rank.local_rank} (one GPU a rank), but this host has "
                               f"{gpus}: --nproc-per-node {gpus} at most")
        torch.cuda.set_device(rank.local_rank)
        return torch.device("cuda", rank.local_rank)
    return torch.device(cfg.device)


def _start_engine(cfg: RunConfig, model_cfg, device: torch.device) -> RolloutEngine | RemoteEngine:
    if cfg.rollout_engine_url:  # a server someone else started (ours by hand, or SGLang-compatible)
        return RemoteEngine.connect(cfg.rollout_engine_url, device)
    if cfg.rollout_engine == "server":
        return RemoteEngine.start(model_cfg, device, cfg.kv_cache_bytes, cuda_graph=cfg.cuda_graph,
                                  torch_threads=cfg.preset.torch_threads, memory_backend=cfg.rollout_memory_backend)
    return RolloutEngine(model_cfg, device, cfg.kv_cache_bytes, cuda_graph=cfg.cuda_graph,
                         memory_backend=cfg.rollout_memory_backend)


def own_disk_dir(cfg: RunConfig) -> Path | None:
    """A subdirectory of --offload-train-disk-dir that this process alone writes and removes; those
    left by trainers killed before they could remove theirs are removed (or named) first."""
    if cfg.offload_train_target != "disk":
        return None
    for stale in offload_dirs.remove_stale(cfg.offload_train_disk_dir):
        if stale.removable:
            print(f"trainer: removed {stale.path} ({gib(stale.nbytes)}): offload files of pid {stale.pid}, "
                  "which is gone", flush=True)
        else:
            print(f"trainer: warning: {stale.path} ({gib(stale.nbytes)}) holds offload files of pid {stale.pid}, "
                  "which is gone from this host; remove it if no other host writes there", file=sys.stderr,
                  flush=True)
    mp.watch_dir(cfg.offload_train_disk_dir)
    return offload_dirs.claim(cfg.offload_train_disk_dir)


def _print_setup(cfg: RunConfig, actor: Actor, engine: RolloutEngine) -> None:
    rank = dist.from_env()
    if rank.distributed or isinstance(engine, RemoteEngine):
        where = f" (pid {engine.pid})" if isinstance(engine, RemoteEngine) else " in process"
        print(f"trainer: rank {rank.rank}/{rank.world_size} pid {os.getpid()}, engine {cfg.rollout_engine}"
              f"{where}", flush=True)
        if rank.rank != 0:
            return
    print(f"trainer: preset {cfg.preset_name} on {cfg.device}: policy {actor.policy.params.numel / 1e6:.2f}M "
          f"params, training state {gib(actor.state_bytes())}, engine weights {gib(engine.weights_bytes)}, "
          f"KV pool {gib(engine.kv.nbytes)} ({engine.kv.capacity_tokens} tokens)", flush=True)


def _announce_backends(actor: Actor, engine: RolloutEngine) -> None:
    """One line saying which memory backend each side uses; the same into this process's meta.json,
    so the checks know which series can see a release."""
    backends = {"rollout_memory_backend": engine.memory_backend, "train_memory_backend": actor.offloader.backend}
    hook = ""
    if TORCH_MEMORY_SAVER in backends.values():
        backends["torch_memory_saver_hook_mode"] = memory_backend.hook_mode()
        hook = f" (torch_memory_saver hook mode {backends['torch_memory_saver_hook_mode']})"
    mp.annotate(**backends)
    print(f"trainer: memory backend: rollout {engine.memory_backend}, train offload {actor.offloader.backend}"
          f"{hook}", flush=True)


def _seed(seed: int, rollout_id: int, stream: int) -> int:
    return (seed * 1_000_003 + rollout_id * 101 + stream) % 2**63


def _generator(seed: int, rollout_id: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(_seed(seed, rollout_id, stream))


def _ids(i: int | None) -> dict:
    return {} if i is None else {"rollout_id": i}


class Stopped(TrainerError):
    """SIGTERM: torchrun stops every rank when one fails; the rank says so in one line."""


def _on_sigterm(signum, frame) -> None:
    exc = Stopped("" if dist.stop_was_asked() else f"rank {dist.from_env().rank}: stopped by signal {signum} "
                  "(torchrun stops the others when a rank fails)")
    exc.exit_code = 128 + signum
    raise exc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--plan" in argv:
        return plan_cli.main(argv)
    if "ray" in argv and any(a == "--launcher" and b == "ray" for a, b in zip(argv, argv[1:])):
        from trainer import ray_launch  # ranks, engines as Ray actors (docs/ray.md)
        return ray_launch.main(argv)
    cfg = parse_args(argv)  # exits 2 with one line on bad flags
    if dist.launched_by_torchrun():
        os.environ.setdefault(ROLE_ENV, "actor")  # before the first phase starts this rank's recorder
        dist.die_with_launcher()
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        run(cfg)
    except TrainerError as exc:
        if str(exc):  # empty: a stop the launcher was asked for, and says once
            print(f"trainer: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C: `run` has cleaned up on the way out (offload files, threads)
        if not os.environ.get(dist.STOP_FILE_ENV):  # under trainer.launch, the launcher says it once
            print("trainer: interrupted", file=sys.stderr, flush=True)
        return 130
    return 0


if __name__ == "__main__":
    gc_startup.freeze_imports()
    sys.exit(main())
