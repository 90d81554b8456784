"""A LoRA RL loop with Hugging Face peft (a Llama from a LlamaConfig, nothing downloaded).

    python tests/corpus/peft_lora_rl.py [--defect D] [--device cpu|cuda] [--iters N] [--size small|large|tiny]

`get_peft_model` wraps every linear layer with rank-r adapters; the frozen base stays where it is for the
whole run (by design: only the adapters train). Each iteration: generate (HF `generate`, KV cache) ->
ref_logprobs (the same model with its adapters switched off, `with model.disable_adapter()`: no second copy
of the base) -> train (a policy-gradient step on the adapters) -> offload_train (the AdamW state leaves:
`.to("cpu")` + `empty_cache` on CUDA, `torch.save` to a temporary directory on CPU; declared) -> onload_train.

Defects (planted; healthy = none):
  keep_state   a norm log keeps the optimizer's tensors, rebound every iteration: each offload frees the
               previous iteration's copy and keeps the new one (offload_drop: still_referenced)
"""
from __future__ import annotations

import os

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig

import miles_profile as mp
from offload_tools import (device_of, log, move_optimizer_state, offload_dir, optimizer_bytes, parse_args,
                           release_cache)

DEFECTS = ("keep_state",)
# small: rank 192 on a 2-layer 1024-wide model, ~58 MiB of AdamW state; large: a
# 16-layer 2048-wide bf16 base with fp32 rank-64 adapters (~40M parameters, ~320 MiB of state); tiny: KiBs.
SIZES = {
    "small": (dict(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                   num_attention_heads=8, num_key_value_heads=8), 192),
    "large": (dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                   num_attention_heads=16, num_key_value_heads=16), 64),
    "tiny": (dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2), 2),
}
BATCH = {"small": 4, "large": 16, "tiny": 4}
NEW_TOKENS = {"small": 24, "large": 48, "tiny": 48}  # small: the CPU suite's case, half the tokens, half the CPU
PROMPT_LEN = 16


def build(size: str, device, dtype) -> torch.nn.Module:
    config, rank = SIZES[size]
    with torch.device(device):
        base = AutoModelForCausalLM.from_config(LlamaConfig(max_position_embeddings=256, **config)).to(dtype=dtype)
    # peft keeps the adapters in fp32 over a bf16 base (autocast_adapter_dtype), as a user's run has them
    return get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"))


def token_logprobs(model, sequences: torch.Tensor) -> torch.Tensor:
    logits = model(sequences[:, :-1]).logits.float()
    return torch.log_softmax(logits, -1).gather(-1, sequences[:, 1:, None]).squeeze(-1)[:, PROMPT_LEN - 1:]


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], DEFECTS, iters=6, sizes=tuple(SIZES))
    device, on_gpu = device_of(args), args.device == "cuda"
    model = build(args.size, device, torch.bfloat16 if on_gpu else torch.float32)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    state_file = os.path.join(offload_dir("peft"), "adam.pt")
    target = "cpu" if on_gpu else "disk"
    norm_log: list[torch.Tensor] = []  # keep_state: "the state's norms, later"; the tensors themselves
    for it in range(args.iters):
        with mp.phase("generate", rollout_id=it), torch.no_grad():
            prompts = torch.randint(3, SIZES[args.size][0]["vocab_size"], (BATCH[args.size], PROMPT_LEN), device=device)
            new = NEW_TOKENS[args.size]
            sequences = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new,
                                       min_new_tokens=new, do_sample=True, pad_token_id=0)
        with mp.phase("ref_logprobs", rollout_id=it), torch.no_grad(), model.disable_adapter():
            reference = token_logprobs(model, sequences)
        with mp.phase("train", rollout_id=it):
            logp = token_logprobs(model, sequences)
            ratio = (logp.detach() - reference).exp()
            advantage = torch.randn(sequences.shape[0], 1, device=device)  # a stand-in reward model
            loss = -(advantage * ratio * logp).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        with mp.phase("offload_train", rollout_id=it, target=target, expected_bytes=optimizer_bytes(optimizer),
                      tags=["optimizer"]):
            if args.defect == "keep_state":
                norm_log = [v for state in optimizer.state.values() for v in state.values() if v.dim() > 0]
            if on_gpu:
                move_optimizer_state(optimizer, "cpu")
            else:
                torch.save(optimizer.state_dict(), state_file)
                optimizer.state.clear()
            release_cache(args.device)
        with mp.phase("onload_train", rollout_id=it, target=target):
            if on_gpu:
                move_optimizer_state(optimizer, device)
            else:
                optimizer.load_state_dict(torch.load(state_file))
        log(f"iteration {it}: loss {loss.item():.4f}, {len(norm_log)} tensors in the norm log")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
