"""The actor: the policy (and, with --use-critic, a value model), each trained by AdamW, with all
training state in flat buffers that `offload` moves to host memory or disk and `onload` brings back
(`offload_backend` builtin: the actor's own pinned buffers or disk files; torch_memory_saver: the state
is allocated in a region tagged `train_state` and paused with a CPU backup, see `offload`).

With `optimizer_on_host` (--optimizer-cpu-offload) the AdamW state and an fp32 master copy of the
weights live in host memory and the step runs there: gradients go down, updated weights come back.
The element-wise AdamW arithmetic is the same, so on a CPU run it matches the on-device optimizer bit
for bit; on CUDA the host and device kernels may round differently: the stated tolerance is rtol 1e-5,
atol 1e-7 on the weights after each step, given the same gradients (tests/unit/test_trainer_actor.py
checks it on CPU, tests/integration/test_trainer_gpu.py on a GPU: at most 2.4e-7 apart on the H200).
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch import nn
from torch.optim.adamw import adamw

import miles_profile as mp
from miles_profile.names import BUILTIN, GRADIENTS, OPTIMIZER_STATE, PAUSED, TORCH_MEMORY_SAVER, WEIGHTS
from trainer import algo, dist
from trainer.config import ModelConfig
from trainer.flat import FlatParams, trim_host_heap
from trainer.model import GPT, init_weights
from trainer.offload import DiskOffloader, HostOffloader, SaverOffloader, StateTensor, host_buffer

BETAS, EPS, WEIGHT_DECAY, MAX_GRAD_NORM = (0.9, 0.95), 1e-8, 0.01, 1.0  # AdamW: torch's default eps
# The ledger category of each piece of training state (StateTensor names end in these); the fp32
# master copy of a host-side optimizer is the optimizer's.
STATE_CATEGORY = {"params": WEIGHTS, "grads": GRADIENTS, "master_grad": GRADIENTS, "exp_avg": OPTIMIZER_STATE,
                  "exp_avg_sq": OPTIMIZER_STATE, "master": OPTIMIZER_STATE}


@dataclass(frozen=True)
class Batch:
    prompts: torch.Tensor    # (N, P) int64, groups of `group_size` consecutive rows share a prompt
    responses: torch.Tensor  # (N, R) int64
    rewards: torch.Tensor    # (N,) float32
    group_size: int


@dataclass(frozen=True)
class TrainStats:
    loss: float
    grad_norm: float


class TrainModel:
    """One network with its AdamW; parameters, gradients and optimizer state each one flat buffer."""

    def __init__(self, name: str, cfg: ModelConfig, out_dim: int | None, device: torch.device,
                 lr: float, optimizer_on_host: bool, seed: int):
        self.name = name
        with torch.device("meta"):
            self.module = GPT(cfg, out_dim)
        self.params = FlatParams(self.module, device, torch.float32, requires_grad=True)
        init_weights(self.module, torch.Generator(device).manual_seed(seed))
        dist.broadcast_(self.params.flat)  # data parallel: every rank starts from rank 0's weights
        self.grads = torch.zeros_like(self.params.flat)
        for p, (_, g) in zip(self.module.parameters(), self.params.views(self.grads)):
            p.grad = g  # backward accumulates into the flat gradient buffer in place
        self.on_host = optimizer_on_host
        if optimizer_on_host:
            self.master = nn.Parameter(host_buffer(self.params.flat).copy_(self.params.flat))
            self.master.grad = host_buffer(self.grads).zero_()
        else:
            self.master = nn.Parameter(self.params.flat)  # shares the storage of the model's views
            self.master.grad = self.grads
        # AdamW's state, allocated now rather than at the first step (as torch.optim.AdamW would), so the
        # footprint is constant from the start and every offload moves the same bytes
        self.lr = lr
        self.steps = torch.zeros((), dtype=torch.float32, device=self.master.device)  # fused: on the master's device
        self.exp_avg = torch.zeros_like(self.master, memory_format=torch.preserve_format)
        self.exp_avg_sq = torch.zeros_like(self.master, memory_format=torch.preserve_format)

    @torch.no_grad()
    def step(self) -> float:
        dist.average_(self.grads)  # data parallel: the mean of every rank's gradient, before clipping
        norm = self.grads.norm()
        self.grads.mul_(torch.clamp(MAX_GRAD_NORM / (norm + 1e-6), max=1.0))
        if self.on_host:
            self.master.grad.copy_(self.grads)
            self._adamw()
            self.params.flat.copy_(self.master, non_blocking=True)
        else:
            self._adamw()
        self.grads.zero_()
        return float(norm)

    def _adamw(self) -> None:
        """torch's fused AdamW over the flat master (one kernel, no full-size temporaries, unlike the for-each
        and single-tensor versions), through its functional form: what torch.optim.AdamW.step calls. The
        optimizer class would cost every rank 1.0 CPU-s and 23.7 MiB of heap at start for nothing used here
        (its first construction imports torch._dynamo, about 820 modules)."""
        adamw([self.master], [self.master.grad], [self.exp_avg], [self.exp_avg_sq], [], [self.steps], fused=True,
              amsgrad=False, beta1=BETAS[0], beta2=BETAS[1], lr=self.lr, weight_decay=WEIGHT_DECAY, eps=EPS,
              maximize=False)

    def state_tensors(self, chunk_bytes: int) -> list[StateTensor]:
        chunks = self.params.chunk_ranges(chunk_bytes, self.params.flat.element_size())
        master = self.master.data  # one object: the disk offloader finds a mirror by identity
        mirror = master if self.on_host else None
        state = [StateTensor(f"{self.name}.params", self.params.flat, chunks, mirror),
                 StateTensor(f"{self.name}.grads", self.grads, chunks),
                 StateTensor(f"{self.name}.exp_avg", self.exp_avg, chunks),
                 StateTensor(f"{self.name}.exp_avg_sq", self.exp_avg_sq, chunks)]
        if self.on_host:
            state += [StateTensor(f"{self.name}.master", master, chunks),
                      StateTensor(f"{self.name}.master_grad", self.master.grad, chunks)]
        return state


def _whiten_across_ranks(x: torch.Tensor) -> torch.Tensor:
    """algo.whiten with the mean and (unbiased) std of the whole data-parallel batch, not this rank's
    share: every rank then scales its advantages as one process with the full batch would."""
    stats = torch.stack([x.sum(), x.square().sum(), torch.tensor(float(x.numel()), device=x.device)]).double()
    dist.sum_(stats)
    total, squares, n = stats.tolist()
    mean = total / n
    std = max((squares - n * mean * mean) / (n - 1), 0.0) ** 0.5
    return (x - mean) / (std + 1e-6)


def state_region(owner: object, device: torch.device, offload_target: str, offload_backend: str):
    """Where a process allocates its training state: with torch_memory_saver, one tagged region."""
    if offload_backend != TORCH_MEMORY_SAVER:
        return contextlib.nullcontext()
    if device.type != "cuda" or offload_target != "cpu":
        raise ValueError("the torch_memory_saver offload backend needs CUDA and target cpu")
    return SaverOffloader.region(owner)


def make_offloader(state: list[StateTensor], owner: object, offload_target: str, disk_dir: Path | None,
                   offload_backend: str):
    if offload_backend == TORCH_MEMORY_SAVER:
        return SaverOffloader(state, owner)
    return DiskOffloader(state, disk_dir) if offload_target == "disk" else HostOffloader(state)


class Actor:
    """`critic`: the value model in another process (`--launcher ray` runs it as an actor of its own, as
    Miles does; trainer/critic.py): this process then holds the policy alone and asks it for values,
    its training step and its offloads. Without it, `use_critic` puts the critic in this process."""

    def __init__(self, cfg: ModelConfig, device: torch.device, *, lr: float, seed: int, use_critic: bool,
                 optimizer_cpu_offload: bool, micro_batch_size: int, offload_target: str = "cpu",
                 disk_dir: Path | None = None, chunk_bytes: int, offload_backend: str = BUILTIN, critic=None):
        self.device, self.micro_batch_size, self.chunk_bytes = device, micro_batch_size, chunk_bytes
        self.remote_critic = critic
        # With torch_memory_saver every device buffer of the training state lives in one tagged region.
        with state_region(self, device, offload_target, offload_backend):
            self.policy = TrainModel("policy", cfg, None, device, lr, optimizer_cpu_offload, seed)
            self.critic = (TrainModel("critic", cfg, 1, device, lr, optimizer_cpu_offload, seed + 1)
                           if use_critic and critic is None else None)
        state = [t for m in self.models for t in m.state_tensors(chunk_bytes)]
        self.state = state
        self.offloader = make_offloader(state, self, offload_target, disk_dir, offload_backend)
        self.declare_memory()

    @property
    def models(self) -> list[TrainModel]:
        return [self.policy] + ([self.critic] if self.critic else [])

    # --- training -------------------------------------------------------------------------------

    def train(self, batch: Batch, rollout_id: int | None = None) -> TrainStats:
        """One optimizer step on a rollout batch (gradients accumulated over micro-batches). A critic in
        another process trains on the same micro-batches meanwhile; its value losses come back and are
        added as the one-process loss adds them (the same float32 sums: the same printed loss)."""
        tokens = torch.cat([batch.prompts, batch.responses], dim=1).to(self.device)
        prompt_len, n = batch.prompts.shape[1], len(tokens)
        adv, returns = self._advantages(batch, tokens)
        remote = None
        if self.remote_critic is not None:
            remote = self.remote_critic.start_train(tokens, prompt_len, returns, self.micro_batch_size, rollout_id)
        policy_losses = []
        total = 0.0
        for i in range(0, n, self.micro_batch_size):
            part = slice(i, i + self.micro_batch_size)
            with self._autocast():
                logits = self.policy.module(tokens[part, :-1])
                logp = algo.response_logprobs(logits, tokens[part], prompt_len)
                loss = algo.policy_loss(logp, logp.detach(), adv[part])
                if self.critic is not None:
                    loss = loss + algo.value_loss(self._values(tokens[part], prompt_len), returns[part])
            (loss * (len(tokens[part]) / n)).backward()
            policy_losses.append((loss.detach(), len(tokens[part]) / n))
        norms = [m.step() for m in self.models]
        value_losses = self.remote_critic.result(remote) if remote is not None else [None] * len(policy_losses)
        for (loss, weight), value in zip(policy_losses, value_losses):
            total += (loss if value is None else loss + value).item() * weight
        return TrainStats(loss=total, grad_norm=norms[0])

    def _advantages(self, batch: Batch, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        rewards = batch.rewards.to(self.device)
        if self.critic is None and self.remote_critic is None:
            return algo.grpo_advantages(rewards, batch.group_size, batch.responses.shape[1]), None
        if self.remote_critic is not None:
            values = self.remote_critic.values(tokens, batch.prompts.shape[1], self.micro_batch_size)
        else:
            with torch.no_grad(), self._autocast():
                values = torch.cat([self._values(tokens[i:i + self.micro_batch_size], batch.prompts.shape[1])
                                    for i in range(0, len(tokens), self.micro_batch_size)]).float()
        adv, returns = algo.gae_advantages(rewards, values)
        return (_whiten_across_ranks(adv) if dist.is_initialized() else algo.whiten(adv)), returns

    def _values(self, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """(B, R) values of the states before each response token."""
        return self.critic.module(tokens[:, :-1])[:, prompt_len - 1:, 0]

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # --- memory ---------------------------------------------------------------------------------

    def offload(self, rollout_id: int | None = None) -> None:
        """The critic in its own process offloads its state at the same time, in a phase of its own."""
        pending = self.remote_critic.start("offload", rollout_id) if self.remote_critic is not None else None
        if not self.offloader.offloaded:
            self.offloader.offload()
            self.declare_memory()
        if pending is not None:
            self.remote_critic.result(pending)

    def onload(self, rollout_id: int | None = None) -> None:
        pending = self.remote_critic.start("onload", rollout_id) if self.remote_critic is not None else None
        if self.offloader.offloaded:
            self.offloader.onload()
            self.declare_memory()
        if pending is not None:
            self.remote_critic.result(pending)

    def declare_memory(self) -> None:
        declare_memory(self.state, self.offloader, self.device, owner="actor")

    def clear_memory(self, rollout_id: int | None = None) -> None:
        pending = self.remote_critic.start("clear_memory", rollout_id) if self.remote_critic is not None else None
        clear_memory(self.device)
        if pending is not None:
            self.remote_critic.result(pending)

    def state_bytes(self) -> int:
        return sum(t.nbytes for t in self.state)

    def weight_chunks(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The policy's weights as lists of (name, tensor), about chunk_bytes each, read from wherever
        they are now (device, host buffer, or verified disk chunks), never as one full extra copy."""
        flat, name = self.policy.params, "policy.params"
        if isinstance(self.offloader, DiskOffloader) and self.offloader.offloaded:
            for start, buf in self.offloader.iter_chunks(name):
                yield list(flat.views(buf, start, start + buf.numel(), buffer_start=start))
            return
        source = (self.offloader.host_copy(name) if isinstance(self.offloader, (HostOffloader, SaverOffloader))
                  else None)
        source = flat.flat if source is None else source
        for start, end in flat.chunk_ranges(self.chunk_bytes, flat.flat.element_size()):
            yield list(flat.views(source, start, end))

    def close(self) -> None:
        """Stop the offload threads, unlock pinned buffers, remove stale offload files."""
        self.offloader.close()


def declare_memory(state: list[StateTensor], offloader, device: torch.device, owner: str) -> None:
    """What the training state holds where, for the recorder's ledger (miles_profile.account,
    docs/ledger.md): weights, gradients and optimizer state on each device (a paused
    torch_memory_saver region holds nothing there), plus the offloader's host buffers."""
    held: dict[tuple[str, str], int] = {}
    paused = offloader.backend == TORCH_MEMORY_SAVER and offloader.offloaded
    for s in state:
        where = "host" if s.tensor.device.type == "cpu" else str(s.tensor.device)
        nbytes = 0 if paused and where != "host" else s.tensor.untyped_storage().nbytes()
        key = (where, STATE_CATEGORY[s.name.rsplit(".", 1)[1]])
        held[key] = held.get(key, 0) + nbytes
    for category, nbytes in offloader.host_bytes().items():
        held[("host", category)] = held.get(("host", category), 0) + nbytes
    if offloader.backend == TORCH_MEMORY_SAVER:  # the paused state stays in the allocator's counters
        held[(str(device), PAUSED)] = offloader.expected_bytes() if paused else 0
    for (where, category), nbytes in held.items():
        mp.account(category, nbytes, where, owner=owner)


def clear_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    trim_host_heap()
