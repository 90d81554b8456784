"""A Lightning fit of a tiny random Llama (built from a config, nothing downloaded), on CPU.

    python lightning_fit.py [--steps N] [--leak-mib M]

--leak-mib M: training_step keeps M MiB per step in a list on the module (the planted leak).
"""
import argparse
import time

import lightning as L
import torch
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--leak-mib", type=float, default=0)
parser.add_argument("--step-ms", type=float, default=0, help="compute time per step, as a real model has")
args = parser.parse_args()


class TinyLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                                  max_position_embeddings=64))
        self.kept = []

    def training_step(self, batch, batch_idx):
        time.sleep(args.step_ms / 1000)
        if args.leak_mib:
            self.kept.append(torch.ones(int(args.leak_mib * 2 ** 20) // 4))
        return self.model(input_ids=batch, labels=batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


torch.manual_seed(0)
data = DataLoader(torch.randint(0, 128, (256, 32)), batch_size=4)
trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(TinyLM(), data)
print("trained", trainer.global_step, "steps")
