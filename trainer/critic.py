"""The critic (PPO's value model) in a process of its own, as Miles runs it: under `--launcher ray` one
critic per rank, a Ray actor in the rank's bundle (trainer/ray_launch.py), its N copies averaging their
gradients in a process group of their own. The rank (trainer/actor.py, `Actor(critic=...)`) asks it for
values, hands it the returns to train on, and asks it to offload and onload with its own state.

Under torchrun the critic stays in the rank's process (`--use-critic`); the arithmetic here is the same
(the same seed, micro-batches, loss scaling and AdamW), so both launchers train the same numbers. Its
offloads follow the rank's flags (`--offload-train`, its target and backend) in phases of its own, with
the critic's own expected bytes: the recorder judges each process by what it held.
"""
from __future__ import annotations

import contextlib
import shutil

import torch

import miles_profile as mp
from miles_profile.names import CLEAR_MEMORY, OFFLOAD_TRAIN, ONLOAD_TRAIN, TRAIN
from trainer import algo
from trainer.actor import TrainModel, clear_memory, declare_memory, make_offloader, state_region
from trainer.args import RunConfig
from trainer.config import model_config


class Critic:
    def __init__(self, cfg: RunConfig, device: torch.device):
        from trainer.train import own_disk_dir  # the rank's offload-directory rules, for this process
        self.device = device
        self.disk_dir = own_disk_dir(cfg)
        model_cfg = model_config(cfg.preset, cfg.digits)
        with state_region(self, device, cfg.offload_train_target, cfg.offload_train_backend):
            self.model = TrainModel("critic", model_cfg, 1, device, cfg.lr, cfg.optimizer_cpu_offload, cfg.seed + 1)
        self.state = self.model.state_tensors(cfg.chunk_bytes)
        self.offloader = make_offloader(self.state, self, cfg.offload_train_target, self.disk_dir,
                                        cfg.offload_train_backend)
        declare_memory(self.state, self.offloader, device, owner="critic")

    def values(self, tokens: torch.Tensor, prompt_len: int, micro_batch_size: int) -> torch.Tensor:
        """(B, R) values of the states before each response token, by micro-batch (as in one process)."""
        tokens = tokens.to(self.device)
        with torch.no_grad(), self._autocast():
            return torch.cat([self._values(tokens[i:i + micro_batch_size], prompt_len)
                              for i in range(0, len(tokens), micro_batch_size)]).float().cpu()

    def train(self, tokens: torch.Tensor, prompt_len: int, returns: torch.Tensor, micro_batch_size: int,
              rollout_id: int | None = None) -> list[float]:
        """One optimizer step on the value loss; the loss of each micro-batch (float32 values)."""
        with mp.phase(TRAIN, **_ids(rollout_id)):
            tokens, returns = tokens.to(self.device), returns.to(self.device)
            n, losses = len(tokens), []
            for i in range(0, n, micro_batch_size):
                part = slice(i, i + micro_batch_size)
                with self._autocast():
                    loss = algo.value_loss(self._values(tokens[part], prompt_len), returns[part])
                (loss * (len(tokens[part]) / n)).backward()
                losses.append(loss.item())
            self.model.step()
            return losses

    def offload(self, rollout_id: int | None = None) -> None:
        with mp.phase(OFFLOAD_TRAIN, **_ids(rollout_id), **self._moves()):
            if not self.offloader.offloaded:
                self.offloader.offload()
                declare_memory(self.state, self.offloader, self.device, owner="critic")

    def onload(self, rollout_id: int | None = None) -> None:
        with mp.phase(ONLOAD_TRAIN, **_ids(rollout_id), **self._moves()):
            if self.offloader.offloaded:
                self.offloader.onload()
                declare_memory(self.state, self.offloader, self.device, owner="critic")

    def clear_memory(self, rollout_id: int | None = None) -> None:
        with mp.phase(CLEAR_MEMORY, **_ids(rollout_id)):
            clear_memory(self.device)

    def close(self) -> None:
        self.offloader.close()
        if self.disk_dir is not None:
            shutil.rmtree(self.disk_dir, ignore_errors=True)

    def _moves(self) -> dict:
        return {"target": self.offloader.target, "backend": self.offloader.backend,
                "expected_bytes": self.offloader.expected_bytes()}

    def _values(self, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
        return self.model.module(tokens[:, :-1])[:, prompt_len - 1:, 0]

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()


def _ids(rollout_id: int | None) -> dict:
    return {} if rollout_id is None else {"rollout_id": rollout_id}
