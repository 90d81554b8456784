"""`python -m trainer.train --launcher ray [--nproc-per-node N] <trainer flags>`: the trainer on Ray, as
Miles runs it. torchrun (`trainer.launch`) stays; this is the other launcher.

One placement group of N bundles (`{"CPU": 1}`, plus `{"GPU": 1}` on CUDA), PACKed. In bundle i, Ray
actors share the bundle's resources (fractional GPUs: the colocation Miles sets up): rank i
(`RankActor`, the training rank: the policy), with --use-critic its critic (`CriticActor`, the value
model in a process of its own, as Miles' critic group; trainer/critic.py), and its rollout engine
(`EngineActor`, which starts the engine server process and owns it, as Miles' SGLang engine actor owns
its server). The N critics average their gradients in a process group of their own. Rank i drives its engine over the same HTTP endpoints as
`--rollout-engine server`, so every offload flag takes the very code path it takes under torchrun; the
ranks form one gloo/NCCL group (rank 0's node and a free port). Ray sets CUDA_VISIBLE_DEVICES to the
bundle's GPU, so each rank uses its device 0.

Without RAY_ADDRESS, `ray.init()` starts a local cluster for the run (the CPU presets run there);
with it, the ranks go to that cluster. Recorded with `record -- --launcher ray ...` (or `record --exec`),
every actor and engine process joins the run through the job's runtime env (docs/ray.md).
"""
from __future__ import annotations

import dataclasses
import os
import socket
import sys

from miles_profile.names import ROLE_CRITIC
from trainer.args import parse_args
from trainer.errors import TrainerError

class LaunchError(TrainerError):
    """A launcher flag that is wrong: one line, exit 2, as the trainer's own flags."""

    exit_code = 2


RANK_SHARE = 0.5  # of its bundle's CPU (and GPU): the engine actor has the other half
CRITIC_SHARE = 0.25  # with --use-critic, taken from the engine's half: rank 0.5, critic 0.25, engine 0.25


def _meeting_point() -> tuple[str, int]:
    """Where a process group meets: this node's address and a free port."""
    import ray
    with socket.socket() as sock:
        sock.bind(("", 0))
        return ray.util.get_node_ip_address(), sock.getsockname()[1]


def _torchrun_env(rank: int, world_size: int, master: tuple[str, int], role: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]), "MILES_PROFILE_ROLE": role})


class RankActor:
    """One training rank: the loop of trainer.train with torchrun's environment set by us."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    def address(self) -> tuple[str, int]:
        """Where the process group meets (rank 0 only)."""
        return _meeting_point()

    def run(self, argv: list[str], master: tuple[str, int], engine_url: str,
            critic=None) -> list[tuple[float, float]]:
        _torchrun_env(self.rank, self.world_size, master, "actor")
        from trainer import gc_startup, train
        gc_startup.freeze_imports()  # Ray's and torch's objects: out of every clear_memory's collection
        cfg = dataclasses.replace(parse_args(argv, world_size=self.world_size), rollout_engine="server",
                                  rollout_engine_url=engine_url)
        remote = RemoteCritic(critic) if critic is not None else None
        return [(reward, stats.loss) for reward, stats in train.run(cfg, critic=remote)]


class CriticActor:
    """Rank i's critic: trainer.critic.Critic in this process, in the critics' own process group."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.critic = None

    def address(self) -> tuple[str, int]:
        return _meeting_point()

    def setup(self, argv: list[str], master: tuple[str, int]) -> None:
        """Every critic at once (the group's first collective, the weights' broadcast, waits for all)."""
        import torch

        from trainer import dist, gc_startup
        from trainer.critic import Critic
        gc_startup.freeze_imports()  # Ray's and torch's objects: out of every later collection
        _torchrun_env(self.rank, self.world_size, master, ROLE_CRITIC)
        cfg = parse_args(argv, world_size=self.world_size)
        torch.set_num_threads(cfg.preset.torch_threads or torch.get_num_threads())
        device = torch.device("cuda", 0) if cfg.device == "cuda" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init(dist.from_env(), device)
        self.critic = Critic(cfg, device)

    def call(self, name: str, *args):
        return getattr(self.critic, name)(*args)

    def close(self) -> None:
        from trainer import dist
        if self.critic is not None:
            self.critic.close()
        dist.shutdown()


class RemoteCritic:
    """The rank's side of its critic actor: what `Actor(critic=...)` calls (tensors travel by value)."""

    def __init__(self, handle):
        self.handle = handle

    def values(self, tokens, prompt_len: int, micro_batch_size: int):
        return self.result(self.start("values", tokens.cpu(), prompt_len, micro_batch_size)).to(tokens.device)

    def start_train(self, tokens, prompt_len: int, returns, micro_batch_size: int, rollout_id: int | None):
        return self.start("train", tokens.cpu(), prompt_len, returns.cpu(), micro_batch_size, rollout_id)

    def start(self, name: str, *args):
        return self.handle.call.remote(name, *args)

    def result(self, ref):
        import ray
        return ray.get(ref)


