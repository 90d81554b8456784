"""Data-parallel training with torch DDP over gloo, one process per rank, launched by torchrun.

    torchrun --standalone --nproc-per-node 4 tests/corpus/ddp_gloo.py [--defect bad_rank] [--iters N]

Each rank trains an MLP replica on its own shard; each iteration: train (DDP steps, gradients all-reduced)
-> eval (a local validation batch, its score all-reduced). Every rank records itself (record --exec hands
the run directory to torchrun's children through the environment).

Defect (planted; healthy = none):
  bad_rank   rank 0 gathers every rank's validation predictions into its own memory (dist.gather of
             64 MiB from each rank (4 in the corpus), kept for a report): its floor runs 0.25 GiB or more above its peers', its
             eval peak ~1.4 GiB (the last report and the new gather at once) (rank_imbalance/rank_outlier)
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import miles_profile as mp
from offload_tools import log, parse_args

DEFECTS = ("bad_rank",)
WIDTH, HIDDEN, BATCH = 512, 2048, 32
PREDICTIONS = 64 * 1024 ** 2 // 4  # float32 elements of one rank's validation predictions (64 MiB)


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], DEFECTS, iters=6, sizes=("small",))
    if args.device != "cpu":
        log("gloo DDP runs on CPU here; the H200 records this program with --device cpu")
        return 2
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed + rank)
    model = DDP(nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    report = []  # bad_rank: what rank 0 keeps of the gathered predictions
    for it in range(args.iters):
        with mp.phase("train", rollout_id=it):
            for _ in range(3):
                x = torch.randn(BATCH, WIDTH)
                loss = (model(x) - x).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        with mp.phase("eval", rollout_id=it):
            # this rank's validation outputs: 64 MiB written, as randn writes them, at a fill's cost (randn of
            # 16 M floats cost ~0.2 CPU-s a rank an iteration: ~3 of a case's ~24 CPU-s)
            predictions = torch.full((PREDICTIONS,), 0.5 + rank)
            score = predictions.abs().mean().reshape(1)
            dist.all_reduce(score)
            if args.defect == "bad_rank":
                gathered = [torch.empty_like(predictions) for _ in range(world)] if rank == 0 else None
                dist.gather(predictions, gathered, dst=0)
                if rank == 0:
                    report = gathered  # kept until the next gather: rank 0 holds every rank's predictions
            del predictions
            time.sleep(0.3)  # metric logging
        if rank == 0:
            log(f"iteration {it}: loss {float(loss):.4f}, score {float(score) / world:.4f}, report {len(report)}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
