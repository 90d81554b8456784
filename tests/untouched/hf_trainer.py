"""A transformers.Trainer fine-tune of a tiny random Llama (built from a config, nothing downloaded).

    python hf_trainer.py OUT_DIR [--steps N] [--leak-mib M]

--leak-mib M: the collator keeps an M MiB "debug copy" of every batch (the planted leak).
"""
import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--leak-mib", type=float, default=0)
parser.add_argument("--step-ms", type=float, default=0, help="compute time per step, as a real model has")
args = parser.parse_args()

torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config)
data = [{"input_ids": torch.randint(0, 128, (32,))} for _ in range(64)]
kept = []


def collate(rows):
    time.sleep(args.step_ms / 1000)
    ids = torch.stack([r["input_ids"] for r in rows])
    if args.leak_mib:
        kept.append(torch.ones(int(args.leak_mib * 2 ** 20) // 4))  # a debug copy nobody frees
    return {"input_ids": ids, "labels": ids.clone()}


training = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=4,
                             learning_rate=1e-3, report_to=[], save_strategy="no", logging_strategy="no",
                             use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
Trainer(model=model, args=training, train_dataset=data, data_collator=collate).train()
print("trained", args.steps, "steps")
