"""TRL's GRPOTrainer (an online RL trainer: it generates inside each step) on a tiny random Llama and a
word-level tokenizer, both built here (nothing downloaded), on CPU.

    python trl_grpo.py OUT_DIR [--steps N] [--leak-mib M]

--leak-mib M: the reward function keeps M MiB of tensors per call ("for later analysis": the leak).
"""
import argparse
import time

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--leak-mib", type=float, default=0)
parser.add_argument("--step-ms", type=float, default=0, help="compute time per step, as a real model has")
args = parser.parse_args()

torch.manual_seed(0)
words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(61)]
core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
core.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
tokenizer.padding_side = "left"
config = LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                     pad_token_id=0, eos_token_id=1, bos_token_id=1)
model = LlamaForCausalLM(config)
prompts = Dataset.from_dict({"prompt": [" ".join(f"w{(i * 7 + k) % 61}" for k in range(6)) for i in range(64)]})
kept = []


def reward_len(completions, **kwargs):
    time.sleep(args.step_ms / 1000)
    if args.leak_mib:
        kept.append(torch.ones(int(args.leak_mib * 2 ** 20) // 4))  # scores kept for later: never freed
    return [float(len(c.split())) for c in completions]


config = GRPOConfig(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=4, num_generations=4,
                    max_completion_length=8, learning_rate=1e-4, report_to=[], save_strategy="no",
                    logging_strategy="no", use_cpu=True, bf16=False, disable_tqdm=True, dataloader_num_workers=0)
GRPOTrainer(model=model, reward_funcs=reward_len, args=config, train_dataset=prompts,
            processing_class=tokenizer).train()
print("trained", args.steps, "steps")
