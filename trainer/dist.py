"""Data parallelism across ranks started by torchrun: who this process is, and the collectives the
trainer needs (parameters broadcast once, gradients averaged before each optimizer step).

Without torchrun's environment (RANK, WORLD_SIZE, ...) nothing here initialises torch.distributed and
every collective is a no-op, so a one-process run is exactly what it was before.
"""
from __future__ import annotations

import datetime
import os
import signal
from dataclasses import dataclass

import torch
import torch.distributed as dist

from miles_profile.lifetime import die_with_parent
from trainer.errors import TrainerError

# A peer that died leaves the others blocked in a collective; gloo and NCCL give up after this.
# Short enough for a test of a killed rank, long enough for the slowest step of the gpu preset.
DEFAULT_TIMEOUT_S = float(os.environ.get("TRAINER_DIST_TIMEOUT_S", 300))


class PeerError(TrainerError):
    """A collective failed: a peer rank died or timed out."""


@dataclass(frozen=True)
class Rank:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def from_env(env: dict | None = None) -> Rank:
    """torchrun's RANK / LOCAL_RANK / WORLD_SIZE, or a single process when they are absent."""
    env = os.environ if env is None else env
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return Rank()
    return Rank(int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), int(env["WORLD_SIZE"]))


def launched_by_torchrun(env: dict | None = None) -> bool:
    env = os.environ if env is None else env
    return "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env)


# Set by trainer/launch.py: its pid (a rank dies with it), and a file that exists once a user's
# Ctrl-C or SIGTERM asked the run to stop (the launcher then says so once, the ranks say nothing).
LAUNCHER_PID_ENV = "TRAINER_LAUNCHER_PID"
STOP_FILE_ENV = "TRAINER_STOP_FILE"


def die_with_launcher(env: dict | None = None) -> None:
    """A rank must not outlive torchrun (a `kill -9` of it, or of `record`, left ranks holding memory
    and writing into the run): SIGKILL when it dies. torchrun forks the ranks on its main thread."""
    env = os.environ if env is None else env
    launcher = env.get(LAUNCHER_PID_ENV)
    die_with_parent(signal.SIGKILL, int(launcher) if launcher and launcher.isdigit() else None)


def stop_was_asked(env: dict | None = None) -> bool:
    """Whether the launcher was told to stop (Ctrl-C, SIGTERM): then a rank's stop is no error of its own."""
    path = (os.environ if env is None else env).get(STOP_FILE_ENV)
    return bool(path) and os.path.exists(path)


def init(rank: Rank, device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join the process group: NCCL when the rank trains on CUDA, gloo on CPU."""
    if not rank.distributed or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_(tensor: torch.Tensor) -> None:
    """Every rank starts from rank 0's values (they are equal by seed; this makes it a contract)."""
    if dist.is_initialized():
        _collective(dist.broadcast, tensor, 0)


def average_(tensor: torch.Tensor) -> None:
    """In place: the mean of `tensor` over ranks (SUM then divide: gloo has no AVG)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        _collective(dist.all_reduce, tensor, op=dist.ReduceOp.SUM)
        tensor.div_(dist.get_world_size())


def sum_(tensor: torch.Tensor) -> None:
    """In place: the sum of `tensor` over ranks."""
    if dist.is_initialized():
        _collective(dist.all_reduce, tensor, op=dist.ReduceOp.SUM)


def is_initialized() -> bool:
    return dist.is_initialized()


def _collective(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except (RuntimeError, dist.DistError) as exc:  # a dead peer: gloo's connection closed, or a timeout
        raise PeerError(f"rank {dist.get_rank()}: {fn.__name__} failed, a peer rank died or timed out "
                        f"({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
