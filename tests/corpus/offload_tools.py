"""What the corpus programs share: their command line, and the offloads written the way users write them.

Each corpus program is a user's loop on libraries nobody here wrote (torch, transformers); this module
holds only what every such loop repeats: `--defect/--device/--iters/--size`, byte counts of tensors, and
the three offload styles seen in the wild:

- `to_cpu`: `module.to("cpu")` plus the optimizer state moved by hand, then `torch.cuda.empty_cache()`;
- `to_disk`: `torch.save` into a temporary directory, then the device tensors dropped;
- both judged by the program's `phase(..., expected_bytes=n)`: n is what the offload declares it moves.

Phases carry `rollout_id=<iteration>` so every phase of one loop iteration shares its iteration number.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import os
import shutil
import sys
import tempfile

import torch

import miles_profile as mp

MiB = 1024 ** 2

try:  # torch >= 2.7
    import torch.utils.serialization
    # torch.save's CRC-32 of every record is CPU, not memory: it cost 3-10x the write itself (0.1-0.4 CPU-s of
    # a 128 MiB state dict on the suite's VM), and the corpus writes GiBs per run. The bytes written, the
    # tensors dropped and the file's size (the recorder's `disk` column) are the same without it.
    torch.utils.serialization.config.save.compute_crc32 = False
except (ImportError, AttributeError):
    pass

# The collector walks every tracked object on each full collection (release_cache's gc.collect after each
# offload, and the automatic ones): after torch, torch._dynamo (which every optimizer imports on first use)
# and transformers that is ~300,000 library objects, 0.14 CPU-s a walk; frozen, it walks the program's own.
# The library objects live for the whole run anyway and nothing is freed or allocated by freezing: the
# memory the checks judge is the same (mlp_adamw alone: 9.7-12.2 CPU-s -> 7.3-7.9).
import torch._dynamo  # noqa: E402,F401 - imported by the first optimizer anyway; here, to be frozen

gc.collect()
gc.freeze()


def parse_args(description: str, defects: tuple[str, ...], iters: int, sizes: tuple[str, ...] = ("small", "tiny"),
               argv: list[str] | None = None) -> argparse.Namespace:
    """The corpus command line; a defect a program does not plant is an argparse error (exit 2)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--defect", default="none", choices=("none", *defects),
                        help="plant this defect (none: the healthy program)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--iters", type=int, default=iters, help="loop iterations (the first is warm-up)")
    parser.add_argument("--size", default=sizes[0], choices=sizes,
                        help="model size: tiny is below every series' resolution")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, f"{parser.prog}: error: --device cuda but no CUDA device\n")
    if args.iters < 1:
        parser.exit(2, f"{parser.prog}: error: --iters must be at least 1\n")
    torch.manual_seed(args.seed)
    return args


def tensor_bytes(tensors) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors if t is not None))


def param_bytes(module: torch.nn.Module) -> int:
    return tensor_bytes(module.parameters())


def grad_bytes(module: torch.nn.Module) -> int:
    return tensor_bytes(p.grad for p in module.parameters())


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return tensor_bytes(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))


def move_optimizer_state(optimizer: torch.optim.Optimizer, device) -> None:
    """By hand, as users do: torch has no optimizer.to()."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:  # AdamW's `step` stays a CPU scalar
                state[key] = value.to(device)


def release_cache(device: str) -> None:
    """What users call after an offload: drop garbage, then hand the allocator's cache back."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def offload_dir(prefix: str) -> str:
    """A temporary directory for disk offloads, watched by the recorder (its bytes become the `disk` column)."""
    path = tempfile.mkdtemp(prefix=f"corpus_{prefix}_")
    atexit.register(shutil.rmtree, path, True)  # a program that ends leaves nothing in the shared /tmp
    mp.watch_dir(path)
    return path


def drop_parameters(module: torch.nn.Module) -> None:
    """After a save to disk: each parameter keeps its shape-less placeholder, so the module object survives."""
    for p in module.parameters():
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        p.grad = None


def restore_parameters(module: torch.nn.Module, state: dict, device) -> None:
    named = dict(module.named_parameters())
    for name, value in state.items():
        if name in named:
            named[name].data = value.to(device)


def device_of(args) -> torch.device:
    return torch.device(args.device)


def log(message: str) -> None:
    print(f"[{os.path.basename(sys.argv[0])}] {message}", file=sys.stderr, flush=True)
