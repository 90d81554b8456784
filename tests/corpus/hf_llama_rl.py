"""A colocated RL loop on a Hugging Face Llama (random weights from a LlamaConfig, nothing downloaded).

    python tests/corpus/hf_llama_rl.py [--defect D] [--device cpu|cuda] [--iters N] [--size small|large|tiny]

A rollout copy of the policy generates with HF `generate` (KV cache), then the actor trains on the samples;
the two never hold the device at once. Each iteration, as slime/Miles order it:
generate -> offload_rollout -> onload_train -> train -> offload_train -> onload_weights -> update_weights.
On CUDA offloads are `.to("cpu")` (+ the optimizer state by hand) and `torch.cuda.empty_cache()`; on CPU
they are `torch.save` to a temporary directory and the tensors dropped (target disk).

Defects (planted; healthy = none):
  never_freed      a frozen "reference policy" dict keeps the rollout's first weights forever
                   (offload_drop: still_referenced on CUDA, never_freed on CPU, where RSS cannot tell why)
  grads_kept       the gradients kept for a grad-norm log survive offload_train (offload_drop/still_referenced)
  optimizer_kept   the hand-written state mover rebinds a loop variable: the state never moves (still_referenced)
  no_empty_cache   CUDA only: offload_train without torch.cuda.empty_cache() (cached_not_returned)
  leak             generate's scores kept per iteration for later analysis (leak/sustained_growth)
"""
from __future__ import annotations

import os

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import miles_profile as mp
from offload_tools import (device_of, drop_parameters, grad_bytes, log, move_optimizer_state, offload_dir,
                           optimizer_bytes, param_bytes, parse_args, release_cache, restore_parameters)

DEFECTS = ("never_freed", "grads_kept", "optimizer_kept", "no_empty_cache", "leak")
# small: vocab x hidden makes the embedding and the head 62.5 MiB each in fp32 (most of the state, in blocks
# glibc mmaps); large: ~220M parameters in bf16 for the H200; tiny: a few KiB.
SIZES = {
    "small": dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=8),
    "large": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                  num_attention_heads=16, num_key_value_heads=16),
    "tiny": dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=2),
}
BATCH = {"small": 4, "large": 32, "tiny": 4}
PROMPT_LEN, NEW_TOKENS, TRAIN_STEPS = 8, 24, 2


def build_model(size: str, device, dtype) -> torch.nn.Module:
    config = LlamaConfig(max_position_embeddings=256, tie_word_embeddings=False, **SIZES[size])
    with torch.device(device):  # initialised where it runs: a random init of 220M parameters on CPU takes long
        return AutoModelForCausalLM.from_config(config).to(dtype=dtype)


