"""A plain torch training loop: an nn.Sequential MLP, AdamW, and the optimizer state offloaded between steps.

    python tests/corpus/mlp_adamw.py [--defect D] [--device cpu|cuda] [--iters N] [--size small|large|tiny]

Each iteration: train (a few AdamW steps) -> offload_train (the optimizer state to disk on CPU, to host
memory by hand on CUDA) -> eval (no-grad batches, the optimizer state away) -> onload_train.

Defects (planted; healthy = none):
  optimizer_kept   the state is saved but the device copy stays referenced (offload_drop/still_referenced)
  late_free        an async writer frees the state after the phase returned (offload_drop/freed_late)
  no_empty_cache   CUDA only: moved, but the cache is not returned (offload_drop/cached_not_returned)
  leak             a weight snapshot kept per iteration (leak/sustained_growth)
Healthy traps (must not fail):
  retention        the onload after warm-up stages the file once through small heap chunks glibc keeps (a one-time step)
  warmup           the first iteration runs an 8x batch (a bigger warm-up iteration)
"""
from __future__ import annotations

import os
import threading
import time

import torch
from torch import nn

import miles_profile as mp
from offload_tools import (device_of, log, move_optimizer_state, offload_dir, optimizer_bytes, parse_args,
                           release_cache)

DEFECTS = ("optimizer_kept", "late_free", "no_empty_cache", "leak", "retention", "warmup")
# width, hidden: small makes each Linear 32 MiB in fp32 (glibc mmaps a block that large, so a freed tensor
# leaves RSS at once) and the AdamW state 128 MiB; large 256 MiB a Linear; tiny holds a few KiB of state,
# below every series' resolution.
SIZES = {"small": (2048, 4096), "large": (4096, 16384), "tiny": (16, 64)}
BATCH, STEPS, EVAL_BATCHES = 16, 2, 4


def build(width: int, hidden: int, device) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def train(model, optimizer, width: int, batch: int, device) -> float:
    for _ in range(STEPS):
        x = torch.randn(batch, width, device=device)
        loss = (model(x) - x).pow(2).mean()  # an autoencoder on noise: enough to move every weight
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return float(loss)


class OptimizerOffload:
    """The optimizer state away during eval: a file on CPU runs, host memory on CUDA runs."""

    def __init__(self, optimizer, device: str, defect: str):
        self.optimizer, self.device, self.defect = optimizer, device, defect
        self.path = os.path.join(offload_dir("mlp"), "optimizer.pt")
        self.kept = None          # optimizer_kept: the device copy someone still holds
        self.writer = None        # late_free: the async writer still running after the phase
        self.records = []         # retention: the blocks kept from the one staged read

    @property
    def target(self) -> str:
        return "disk" if self.device == "cpu" else "cpu"

    def offload(self) -> None:
        if self.defect == "late_free":  # an async checkpoint: the phase returns while it still holds the state
            self.writer = threading.Thread(target=self._offload_now, args=(0.4,))
            self.writer.start()
        else:
            self._offload_now()

    def _offload_now(self, delay_s: float = 0.0) -> None:
        time.sleep(delay_s)  # serialising a real checkpoint takes a while
        if self.defect == "optimizer_kept":  # a handle taken "for logging" keeps every state tensor alive
            self.kept = [dict(s) for s in self.optimizer.state.values()]
        if self.device == "cpu":
            torch.save(self.optimizer.state_dict(), self.path)
            self.optimizer.state.clear()
        else:
            move_optimizer_state(self.optimizer, "cpu")
        if self.defect != "no_empty_cache":
            release_cache(self.device)

    def wait(self) -> None:
        if self.writer is not None:
            self.writer.join()
            self.writer = None

    def onload(self, iteration: int) -> None:
        self.wait()
        if self.device == "cpu":
            if self.defect == "retention" and iteration == 1:  # once, after the warm-up iteration
                self._stage_in_chunks()
            self.optimizer.load_state_dict(torch.load(self.path))
            os.remove(self.path)
        else:
            move_optimizer_state(self.optimizer, "cuda")
        self.kept = None

    def _stage_in_chunks(self, chunk: int = 100 * 1024) -> None:
        """Verify the file through 100 KiB reads (below glibc's mmap threshold, so from the heap, one after
        the other), keeping every 8th block as a sample: the freed blocks between them are holes glibc
        can neither trim nor fit a tensor into, so RSS keeps them: a one-time step of the floor."""
        chunks = []
        with open(self.path, "rb") as f:
            while block := f.read(chunk):
                chunks.append(block)
        self.records = chunks[::8]
        del chunks, block


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], DEFECTS, iters=8, sizes=("small", "large", "tiny"))
    if args.defect == "no_empty_cache" and args.device != "cuda":
        log("no_empty_cache is a CUDA defect: CPU has no caching allocator")
        return 2
    device = device_of(args)
    width, hidden = SIZES[args.size]
    model, optimizer = build(width, hidden, device)
    offload = OptimizerOffload(optimizer, args.device, args.defect)
    snapshots = []
    for it in range(args.iters):
        batch = BATCH * 8 if args.defect == "warmup" and it == 0 else BATCH
        with mp.phase("train", rollout_id=it):
            loss = train(model, optimizer, width, batch, device)
        state_bytes = optimizer_bytes(optimizer)
        with mp.phase("offload_train", rollout_id=it, target=offload.target, expected_bytes=state_bytes,
                      tags=["optimizer"]):
            offload.offload()
        with mp.phase("eval", rollout_id=it), torch.no_grad():
            for _ in range(EVAL_BATCHES):
                model(torch.randn(BATCH, width, device=device))
            time.sleep(0.3)  # the rest of the eval (metrics, logging): long enough for the sampler to see it
            offload.wait()
        if args.defect == "leak":  # "keep the weights of every iteration to plot their drift later"
            snapshots.append(model[0].weight.detach().clone())
        with mp.phase("onload_train", rollout_id=it, target=offload.target):
            offload.onload(it)
        log(f"iteration {it}: loss {loss:.4f}, optimizer state {state_bytes} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
