"""A held-out training program: PyTorch Lightning's own demo model (`BoringModel`) fitted by Lightning's
`Trainer` loop, none of it written here. Prints the seconds `fit` took, for an interleaved comparison with and
without `record --exec` (scripts/h200_heldout.sh):

    python scripts/heldout_lightning.py [--steps 3000] [--device cuda]
"""
from __future__ import annotations

import argparse
import time

import pytorch_lightning as pl
from pytorch_lightning.demos.boring_classes import BoringModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args()
    trainer = pl.Trainer(max_steps=args.steps, accelerator="gpu" if args.device == "cuda" else "cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    model = BoringModel()
    start = time.perf_counter()
    trainer.fit(model)
    print(f"fit_s {time.perf_counter() - start:.4f} steps {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