class EngineActor:
    """A rank's rollout engine: starts the engine server process (it dies with this actor) and says where."""

    def __init__(self, argv: list[str], rank: int, world_size: int):
        import torch

        from trainer.config import model_config
        from trainer.engine_client import RemoteEngine
        cfg = parse_args(argv, world_size=world_size)
        device = torch.device("cuda", 0) if cfg.device == "cuda" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # the engine server's identity in the run: its rank's, role engine (as under torchrun)
        os.environ.update({"MILES_PROFILE_ROLE": "engine", "RANK": str(rank), "WORLD_SIZE": str(world_size)})
        self.engine = RemoteEngine.start(model_config(cfg.preset, cfg.digits), device, cfg.kv_cache_bytes,
                                         cuda_graph=cfg.cuda_graph, torch_threads=cfg.preset.torch_threads,
                                         memory_backend=cfg.rollout_memory_backend)

    def url(self) -> str:
        return self.engine.url

    def close(self) -> None:
        """Stop the server process before Ray ends this actor (its SIGTERM would land mid-cleanup)."""
        self.engine.close()


def split_launcher_args(argv: list[str]) -> tuple[int, list[str]]:
    """(N from --nproc-per-node N, default 1; the trainer's own flags without it and --launcher ray)."""
    rest, nproc, i = [], 1, 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--launcher", "--nproc-per-node", "--nproc_per_node") and i + 1 < len(argv):
            value = argv[i + 1]
            if arg != "--launcher":
                if not value.isdigit() or int(value) < 1:
                    raise LaunchError(f"--nproc-per-node must be a positive integer, got {value!r}")
                nproc = int(value)
            i += 2
            continue
        rest.append(arg)
        i += 1
    return nproc, rest


def without_nproc(argv: list[str]) -> list[str]:
    """`argv` without `--nproc-per-node N` when it asks for --launcher ray (the flag is the launcher's)."""
    if not any(a == "--launcher" and b == "ray" for a, b in zip(argv, argv[1:])):
        return argv
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg in ("--nproc-per-node", "--nproc_per_node") and i + 1 < len(argv):
            skip = True
        else:
            out.append(arg)
    return out


def main(argv: list[str]) -> int:
    try:
        nproc, rest = split_launcher_args(argv)
    except LaunchError as exc:
        print(f"trainer: error: {exc}", file=sys.stderr)
        return exc.exit_code
    cfg = parse_args(rest, world_size=nproc)  # a flag error exits 2 here, before Ray starts
    try:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    except ImportError:
        print("trainer: error: --launcher ray needs ray: pip install -e '.[ray]'", file=sys.stderr)
        return 2
    try:
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, logging_level="ERROR")
    except Exception as exc:  # noqa: BLE001 - an unreachable cluster: one line
        print(f"trainer: error: cannot start or reach a Ray cluster: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    gpu = cfg.device == "cuda"
    bundle = {"CPU": 1.0, **({"GPU": 1.0} if gpu else {})}
    group = placement_group([dict(bundle) for _ in range(nproc)], strategy="PACK")
    try:
        ray.get(group.ready(), timeout=120)
        engine_share = 1.0 - RANK_SHARE - (CRITIC_SHARE if cfg.use_critic else 0.0)

        def placed(cls, i, share):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)
            return ray.remote(cls).options(scheduling_strategy=strategy, num_cpus=share,
                                           num_gpus=share if gpu else 0)

        engines = [placed(EngineActor, i, engine_share).remote(rest, i, nproc) for i in range(nproc)]
        ranks = [placed(RankActor, i, RANK_SHARE).remote(i, nproc) for i in range(nproc)]
        critics = ([placed(CriticActor, i, CRITIC_SHARE).remote(i, nproc) for i in range(nproc)]
                   if cfg.use_critic else [])
        if critics:  # the critics' group, before the ranks need their values
            critic_master = ray.get(critics[0].address.remote())
            ray.get([c.setup.remote(rest, critic_master) for c in critics])
        master = ray.get(ranks[0].address.remote())
        urls = ray.get([e.url.remote() for e in engines])
        history = ray.get([r.run.remote(rest, master, url, *critics[i:i + 1])
                           for i, (r, url) in enumerate(zip(ranks, urls))])
        ray.get([e.close.remote() for e in engines] + [c.close.remote() for c in critics])
    except ray.exceptions.RayError as exc:
        print(f"trainer: error: {_first_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("trainer: interrupted", file=sys.stderr)
        return 130
    # The group and its actors go with the job when this driver exits (not before: the recorder's last
    # gathering runs at exit and sees every rank alive).
    reward, loss = history[0][-1] if history[0] else (float("nan"), float("nan"))
    print(f"trainer: {nproc} rank(s) on Ray finished {len(history[0])} rollouts; last mean reward {reward:.3f}, "
          f"loss {loss:.4f}", flush=True)
    return 0


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, TrainerError) and str(cause):
        return str(cause)
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
