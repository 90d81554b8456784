"""A training loop of its own through accelerate (run it with `accelerate launch` or torchrun), a tiny
random Llama built from a config (nothing downloaded), on CPU.

    accelerate launch --cpu --num_processes 1 accelerate_loop.py [--steps N] [--leak-mib M]

--leak-mib M: the loop keeps M MiB per step (losses "for a plot", with a buffer): the planted leak.
"""
import argparse
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--leak-mib", type=float, default=0)
parser.add_argument("--step-ms", type=float, default=0, help="compute time per step, as a real model has")
args = parser.parse_args()

torch.manual_seed(0)
accelerator = Accelerator(cpu=True)
model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = DataLoader(torch.randint(0, 128, (2048, 32)), batch_size=4)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
kept = []
for step, batch in enumerate(data):
    if step == args.steps:
        break
    loss = model(input_ids=batch, labels=batch).loss
    accelerator.backward(loss)
    time.sleep(args.step_ms / 1000)
    optimizer.step()
    optimizer.zero_grad()
    if args.leak_mib:
        kept.append(torch.ones(int(args.leak_mib * 2 ** 20) // 4))
accelerator.print("trained", args.steps, "steps on", accelerator.num_processes, "processes")
