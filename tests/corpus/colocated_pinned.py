"""A colocated RL step in plain torch, written the way verl- and slime-style loops hand-roll it: a
preallocated KV pool released between rollouts, the AdamW state parked in pinned host buffers with
non_blocking copies, bf16 autocast, and optionally CUDA graphs and expandable segments. CUDA only.

    python tests/corpus/colocated_pinned.py [--defect D] [--iters N] [--size large|small|tiny]
                                            [--expandable] [--cuda-graph]

Each iteration: onload_rollout (allocate the KV pool) -> generate (a decode loop writing into the pool;
with --cuda-graph one decode step is a captured graph whose private pool outlives every offload, as
SGLang's do) -> offload_rollout (drop the pool, empty_cache) -> onload_train (the AdamW state back from
pinned buffers) -> train (bf16 autocast) -> offload_train (state into the pinned buffers with
non_blocking copies, one synchronize, gradients dropped, empty_cache).
`--expandable` runs under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.

Defects (planted; healthy = none):
  kv_view_kept    a 16-token slice of the pool kept "for logging": a view keeps its whole base storage, so
                  offload_rollout frees nothing (offload_drop/still_referenced)
  state_kept      the pinned copy is made, but the device state is kept as a "backup" in case the copy
                  failed (offload_drop/still_referenced on offload_train)
  no_empty_cache  offload_train drops the state but never calls empty_cache (offload_drop/cached_not_returned)
  leak            every iteration's last hidden state kept for a later plot (leak/sustained_growth)
"""
from __future__ import annotations

import os
import sys
import time

import miles_profile as mp
from offload_tools import MiB, grad_bytes, log, optimizer_bytes, parse_args, tensor_bytes

DEFECTS = ("kv_view_kept", "state_kept", "no_empty_cache", "leak")
# (width, layers, KV pool bytes, batch): large fills a few GiB of an H200 in each footprint.
SIZES = {"large": (4096, 16, 8 << 30, 64), "small": (1024, 4, 256 * MiB, 16), "tiny": (16, 1, 64 << 10, 2)}
DECODE_STEPS = 32
REWARD_S = 0.4  # scoring the samples on the host: long enough for the sampler to read each iteration's floor

if "--expandable" in sys.argv:  # before torch initialises CUDA
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    sys.argv.remove("--expandable")
CUDA_GRAPH = "--cuda-graph" in sys.argv
if CUDA_GRAPH:
    sys.argv.remove("--cuda-graph")

import torch  # noqa: E402  (after the allocator's configuration)
from torch import nn  # noqa: E402


class Rollout:
    """The inference side: a KV pool held only while generating, and a decode step (maybe a graph)."""

    def __init__(self, model: nn.Module, kv_bytes: int, batch: int, width: int, defect: str):
        self.model, self.kv_bytes, self.batch, self.width, self.defect = model, kv_bytes, batch, width, defect
        self.kv: torch.Tensor | None = None
        self.logged: torch.Tensor | None = None
        self.static_in = torch.zeros(batch, width, device="cuda", dtype=torch.bfloat16)
        self.graph = None

    def onload(self) -> None:
        self.kv = torch.empty(self.kv_bytes // 2, dtype=torch.bfloat16, device="cuda")

    def _step(self) -> torch.Tensor:
        # no cast cache: a graph must cast the weights it reads on every replay, not keep a capture-time copy
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            return self.model(self.static_in)

    def generate(self) -> torch.Tensor:
        if CUDA_GRAPH and self.graph is None:  # captured once, replayed every iteration after
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_out = self._step()
        per_token = self.batch * self.width
        slots = self.kv.view(-1)[: DECODE_STEPS * per_token].view(DECODE_STEPS, self.batch, self.width)
        self.static_in.normal_()
        for t in range(DECODE_STEPS):
            if self.graph is not None:
                self.graph.replay()
                out = self.static_out
            else:
                out = self._step()
            slots[t].copy_(out)
            self.static_in.copy_(out)
        if self.defect == "kv_view_kept":  # "the latest first tokens, for the sample log"
            self.logged = slots[0, :1, :16]
        return out

    def offload(self) -> None:
        self.kv = None
        torch.cuda.empty_cache()


class Train:
    """The training side: fp32 weights, AdamW, its state parked in pinned host buffers between steps."""

    def __init__(self, model: nn.Module, batch: int, width: int, defect: str):
        self.model, self.batch, self.width, self.defect = model, batch, width, defect
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.pinned: dict[tuple[int, str], torch.Tensor] = {}
        self.backup: list = []

    def step(self) -> float:
        x = torch.randn(self.batch, self.width, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.model(x).float().pow(2).mean()
        loss.backward()
        self.optimizer.step()
        return float(loss)

    def declared(self) -> int:
        return optimizer_bytes(self.optimizer) + grad_bytes(self.model)

    def offload(self) -> None:
        for i, state in enumerate(self.optimizer.state.values()):
            for key, value in state.items():
                if torch.is_tensor(value) and value.is_cuda:
                    buf = self.pinned.get((i, key))
                    if buf is None:  # pinned once, reused every iteration (pinning costs ~0.4 s a GiB)
                        buf = self.pinned[(i, key)] = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
                    buf.copy_(value, non_blocking=True)
                    if self.defect == "state_kept":
                        self.backup.append(value)
                    state[key] = buf
        torch.cuda.synchronize()  # the copies have landed before the device tensors are given back
        self.optimizer.zero_grad(set_to_none=True)
        self.backup = self.backup[-len(self.pinned):]  # the latest backup only: a one-time step, not a leak
        if self.defect != "no_empty_cache":
            torch.cuda.empty_cache()

    def onload(self) -> None:
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and value.is_pinned():
                    state[key] = value.to("cuda", non_blocking=True)
        torch.cuda.synchronize()


def build(width: int, layers: int) -> nn.Module:
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*blocks, nn.LayerNorm(width)).cuda()


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], DEFECTS, iters=8, sizes=tuple(SIZES))
    if args.device != "cuda":
        log("a CUDA program: pinned host buffers and the caching allocator are what it exercises")
        return 2
    width, layers, kv_bytes, batch = SIZES[args.size]
    model = build(width, layers)
    rollout, train = Rollout(model, kv_bytes, batch, width, args.defect), Train(model, batch, width, args.defect)
    kept = []
    for it in range(args.iters):
        with mp.phase("onload_rollout", rollout_id=it):
            rollout.onload()
        with mp.phase("generate", rollout_id=it):
            hidden = rollout.generate()
            time.sleep(REWARD_S)
        with mp.phase("offload_rollout", rollout_id=it, target="cpu", expected_bytes=tensor_bytes([rollout.kv]),
                      tags=["kv_cache"]):
            rollout.offload()
        with mp.phase("onload_train", rollout_id=it):
            train.onload()
        with mp.phase("train", rollout_id=it):
            loss = train.step()
            if args.defect == "leak":  # "keep the last hidden states to plot their drift later"
                kept.append(hidden.float().repeat(256, 1))  # 256 MiB at --size large
        with mp.phase("offload_train", rollout_id=it, target="cpu", expected_bytes=train.declared(),
                      tags=["optimizer", "gradients"]):
            train.offload()
        log(f"iteration {it}: loss {loss:.4f}, {torch.cuda.memory_allocated() / MiB:.0f} MiB allocated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
