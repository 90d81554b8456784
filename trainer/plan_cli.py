"""`python -m trainer.train --plan <flags>`: print the memory forecast of a configuration and exit.

Nothing is allocated and CUDA is never touched: the flags are validated without this machine's
environment (`args.validate(check_environment=False)`), so an H200 configuration can be planned on a
laptop with `--device cuda`. `--device auto` plans for cuda when this machine has a GPU.
"""
from __future__ import annotations

from trainer.args import build_parser, parse_args
from trainer.config import GiB
from trainer.plan import Plan, forecast

TOP_CATEGORIES = 4


def plan_args(argv: list[str]):
    """The RunConfig a --plan describes (exits 2 with one line on invalid flags, as a run would)."""
    argv = [a for a in argv if a != "--plan"]
    device = build_parser().parse_args(argv).device
    cuda = device == "cuda" or (device == "auto" and _cuda_available())
    return parse_args(argv, cuda_available=cuda, world_size=1, check_environment=False)


def _cuda_available() -> bool:
    import torch  # is_available() counts devices through the driver; it creates no context
    return torch.cuda.is_available()


def render(plan: Plan) -> str:
    """One line per (phase, device): the peak (allocator's view beside it where they differ) and the
    largest categories at that peak."""
    a = plan.assumptions
    lines = [f"forecast for {plan.device}: policy {a['num_params'] / 1e6:.1f}M params"
             + (f", critic {a['critic_params'] / 1e6:.1f}M" if a.get("critic_params") else "")
             + f", rollout memory backend {a['rollout_memory_backend']}, train offload backend "
             f"{a['offload_train_backend']}, generate batch {a['generate_batch']}",
             f"{'phase':<16} {'device':<6} {'peak GiB':>9} {'alloc GiB':>9}  largest parts (GiB)"]
    for p in plan.phases:
        parts = sorted(p.breakdown.items(), key=lambda kv: -kv[1])[:TOP_CATEGORIES]
        text = ", ".join(f"{name} {nbytes / GiB:.3f}" for name, nbytes in parts)
        allocator = f"{p.allocator / GiB:>9.3f}" if p.device == "cuda" else f"{'-':>9}"
        lines.append(f"{p.phase:<16} {p.device:<6} {p.peak / GiB:>9.3f} {allocator}  {text}")
    lines.append("host: bytes the trainer puts in host memory (offload copies, host optimizer, staging; on a "
                 "CPU run every tensor), not the process's own footprint")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    print(render(forecast(plan_args(argv))), flush=True)
    return 0
