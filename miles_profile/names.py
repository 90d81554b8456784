"""Canonical phase and tag names, shared by the trainer, the checks and Miles' own markers."""
from __future__ import annotations

from typing import Literal

# Phases of one RL iteration (DESIGN.md). Offload phases all start with "offload_".
GENERATE = "generate"
OFFLOAD_ROLLOUT = "offload_rollout"
OFFLOAD_KV = "offload_kv"
OFFLOAD_WEIGHTS = "offload_weights"
ONLOAD_WEIGHTS = "onload_weights"
ONLOAD_KV = "onload_kv"
TRAIN = "train"
OFFLOAD_TRAIN = "offload_train"
ONLOAD_TRAIN = "onload_train"
UPDATE_WEIGHTS = "update_weights"
CLEAR_MEMORY = "clear_memory"
EVAL = "eval"

PHASES = (
    GENERATE, OFFLOAD_ROLLOUT, OFFLOAD_KV, OFFLOAD_WEIGHTS, ONLOAD_WEIGHTS, ONLOAD_KV,
    TRAIN, OFFLOAD_TRAIN, ONLOAD_TRAIN, UPDATE_WEIGHTS, CLEAR_MEMORY, EVAL,
)
OFFLOAD_PREFIX = "offload_"
ONLOAD_PREFIX = "onload_"

# What a rollout engine's memory holds (torch_memory_saver / SGLang tags).
KV_CACHE = "kv_cache"
WEIGHTS = "weights"
CUDA_GRAPH = "cuda_graph"
Tag = Literal["kv_cache", "weights", "cuda_graph"]
TAGS = (KV_CACHE, WEIGHTS, CUDA_GRAPH)
# The actor's training state, when torch_memory_saver holds it (one tag for all of it).
TRAIN_STATE = "train_state"

# How memory is given back and taken again (phase attribute `backend`, process annotations
# `rollout_memory_backend` / `train_memory_backend`): `builtin` frees storages and empties torch's
# cache; `torch_memory_saver` pauses tagged regions (invisible to the allocator's counters).
BUILTIN = "builtin"
TORCH_MEMORY_SAVER = "torch_memory_saver"
MEMORY_BACKENDS = (BUILTIN, TORCH_MEMORY_SAVER)

# Where offloaded training state goes.
Target = Literal["cpu", "disk"]

# Event kinds in the log.
BEGIN, END, MARK, ERROR, OOM = "begin", "end", "mark", "error", "oom"
# `account(category, nbytes, device)`: what the program says it holds (docs/ledger.md).
ACCOUNT = "account"
ACCOUNT_HOST = "host"  # the device of host-memory declarations

# Categories a program declares with `account()` (any snake_case name is accepted; these are the
# trainer's and the ones the ledger colours consistently).
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer_state"
CUDA_GRAPH_POOL = "cuda_graph"
PINNED_BUFFERS = "pinned_buffers"
OFFLOADED_STATE = "offloaded_state"
# Bytes the torch allocator still counts as allocated and reserved although a pause (torch_memory_saver)
# took them off the device: not a category of memory but a correction the ledger subtracts.
PAUSED = "paused"
DECLARED_CATEGORIES = (WEIGHTS, GRADIENTS, OPTIMIZER_STATE, KV_CACHE, CUDA_GRAPH_POOL, PINNED_BUFFERS,
                       OFFLOADED_STATE)

# Status of a phase in the reader's phases table that has no end event yet (a run being written, or a
# crash): it is drawn up to the last sample.
OPEN = "open"

# Mark names.
MARK_OOM = "oom"
# `record --exec`'s meta annotation: its command's exit code (negative: killed by that signal).
COMMAND_EXIT = "command_exit"

# Environment variable that hands a run directory to a child process (record --exec).
RUN_DIR_ENV = "MILES_PROFILE_RUN_DIR"
# `record --metrics-port` hands its port to the job's processes (a Ray node's sampler serves its node on it).
METRICS_PORT_ENV = "MILES_PROFILE_METRICS_PORT"
# `record --interval-ms` for the processes that join the run through MILES_PROFILE_RUN_DIR (children, Ray workers).
INTERVAL_ENV = "MILES_PROFILE_INTERVAL_MS"
# "1": every recorder of the run also samples glibc's heap in use (`record --heap`, probes/heap.py).
HEAP_ENV = "MILES_PROFILE_HEAP"

# Process roles in a run's metas (docs/log-format.md).
ROLE_ACTOR = "actor"
ROLE_ENGINE = "engine"
ROLE_CRITIC = "critic"  # PPO's value model in a process of its own (the trainer's `--launcher ray`, as Miles)

# One vocabulary for iterations in every view (report, dashboard, CLI, JSON messages): a number, or
# "setup" for the phases before the first iteration (the reader's iteration -1).
SETUP = "setup"


def iteration_text(iteration) -> str:
    """`3`, or `setup` before the first iteration; `–` when unknown."""
    try:
        value = int(iteration)
    except (TypeError, ValueError):
        return "–"
    return SETUP if value < 0 else str(value)


def iteration_tag(iteration) -> str:
    """`#3`, or `setup`: how a phase instance's iteration is written after its name."""
    text = iteration_text(iteration)
    return text if text in (SETUP, "–") else f"#{text}"


def instance_label(name, iteration) -> str:
    """A phase instance in messages: `train #3`, `offload_train (setup)`."""
    tag = iteration_tag(iteration)
    return f"{name} {tag}" if tag.startswith("#") else f"{name} ({tag})"
