"""Supervised fine-tuning of a Hugging Face GPT-2 (random weights from a GPT2Config), sampling between steps.

    python tests/corpus/hf_gpt2_sft.py [--defect D] [--device cpu|cuda] [--iters N] [--size small|large|tiny]

Each iteration: train (AdamW on synthetic token sequences) -> offload_train (the optimizer is saved to a
temporary directory and deleted outright, the gradients dropped; the weights stay for sampling) ->
generate (HF `generate` with its KV cache, a few eval samples) -> onload_train (a new AdamW, its state
loaded from the file). A user who deletes and rebuilds objects instead of moving tensors.

Defects (planted; healthy = none):
  grads_kept       the gradients kept for a grad-norm log survive offload_train (offload_drop/still_referenced;
                   on CPU recorded with --heap, so glibc's heap can tell a reference from retention)
  no_empty_cache   CUDA only: no torch.cuda.empty_cache() after the delete (offload_drop/cached_not_returned)
"""
from __future__ import annotations

import gc
import os

import torch
from transformers import AutoModelForCausalLM, GPT2Config

import miles_profile as mp
from offload_tools import device_of, grad_bytes, log, offload_dir, optimizer_bytes, parse_args, release_cache

DEFECTS = ("grads_kept", "no_empty_cache")
# small: the tied 50257 x 512 embedding is 98 MiB in fp32, most of the state; large: GPT-2 medium
# (~355M parameters) in bf16; tiny: a few KiB.
SIZES = {
    "small": dict(vocab_size=50257, n_embd=512, n_layer=2, n_head=8, n_positions=128),
    "large": dict(vocab_size=50257, n_embd=1024, n_layer=24, n_head=16, n_positions=256),
    "tiny": dict(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=64),
}
BATCH = {"small": 4, "large": 16, "tiny": 4}
SEQ = 32


class Finetune:
    def __init__(self, args):
        self.args, self.device = args, device_of(args)
        self.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
        with torch.device(self.device):  # initialised where it runs: GPT-2 medium's random init is slow on CPU
            self.model = AutoModelForCausalLM.from_config(GPT2Config(**SIZES[args.size])).to(dtype=self.dtype)
        self.optimizer = self.new_optimizer()
        self.path = os.path.join(offload_dir("gpt2"), "optimizer.pt")
        self.grad_log = []

    def new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=3e-5, weight_decay=0.01)

    def batch(self) -> torch.Tensor:
        vocab = SIZES[self.args.size]["vocab_size"]
        return torch.randint(0, vocab, (BATCH[self.args.size], SEQ), device=self.device)

    def train(self) -> float:
        self.model.train()
        tokens = self.batch()
        loss = self.model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        if self.args.defect == "grads_kept":
            self.grad_log = [p.grad for p in self.model.parameters()]  # for a per-layer grad-norm plot
        self.optimizer.step()
        return float(loss)

    def offload_bytes(self) -> int:
        return grad_bytes(self.model) + optimizer_bytes(self.optimizer)

    def offload_train(self) -> None:
        torch.save(self.optimizer.state_dict(), self.path)
        self.model.zero_grad(set_to_none=True)
        del self.optimizer
        gc.collect()
        if not (self.args.defect == "no_empty_cache"):
            release_cache(self.args.device)

    def generate(self) -> None:
        self.model.eval()
        prompt = self.batch()[:, :8]
        with torch.no_grad():
            self.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=True,
                                use_cache=True, pad_token_id=0)

    def onload_train(self) -> None:
        self.optimizer = self.new_optimizer()
        self.optimizer.load_state_dict(torch.load(self.path, map_location=self.device))
        os.remove(self.path)


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], DEFECTS, iters=5, sizes=tuple(SIZES))
    if args.defect == "no_empty_cache" and args.device != "cuda":
        log("no_empty_cache is a CUDA defect: CPU has no caching allocator")
        return 2
    run = Finetune(args)
    for it in range(args.iters):
        with mp.phase("train", rollout_id=it):
            loss = run.train()
        with mp.phase("offload_train", rollout_id=it, target="disk", expected_bytes=run.offload_bytes(),
                      tags=["optimizer"]):
            run.offload_train()
        with mp.phase("generate", rollout_id=it):
            run.generate()
        with mp.phase("onload_train", rollout_id=it, target="disk"):
            run.onload_train()
        log(f"iteration {it}: loss {loss:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
