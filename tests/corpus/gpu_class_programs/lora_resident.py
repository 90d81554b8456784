"""Class 2 of issue 30 (memory resident by design), a GPU program nobody here tuned the checks on: a user's
LoRA RL loop in plain torch + transformers. The frozen base stays on the GPU the whole run (by design); it is
built in fp32 and cast to bf16, which leaves the allocator's cache holding the fp32 blocks. Each iteration:
generate (HF KV cache) -> train (only the low-rank adapters) -> offload_train (adapters + AdamW state to the
host, declared) -> onload_train. Healthy: every offload frees what it declares; expected exit 0.
--defect keep_state: offload_train leaves the AdamW state on the GPU (expected: offload_drop fails).
Run under `python -m miles_profile.record --exec`. HF_SMALL=1: a CPU dry run of the script itself."""
import argparse
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import miles_profile as mp

p = argparse.ArgumentParser()
p.add_argument("--defect", default="none")
p.add_argument("--iters", type=int, default=4)
a = p.parse_args()
small = os.environ.get("HF_SMALL") == "1"
dev = "cpu" if small else "cuda"
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=32000, hidden_size=256 if small else 2048, intermediate_size=512 if small else 5632,
                  num_hidden_layers=2 if small else 16, num_attention_heads=4 if small else 16,
                  num_key_value_heads=4 if small else 16, max_position_embeddings=512)
with torch.device(dev):
    base = LlamaForCausalLM(cfg)          # fp32 first, as from_pretrained without torch_dtype does
base = base.to(torch.bfloat16)            # the fp32 blocks stay cached in the allocator
base.requires_grad_(False)
base.generation_config.eos_token_id = None
base.generation_config.pad_token_id = 0
R = 256  # adapters + AdamW state ~190 MiB: above every series resolution


class LoRA(torch.nn.Module):
    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        self.lin = lin
        self.a = torch.nn.Parameter(torch.randn(R, lin.in_features, device=dev, dtype=torch.bfloat16) * 0.01)
        self.b = torch.nn.Parameter(torch.zeros(lin.out_features, R, device=dev, dtype=torch.bfloat16))

    def forward(self, x):
        return self.lin(x) + (x @ self.a.t()) @ self.b.t()


for layer in base.model.layers:
    layer.self_attn.q_proj = LoRA(layer.self_attn.q_proj)
    layer.self_attn.v_proj = LoRA(layer.self_attn.v_proj)
adapters = [p_ for n, p_ in base.named_parameters() if n.endswith(".a") or n.endswith(".b")]
opt = torch.optim.AdamW(adapters, lr=1e-4)


def state_tensors():
    yield from adapters
    for st in opt.state.values():
        yield from (v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)


def move(to, keep_state=False):
    for p_ in adapters:
        p_.data = p_.data.to(to)
        if p_.grad is not None:
            p_.grad = None
    if not keep_state:
        for st in opt.state.values():
            for k, v in st.items():
                if torch.is_tensor(v) and v.dim() > 0:
                    st[k] = v.to(to)


prompt = torch.randint(0, cfg.vocab_size, (8, 64), device=dev)
for it in range(a.iters):
    with mp.phase("generate", rollout_id=it, tags=["kv_cache"]):
        with torch.no_grad():
            out = base.generate(prompt, max_new_tokens=128 if not small else 8, do_sample=False)
        del out
    with mp.phase("train", rollout_id=it):
        for _ in range(2):
            loss = base(prompt, labels=prompt).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        del loss
    n = sum(t.numel() * t.element_size() for t in state_tensors())
    with mp.phase("offload_train", rollout_id=it, target="cpu", expected_bytes=n):
        move("cpu", keep_state=a.defect == "keep_state")
        if dev == "cuda":
            torch.cuda.empty_cache()
    with mp.phase("onload_train", rollout_id=it):
        move(dev)
print("done", a.defect)
