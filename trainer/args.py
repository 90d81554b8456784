"""Command-line flags, grouped as in Miles, and every rule across flags in one function.

`parse_args(argv)` returns a frozen `RunConfig` with every default resolved; the argparse namespace is
never mutated after validation. Each invalid value or combination is one line on stderr and exit code 2:
every number is checked here, before torch sees it (an int64 overflow, a NaN learning rate or a pool
larger than the device would otherwise surface as a traceback, or not at all).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
import urllib.parse
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from miles_profile.names import BUILTIN, KV_CACHE, MEMORY_BACKENDS, TORCH_MEMORY_SAVER, WEIGHTS
from trainer.config import PRESETS, Preset, model_config

LEVELS = {"kv_cache": KV_CACHE, "weight": WEIGHTS}  # --offload-rollout-level value -> engine tag
SEED_MAX = 2**63 - 1  # torch seeds are 64-bit; the critic is seeded with seed + 1
_UNITS = {"": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2, "g": 1024**3, "gib": 1024**3}


@dataclass(frozen=True)
class RunConfig:
    preset_name: str
    preset: Preset
    device: str                 # "cpu" or "cuda", resolved from auto
    seed: int
    num_rollout: int
    digits: int
    rollout_batch_size: int
    n_samples_per_prompt: int
    micro_batch_size: int
    kv_cache_bytes: int
    cuda_graph: bool
    rollout_memory_backend: str  # builtin or torch_memory_saver, resolved from auto
    lr: float
    use_critic: bool
    optimizer_cpu_offload: bool
    offload_train: bool
    offload_rollout: bool
    offload_rollout_tags: tuple[str, ...]  # engine tags from --offload-rollout-level
    offload_train_target: str
    offload_train_backend: str
    offload_train_disk_dir: Path | None
    chunk_bytes: int
    colocate_memory_peak_device: str
    rollout_engine: str          # "in_process" or "server", resolved from auto
    world_size: int = 1          # data-parallel ranks (torchrun's WORLD_SIZE)
    rollout_engine_url: str | None = None  # drive a server already listening there (rollout_engine "server")


def parse_bytes(text: str) -> int:
    """'1048576', '64MiB', '12GiB' (powers of 1024) -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (examples: 1048576, 64MiB, 12GiB)")
    return int(Fraction(m.group(1)) * _UNITS[m.group(2).lower()])  # exact: no float overflow or rounding


def parse_levels(values: list[str]) -> tuple[str, ...]:
    """['kv_cache', 'weight'] or ['kv_cache,weight'] -> engine tags; raises ValueError on unknown."""
    names = [v for item in values for v in item.split(",") if v]
    unknown = [n for n in names if n not in LEVELS]
    if unknown or not names:
        raise ValueError(f"--offload-rollout-level: unknown level(s) {unknown or values}; "
                         f"choose from {', '.join(LEVELS)}")
    return tuple(dict.fromkeys(LEVELS[n] for n in names))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block: the mistake is the whole message
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m trainer.train",
        description="Train a small decoder-only policy with GRPO (or PPO with --use-critic) on a "
                    "digit-reversal task, applying Miles' colocation and offload strategies. Sizes "
                    "accept suffixes: 64MiB, 12GiB.")
    _add_run_arguments(parser.add_argument_group("run"))
    _add_rollout_arguments(parser.add_argument_group("rollout"))
    _add_train_arguments(parser.add_argument_group("train"))
    _add_offload_arguments(parser.add_argument_group("offload and colocation"))
    launch = parser.add_argument_group("launch")
    launch.add_argument("--launcher", choices=["torchrun", "ray"], default="torchrun",
                        help="ray: the ranks and their rollout engines as Ray actors in a placement group, two per "
                             "bundle with half its resources each (take --nproc-per-node N too; RAY_ADDRESS names a "
                             "cluster, else a local one starts); torchrun: as started (default: %(default)s)")
    return parser