class Colocated:
    """The actor and the rollout copy, and their moves between the device and host memory (CUDA) or disk (CPU)."""

    def __init__(self, args):
        self.args, self.device = args, device_of(args)
        self.on_gpu = args.device == "cuda"
        self.target = "cpu" if self.on_gpu else "disk"
        dtype = torch.bfloat16 if self.on_gpu else torch.float32
        self.actor = build_model(args.size, self.device, dtype)
        self.rollout = build_model(args.size, self.device, dtype)
        self.rollout.load_state_dict(self.actor.state_dict())
        self.rollout.eval()
        self.optimizer = torch.optim.AdamW(self.actor.parameters(), lr=1e-5)
        self.dir = offload_dir("llama")
        self.reference = None    # never_freed: the frozen reference policy, taken once, never released
        self.grad_log = []       # grads_kept: the last step's gradients, for a grad-norm line
        self.scores = []         # leak: generate's scores of every iteration

    def path(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.pt")

    # -- rollout side ---------------------------------------------------------------------------
    def generate(self) -> torch.Tensor:
        batch = BATCH[self.args.size]
        prompts = torch.randint(3, SIZES[self.args.size]["vocab_size"], (batch, PROMPT_LEN), device=self.device)
        with torch.no_grad():
            out = self.rollout.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=NEW_TOKENS,
                                        min_new_tokens=NEW_TOKENS, do_sample=True, use_cache=True, pad_token_id=0,
                                        return_dict_in_generate=True, output_scores=self.args.defect == "leak")
        if self.args.defect == "leak":
            self.scores.append(torch.stack(out.scores))  # (new tokens, B, vocab) fp32, kept "for analysis"
        return out.sequences

    def offload_rollout(self) -> None:
        if self.args.defect == "never_freed" and self.reference is None:
            self.reference = dict(self.rollout.state_dict())  # the same tensors, not a copy on the host
        if self.on_gpu:
            self.rollout.to("cpu")
        else:
            torch.save(self.rollout.state_dict(), self.path("rollout"))
            drop_parameters(self.rollout)
        release_cache(self.args.device)

    def onload_weights(self) -> None:
        if self.on_gpu:
            self.rollout.to(self.device)
        else:
            restore_parameters(self.rollout, torch.load(self.path("rollout")), self.device)

    def update_weights(self) -> None:
        """The trained actor's weights into the rollout copy (the actor is offloaded by now)."""
        state = self.actor.state_dict() if self.on_gpu else torch.load(self.path("actor"))
        with torch.no_grad():
            for name, p in self.rollout.named_parameters():
                p.copy_(state[name])

    # -- actor side -----------------------------------------------------------------------------
    def train(self, sequences: torch.Tensor) -> float:
        self.actor.train()
        reward = torch.rand(sequences.shape[0], device=self.device)  # a stand-in reward model
        for _ in range(TRAIN_STEPS):
            logits = self.actor(sequences[:, :-1]).logits.float()
            logp = torch.log_softmax(logits, -1).gather(-1, sequences[:, 1:, None]).squeeze(-1)
            loss = -((reward - reward.mean())[:, None] * logp[:, PROMPT_LEN - 1:]).mean()  # REINFORCE
            loss.backward()
            if self.args.defect == "grads_kept":
                self.grad_log = [p.grad for p in self.actor.parameters()]
            self.optimizer.step()
        return float(loss)

    def train_state_bytes(self) -> int:
        return param_bytes(self.actor) + grad_bytes(self.actor) + optimizer_bytes(self.optimizer)

    def offload_train(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.on_gpu:
            self.actor.to("cpu")
            if self.args.defect == "optimizer_kept":
                for state in self.optimizer.state.values():
                    state = {k: v.to("cpu") for k, v in state.items()}  # noqa: F841 - the bug: rebinds a name
            else:
                move_optimizer_state(self.optimizer, "cpu")
        else:
            torch.save(self.actor.state_dict(), self.path("actor"))
            torch.save(self.optimizer.state_dict(), self.path("optim"))
            drop_parameters(self.actor)
            self.optimizer.state.clear()
        if self.args.defect != "no_empty_cache":
            release_cache(self.args.device)

    def onload_train(self) -> None:
        if self.on_gpu:
            self.actor.to(self.device)
            move_optimizer_state(self.optimizer, self.device)
        else:
            restore_parameters(self.actor, torch.load(self.path("actor")), self.device)
            self.optimizer.load_state_dict(torch.load(self.path("optim")))


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], DEFECTS, iters=8, sizes=tuple(SIZES))
    if args.defect == "no_empty_cache" and args.device != "cuda":
        log("no_empty_cache is a CUDA defect: CPU has no caching allocator")
        return 2
    loop = Colocated(args)
    target = loop.target
    with mp.phase("offload_train", target=target, expected_bytes=param_bytes(loop.actor), tags=["weights"]):
        loop.offload_train()  # setup: the actor waits off the device while the first rollout generates
    for it in range(args.iters):
        with mp.phase("generate", rollout_id=it):
            sequences = loop.generate()
        with mp.phase("offload_rollout", rollout_id=it, target=target, expected_bytes=param_bytes(loop.rollout),
                      tags=["weights", "kv_cache"]):
            loop.offload_rollout()
        with mp.phase("onload_train", rollout_id=it, target=target):
            loop.onload_train()
        with mp.phase("train", rollout_id=it):
            loss = loop.train(sequences)
        with mp.phase("offload_train", rollout_id=it, target=target, expected_bytes=loop.train_state_bytes(),
                      tags=["weights", "optimizer"]):
            loop.offload_train()
        with mp.phase("onload_weights", rollout_id=it, target=target, tags=["weights"]):
            loop.onload_weights()
        with mp.phase("update_weights", rollout_id=it, tags=["weights"]):
            loop.update_weights()
        log(f"iteration {it}: loss {loss:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
