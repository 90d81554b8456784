"""A plain torch loop too fast for a floor per step, tagged the way users tag by hand: a `train` phase per
step without `rollout_id`, an `eval` phase every 200 steps.

    python tests/corpus/fast_steps.py [--defect D] [--iters N]

Each step lasts about a millisecond, so no single step holds the recorder's five readings of a floor:
`leak` judges windows of consecutive steps (verdicts/leak.py), and each eval belongs to the step before
it (runmodel/stats.py, iterations without rollout_id).

Defects (planted; healthy = none):
  leak   `backward(retain_graph=True)` (added once to silence "backward through the graph a second time")
         and each step's loss kept as a tensor for a later plot (`losses.append(loss)`, no `.item()`):
         every step's graph keeps its activations alive (leak/sustained_growth)
"""
from __future__ import annotations

import torch
from torch import nn

import miles_profile as mp
from offload_tools import log, parse_args

DEFECTS = ("leak",)
EVAL_EVERY = 200


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], DEFECTS, iters=2000, sizes=("small",))
    if args.device != "cpu":
        log("a CPU program: its steps are fast because the model is small")
        return 2
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    for step in range(args.iters):
        with mp.phase("train"):
            loss = model(torch.randn(64, 256)).pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward(retain_graph=args.defect == "leak")
            optimizer.step()
            losses.append(loss if args.defect == "leak" else loss.item())
        if step % EVAL_EVERY == EVAL_EVERY - 1:
            with mp.phase("eval"), torch.no_grad():
                model(torch.randn(4096, 256))
    log(f"{args.iters} steps, last loss {float(losses[-1]):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