def _add_run_arguments(g) -> None:
    g.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                   help="model and batch sizes: tiny (tests), cpu (~14.8M params, ~237 MB training state), "
                        "gpu (~1.1B params, 12 GiB KV pool) (default: %(default)s)")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto picks cuda when available (default: %(default)s)")
    g.add_argument("--num-rollout", type=int, default=2, help="RL iterations (default: %(default)s)")
    g.add_argument("--seed", type=int, default=1234, help="seeds init, prompts and sampling")
    g.add_argument("--digits", type=int, help="task: length of the digit string to reverse (preset)")
    g.add_argument("--plan", action="store_true",
                   help="print the forecast peak of each phase on each device and exit, allocating nothing "
                        "(add --device cuda to plan a GPU run on a machine without one)")


def _add_rollout_arguments(g) -> None:
    g.add_argument("--rollout-batch-size", type=int, help="prompts per rollout (preset)")
    g.add_argument("--n-samples-per-prompt", type=int, help="responses per prompt, the GRPO group (preset)")
    g.add_argument("--kv-cache-bytes", type=parse_bytes,
                   help="rollout engine KV pool, allocated up front (preset: 192MiB cpu, 12GiB gpu)")
    g.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="capture decode steps as CUDA graphs (default: on with cuda; cuda only)")
    g.add_argument("--rollout-memory-backend", choices=("auto", *MEMORY_BACKENDS), default="auto",
                   help="how the engine releases memory: builtin (free storages, empty torch's cache) or "
                        "torch_memory_saver (pause tagged regions; cuda, package installed); auto picks "
                        "torch_memory_saver where it can (default: %(default)s)")
    g.add_argument("--rollout-engine", choices=["auto", "in_process", "server"], default="auto",
                   help="in_process: the engine lives in the trainer's process; server: in its own process "
                        "on the same device, driven over SGLang-style HTTP (python -m trainer.engine_server). "
                        "auto: server under torchrun (Miles' topology), in_process otherwise "
                        "(default: %(default)s)")
    g.add_argument("--rollout-engine-url", metavar="URL",
                   help="drive an SGLang-compatible server already listening at URL (e.g. "
                        "http://127.0.0.1:30000) instead of starting one: python -m trainer.engine_server, or "
                        "a server with SGLang's endpoints on this host (weights cross as shared memory or CUDA "
                        "IPC handles); one rank only; docs/trainer.md")


def _add_train_arguments(g) -> None:
    g.add_argument("--lr", type=float, help="AdamW learning rate (preset)")
    g.add_argument("--micro-batch-size", type=int, help="sequences per forward/backward (preset)")
    g.add_argument("--use-critic", action="store_true",
                   help="add a value model and use PPO advantages (GAE) instead of GRPO")
    g.add_argument("--optimizer-cpu-offload", action="store_true",
                   help="keep AdamW state and fp32 master weights in host memory; step there")


def _add_offload_arguments(g) -> None:
    g.add_argument("--offload-train", action=argparse.BooleanOptionalAction, default=False,
                   help="move parameters, gradients and optimizer state off the device between trains")
    g.add_argument("--offload-rollout", action=argparse.BooleanOptionalAction, default=False,
                   help="release the rollout engine's memory while training")
    g.add_argument("--offload-rollout-level", nargs="+", metavar="LEVEL",
                   help="what --offload-rollout releases: kv_cache, weight; space- or comma-separated "
                        "(default: kv_cache weight)")
    g.add_argument("--offload-train-target", choices=["cpu", "disk"], default="cpu",
                   help="where --offload-train puts the state (default: %(default)s)")
    g.add_argument("--offload-train-backend", choices=MEMORY_BACKENDS, default=BUILTIN,
                   help="how --offload-train-target cpu moves the state: builtin (pinned host buffers) or "
                        "torch_memory_saver (pause with a CPU backup; cuda, package installed) "
                        "(default: %(default)s)")
    g.add_argument("--offload-train-disk-dir", type=Path,
                   help="directory for --offload-train-target disk (a fast local disk)")
    g.add_argument("--offload-chunk-bytes", type=parse_bytes,
                   help="chunk size of disk files and weight updates (preset: 16MiB cpu, 256MiB gpu)")
    g.add_argument("--colocate-memory-peak-device", choices=["cpu", "gpu"], default="cpu",
                   help="cpu: release all rollout memory before training; gpu: interleave so the "
                        "device peak stays low (needs --offload-train --offload-rollout) "
                        "(default: %(default)s)")


def flag_problem(args: argparse.Namespace, world_size: int = 1) -> str | None:
    """The rules on flag values and between flags that need neither torch nor the machine; the first
    violation as one line, or None. `check_flags` answers them before torch loads."""
    preset = PRESETS[args.preset]
    batch = args.rollout_batch_size or preset.rollout_batch_size
    if batch >= 1 and batch % world_size:
        return (f"--rollout-batch-size {batch} does not split evenly over {world_size} ranks "
                "(each rank generates and trains on an equal share of the prompts)")
    for flag in ("num_rollout", "digits", "rollout_batch_size", "micro_batch_size",
                 "kv_cache_bytes", "offload_chunk_bytes"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            return f"--{flag.replace('_', '-')} must be at least 1"
    if not 0 <= args.seed <= SEED_MAX:
        return f"--seed must be from 0 to {SEED_MAX}"
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        return "--lr must be positive and finite"
    group = preset.n_samples_per_prompt if args.n_samples_per_prompt is None else args.n_samples_per_prompt
    if group < (1 if args.use_critic else 2):
        return "--n-samples-per-prompt must be at least 2 for GRPO (1 is allowed with --use-critic)"
    if args.rollout_engine_url is not None:
        problem = _engine_url_problem(args, world_size)
        if problem:
            return problem
    if args.offload_rollout_level is not None:
        if not args.offload_rollout:
            return "--offload-rollout-level needs --offload-rollout"
        try:
            parse_levels(args.offload_rollout_level)
        except ValueError as exc:
            return str(exc)
    if args.offload_train_target == "disk":
        if not args.offload_train:
            return "--offload-train-target disk needs --offload-train"
        if args.offload_train_disk_dir is None:
            return "--offload-train-target disk needs --offload-train-disk-dir"
    elif args.offload_train_disk_dir is not None:
        return "--offload-train-disk-dir needs --offload-train-target disk"
    if args.colocate_memory_peak_device == "gpu":
        if not (args.offload_train and args.offload_rollout):
            return "--colocate-memory-peak-device gpu needs --offload-train and --offload-rollout"
        if args.use_critic:
            return "--colocate-memory-peak-device gpu does not support --use-critic"
    return None


def validate(args: argparse.Namespace, cuda_available: bool, world_size: int = 1,
             memory_bytes: int | None = None, check_environment: bool = True) -> str | None:
    """Every rule on flag values and across flags; returns the first violation as one line, or None.
    `memory_bytes`: total memory of the device the run uses (`device_memory`); None skips that bound.
    `check_environment=False` (a --plan): skip what only this machine can answer (a CUDA device, an
    importable torch_memory_saver, a writable disk dir), so any machine can plan any configuration."""
    problem = flag_problem(args, world_size)
    if problem:
        return problem
    if args.device == "cuda" and not cuda_available and check_environment:
        return "--device cuda: no CUDA device is available"
    device = _device(args.device, cuda_available)
    if args.cuda_graph and device != "cuda":
        return "--cuda-graph needs --device cuda"
    if args.offload_train_target == "disk" and check_environment:
        problem = _unwritable(args.offload_train_disk_dir)
        if problem:
            return f"--offload-train-disk-dir {args.offload_train_disk_dir} is not writable: {problem}"
    problem = _backend_problem(args, device, check_environment)
    if problem:
        return problem
    preset = PRESETS[args.preset]
    group = preset.n_samples_per_prompt if args.n_samples_per_prompt is None else args.n_samples_per_prompt
    return _kv_problem(args, preset, device) or _memory_problem(args, preset, device, group, memory_bytes)


def _backend_problem(args: argparse.Namespace, device: str, check_environment: bool = True) -> str | None:
    if args.offload_train_backend == TORCH_MEMORY_SAVER:
        if not args.offload_train:
            return "--offload-train-backend torch_memory_saver needs --offload-train"
        if args.offload_train_target != "cpu":
            return ("--offload-train-backend torch_memory_saver keeps the state in host memory (its CPU "
                    "backup): use it with --offload-train-target cpu")
    for flag, value in (("--rollout-memory-backend", args.rollout_memory_backend),
                        ("--offload-train-backend", args.offload_train_backend)):
        problem = None
        if value == TORCH_MEMORY_SAVER:
            from trainer import memory_backend  # imports torch: not before the flags parsed (check_flags)
            problem = memory_backend.unavailable_reason(device) if check_environment else (
                None if device == "cuda" else "needs a CUDA device")
        if problem:
            return f"{flag} torch_memory_saver: {problem}"
    return None


def _kv_problem(args: argparse.Namespace, preset: Preset, device: str) -> str | None:
    cfg = model_config(preset, args.digits or preset.digits)
    kv_bytes = args.kv_cache_bytes or preset.kv_cache_bytes
    itemsize = 2 if device == "cuda" else 4
    if kv_bytes < cfg.max_seq_len * cfg.kv_bytes_per_token(itemsize):
        need = cfg.max_seq_len * cfg.kv_bytes_per_token(itemsize)
        return f"--kv-cache-bytes {kv_bytes} holds less than one sequence ({need} bytes needed)"
    return None


def _memory_problem(args: argparse.Namespace, preset: Preset, device: str, group: int,
                    memory_bytes: int | None) -> str | None:
    """Buffers that could never be allocated on the device: a necessary bound, not a promise that
    what passes fits next to everything else."""
    if memory_bytes is None:
        return None
    kv_bytes = args.kv_cache_bytes or preset.kv_cache_bytes
    if kv_bytes > memory_bytes:
        return f"--kv-cache-bytes {kv_bytes} is more than the {device}'s memory ({memory_bytes} bytes)"
    prompts = args.rollout_batch_size or preset.rollout_batch_size
    token_bytes = prompts * group * model_config(preset, args.digits or preset.digits).max_seq_len * 8
    if token_bytes > memory_bytes:  # the rollout's int64 token ids, all on the device while training
        return (f"--rollout-batch-size {prompts} x --n-samples-per-prompt {group}: the token ids alone "
                f"({token_bytes} bytes) are more than the {device}'s memory ({memory_bytes} bytes)")
    return None


def device_memory(device: str) -> int | None:
    """Total bytes of the memory a run on `device` allocates from (host RAM, or the current GPU's),
    or None when it cannot be read."""
    try:
        if device == "cuda":
            import torch  # seconds: `--plan` and `--help` run without it
            return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except Exception:  # no driver, no device, no sysconf name (CUDA raises several types): no bound
        return None


def _engine_url_problem(args: argparse.Namespace, world_size: int) -> str | None:
    try:
        url = urllib.parse.urlsplit(args.rollout_engine_url)
        url.port  # noqa: B018 - raises ValueError for a port that is no number
    except ValueError as exc:  # `http://[::1`: an unclosed IPv6 bracket
        return f"--rollout-engine-url {args.rollout_engine_url!r} is not a valid URL ({exc})"
    if url.scheme not in ("http", "https") or not url.hostname:
        return f"--rollout-engine-url {args.rollout_engine_url!r} is not an http:// or https:// URL with a host"
    if args.rollout_engine == "in_process":
        return "--rollout-engine-url drives a server: it does not go with --rollout-engine in_process"
    if world_size > 1:
        return "--rollout-engine-url names one server, for one rank: run a single rank"
    return None


def _unwritable(directory: Path) -> str | None:
    """Why files cannot be created in `directory` (made if missing), or None."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-") as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _device(flag: str, cuda_available: bool) -> str:
    return ("cuda" if cuda_available else "cpu") if flag == "auto" else flag


def resolve(args: argparse.Namespace, cuda_available: bool, world_size: int = 1,
            under_torchrun: bool = False) -> RunConfig:
    """A validated namespace -> RunConfig, preset values filling what the flags left out."""
    from trainer import memory_backend  # imports torch (see check_flags)
    p = PRESETS[args.preset]
    engine = args.rollout_engine
    if engine == "auto":
        engine = "server" if under_torchrun else "in_process"
    device = _device(args.device, cuda_available)
    levels = parse_levels(args.offload_rollout_level or ["kv_cache", "weight"])
    return RunConfig(
        preset_name=args.preset, preset=p, device=device, seed=args.seed, num_rollout=args.num_rollout,
        digits=args.digits or p.digits, rollout_batch_size=args.rollout_batch_size or p.rollout_batch_size,
        n_samples_per_prompt=args.n_samples_per_prompt or p.n_samples_per_prompt,
        micro_batch_size=args.micro_batch_size or p.micro_batch_size,
        kv_cache_bytes=args.kv_cache_bytes or p.kv_cache_bytes,
        cuda_graph=device == "cuda" if args.cuda_graph is None else args.cuda_graph,
        rollout_memory_backend=memory_backend.resolve(args.rollout_memory_backend, device),
        lr=args.lr or p.lr, use_critic=args.use_critic, optimizer_cpu_offload=args.optimizer_cpu_offload,
        offload_train=args.offload_train, offload_rollout=args.offload_rollout,
        offload_rollout_tags=levels, offload_train_target=args.offload_train_target,
        offload_train_backend=args.offload_train_backend,
        offload_train_disk_dir=args.offload_train_disk_dir,
        chunk_bytes=args.offload_chunk_bytes or p.chunk_bytes,
        colocate_memory_peak_device=args.colocate_memory_peak_device,
        rollout_engine="server" if args.rollout_engine_url else engine, world_size=world_size,
        rollout_engine_url=args.rollout_engine_url)


def torchrun_world_size() -> int:
    """torchrun's WORLD_SIZE in one of its ranks, else 1."""
    return int(os.environ.get("WORLD_SIZE", 1)) if "WORLD_SIZE" in os.environ and "RANK" in os.environ else 1


def check_flags(argv: list[str], world_size: int | None = None) -> None:
    """Exit 2 with one line on a flag argparse rejects (unknown, a bad value) or a rule of `flag_problem`
    breaks, and answer --help. Cheap and torch-free, so `python -m trainer.train` and `record` call it
    before importing torch (1.5 CPU-s): `--lr nan` is answered at once. What needs the machine (a CUDA
    device, the device's memory, a writable directory) comes in `parse_args`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = flag_problem(args, torchrun_world_size() if world_size is None else world_size)
    if problem:
        parser.error(problem)


def parse_args(argv: list[str] | None, cuda_available: bool | None = None,
               world_size: int | None = None, check_environment: bool = True) -> RunConfig:
    """Parse, validate and resolve; exits with status 2 and one line on any invalid input.
    `world_size`: the number of data-parallel ranks (default: torchrun's WORLD_SIZE, else 1).
    `check_environment=False`: validate the flags only, not this machine (see `validate`)."""
    if cuda_available is None:
        import torch  # seconds: `--plan` and `--help` run without it
        cuda_available = torch.cuda.is_available()
    under_torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    if world_size is None:
        world_size = torchrun_world_size()
    parser = build_parser()
    args = parser.parse_args(argv)
    memory = device_memory(_device(args.device, cuda_available)) if check_environment else None
    problem = validate(args, cuda_available, world_size, memory, check_environment)
    if problem:
        parser.error(problem)
    return resolve(args, cuda_available, world_size, under_torchrun or world_size > 1)
