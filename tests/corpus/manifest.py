"""The corpus: every case (a program, the defect planted in it, the device) and the verdict it must get.

`check`/`cause` name the check that must fail and the cause id it must give (miles_profile/verdicts/types.py
CAUSES); `None` for a healthy case, where no check may fail. `why` says what makes the expectation right,
above all where the series decides the cause:

- a reference kept to offloaded tensors shows as `still_referenced` where an allocated-bytes series exists
  (the CUDA allocator's `gpu{i}_alloc`; on CPU glibc's heap, recorded with `record --heap`); RSS alone
  cannot tell a live reference from freed memory glibc keeps resident, so offload_drop never fails on it
  (a healthy HF loop's RSS stayed up when glibc served a 62.5 MiB tensor from free heap space): the CPU
  reference defects are recorded with `--heap`;
- CPU has no caching allocator: `no_empty_cache` is a CUDA-only case;
- a disk offload (`torch.save` + drop) is what lowers RSS on CPU; the CPU programs keep their big tensors
  at 32 MiB or more, which glibc mmaps, so a freed tensor leaves RSS at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    name: str                      # unique; the directory its log is recorded into
    program: str                   # tests/corpus/<program>.py
    defect: str                    # "none" for a healthy program (or a healthy trap below)
    device: str                    # "cpu" | "cuda"
    check: str | None              # the check that must fail; None: no check may fail
    cause: str | None              # the cause id that check must give
    why: str
    args: tuple[str, ...] = ()     # extra program arguments (--size, --iters)
    heap: bool = False             # record --heap (glibc's heap in use beside RSS)
    nproc: int = 0                 # >0: launched by torchrun with this many ranks
    timeout_s: int = 600
    flags: tuple[str, ...] = field(default=())  # "trap": a healthy run built to tempt a false FAIL


def _iterations(check: str | None, args: tuple[str, ...]) -> tuple[str, ...]:
    """A defect offload_drop judges offload by offload needs no trend: four iterations unless the case says
    (they keep the H200 script within ~6 minutes, and the CPU suite 7 CPU-s shorter)."""
    return ("--iters", "4", *args) if check == "offload_drop" and "--iters" not in args else args


def _cpu(name, program, defect, check, cause, why, args=(), **kw) -> Case:
    return Case(name, program, defect, "cpu", check, cause, why, args=_iterations(check, args), **kw)


def _cuda(name, program, defect, check, cause, why, args=(), **kw) -> Case:
    args = _iterations(check, args)
    return Case(name, program, defect, "cuda", check, cause, why, args=("--size", "large", *args), timeout_s=180, **kw)


HEALTHY = "healthy: every offload frees what it declares; no check may fail"

CPU_CASES: list[Case] = [
    _cpu("mlp-none-cpu", "mlp_adamw", "none", None, None, HEALTHY),
    _cpu("mlp-optimizer_kept-cpu", "mlp_adamw", "optimizer_kept", "offload_drop", "still_referenced",
         "the AdamW state (128 MiB) stays referenced; --heap shows it still allocated", heap=True),
    _cpu("mlp-late_free-cpu", "mlp_adamw", "late_free", "offload_drop", "freed_late",
         "an async writer frees the state 0.4 s after offload_train returned, inside the next phase (eval); "
         "--heap shows when (RSS alone cannot tell it from the next phase's own frees)", heap=True),
    _cpu("mlp-leak-cpu", "mlp_adamw", "leak", "leak", "sustained_growth",
         "a 32 MiB weight snapshot kept every iteration: 7 iterations after warm-up, +224 MiB"),
    _cpu("mlp-retention-cpu", "mlp_adamw", "retention", None, None,
         "trap: ~128 MiB of freed 100 KiB chunks stay in glibc's heap once (iteration 1): a one-time step, then flat",
         flags=("trap",)),
    _cpu("mlp-warmup-cpu", "mlp_adamw", "warmup", None, None,
         "trap: the first iteration runs an 8x batch: a bigger warm-up, then steady", flags=("trap",)),
    _cpu("mlp-tiny-cpu", "mlp_adamw", "none", None, None,
         "trap: a few KiB of state, below RSS's resolution: too small to judge or pass, never fail",
         args=("--size", "tiny"), flags=("trap",)),
    _cpu("mlp-short-cpu", "mlp_adamw", "none", None, None,
         "trap: two iterations only, too few for a trend", args=("--iters", "2"), flags=("trap",)),
    _cpu("llama-none-cpu", "hf_llama_rl", "none", None, None, HEALTHY, args=("--iters", "4")),
    _cpu("llama-never_freed-cpu", "hf_llama_rl", "never_freed", "offload_drop", "still_referenced",
         "the reference-policy dict keeps the rollout's first weights (156 MiB) forever; --heap shows them still "
         "allocated (on RSS alone the check would not judge it: glibc retention looks the same)",
         args=("--iters", "3"), heap=True),
    _cpu("gpt2-short-cpu", "hf_gpt2_sft", "none", None, None,
         "trap: a healthy three-iteration fine-tune: too short for a trend", args=("--iters", "3"), flags=("trap",)),
    _cpu("gpt2-grads_kept-cpu", "hf_gpt2_sft", "grads_kept", "offload_drop", "still_referenced",
         "the gradients (a third of the declared bytes) stay referenced; --heap shows them still allocated",
         args=("--iters", "3"), heap=True),
    _cpu("mingpt-none-cpu", "mingpt_char", "none", None, None,
         "trap: its AdamW state (~25 MiB) is below RSS's resolution: too small to judge or pass, never fail",
         flags=("trap",)),
    _cpu("mingpt-leak-cpu", "mingpt_char", "leak", "leak", "sustained_growth",
         "each iteration's validation graph (~64 MiB of activations) kept in a list"),
    _cpu("fast-none-cpu", "fast_steps", "none", None, None,
         HEALTHY + " (a phase per 1 ms step, no rollout_id: the leak is judged in windows of steps)"),
    _cpu("fast-leak-cpu", "fast_steps", "leak", "leak", "sustained_growth",
         "backward(retain_graph=True) and every step's loss kept: ~0.3 MiB of activations a step, 2,000 steps"),
    _cpu("peft-none-cpu", "peft_lora_rl", "none", None, None,
         HEALTHY + " (a frozen base resident by design; the reference is the same model, adapters off)",
         args=("--iters", "4")),
    _cpu("peft-keep_state-cpu", "peft_lora_rl", "keep_state", "offload_drop", "still_referenced",
         "a norm log rebinds the AdamW state's tensors every iteration: each offload frees the last copy, keeps "
         "the new one; glibc's heap at the phase boundaries shows it still allocated"),
    _cpu("ddp-none-cpu", "ddp_gloo", "none", None, None, HEALTHY + " (4 gloo ranks, same work each)", nproc=4),
    _cpu("ddp-bad_rank-cpu", "ddp_gloo", "bad_rank", "rank_imbalance", "rank_outlier",
         "rank 0 keeps 4 x 64 MiB of gathered predictions: 0.25-0.75 GiB above 3 peers within a few MiB", nproc=4),
]

CUDA_CASES: list[Case] = [
    _cuda("mlp-none-cuda", "mlp_adamw", "none", None, None, HEALTHY),
    _cuda("mlp-optimizer_kept-cuda", "mlp_adamw", "optimizer_kept", "offload_drop", "still_referenced",
          "the AdamW state (1 GiB) stays allocated"),
    _cuda("mlp-late_free-cuda", "mlp_adamw", "late_free", "offload_drop", "freed_late",
          "an async mover frees the state 0.4 s after offload_train returned, inside eval"),
    _cuda("mlp-no_empty_cache-cuda", "mlp_adamw", "no_empty_cache", "offload_drop", "cached_not_returned",
          "allocated falls by 1 GiB, reserved and NVML do not"),
    _cuda("mlp-leak-cuda", "mlp_adamw", "leak", "leak", "sustained_growth",
          "a 256 MiB weight snapshot kept every iteration"),
    _cuda("mlp-warmup-cuda", "mlp_adamw", "warmup", None, None,
          "trap: the first iteration runs an 8x batch", flags=("trap",)),
    _cuda("mlp-tiny-cuda", "mlp_adamw", "none", None, None,
          "trap: a few KiB of state, below the allocator's 2 MiB granularity", args=("--size", "tiny"), flags=("trap",)),
    _cuda("llama-none-cuda", "hf_llama_rl", "none", None, None,
          HEALTHY + "; the host floor steps once (glibc keeps the freed CPU copies): not a leak"),
    _cuda("llama-no_empty_cache-cuda", "hf_llama_rl", "no_empty_cache", "offload_drop", "cached_not_returned",
          "offload_train frees weights, grads and AdamW state but keeps them cached"),
    _cuda("llama-grads_kept-cuda", "hf_llama_rl", "grads_kept", "offload_drop", "still_referenced",
          "a quarter of offload_train's declared bytes (the gradients) stays allocated"),
    _cuda("llama-optimizer_kept-cuda", "hf_llama_rl", "optimizer_kept", "offload_drop", "still_referenced",
          "the AdamW state (half the declared bytes) never leaves the device"),
    _cuda("llama-never_freed-cuda", "hf_llama_rl", "never_freed", "offload_drop", "still_referenced",
          "the reference-policy dict keeps the rollout's first weights allocated forever: the allocator shows "
          "the reference, so still_referenced"),
    _cuda("llama-leak-cuda", "hf_llama_rl", "leak", "leak", "sustained_growth",
          "generate's scores (24 x 32 x 32000 fp32, ~94 MiB) kept every iteration"),
    _cuda("llama-tiny-cuda", "hf_llama_rl", "none", None, None,
          "trap: a few KiB of weights, below the allocator's granularity", args=("--size", "tiny"), flags=("trap",)),
    _cuda("gpt2-none-cuda", "hf_gpt2_sft", "none", None, None, HEALTHY),
    _cuda("gpt2-grads_kept-cuda", "hf_gpt2_sft", "grads_kept", "offload_drop", "still_referenced",
          "the gradients (a third of the declared bytes) stay allocated"),
    _cuda("gpt2-no_empty_cache-cuda", "hf_gpt2_sft", "no_empty_cache", "offload_drop", "cached_not_returned",
          "the optimizer is deleted but its blocks stay cached"),
    _cuda("mingpt-none-cuda", "mingpt_char", "none", None, None, HEALTHY),
    _cuda("mingpt-late_free-cuda", "mingpt_char", "late_free", "offload_drop", "freed_late",
          "the old AdamW state sits in a reference cycle, collected only inside generate"),
    _cuda("mingpt-leak-cuda", "mingpt_char", "leak", "leak", "sustained_growth",
          "each iteration's validation graph kept in a list"),
    _cuda("peft-none-cuda", "peft_lora_rl", "none", None, None,
          HEALTHY + " (the bf16 base stays on the GPU by design; only the adapters' AdamW state moves)"),
    _cuda("peft-keep_state-cuda", "peft_lora_rl", "keep_state", "offload_drop", "still_referenced",
          "a norm log keeps the AdamW state's device tensors, rebound every iteration: still allocated"),
    _cuda("pinned-none-cuda", "colocated_pinned", "none", None, None,
          HEALTHY + " (an 8 GiB KV pool dropped, AdamW state to pinned buffers by non_blocking copies)"),
    _cuda("pinned-expandable-cuda", "colocated_pinned", "none", None, None,
          HEALTHY + ", under expandable_segments:True", args=("--expandable",)),
    _cuda("pinned-graph-cuda", "colocated_pinned", "none", None, None,
          "trap: a captured decode graph's private pool stays through every offload, as SGLang's do: "
          "the KV pool's offload still frees what it declares", args=("--cuda-graph",), flags=("trap",)),
    _cuda("pinned-kv_view_kept-cuda", "colocated_pinned", "kv_view_kept", "offload_drop", "still_referenced",
          "a 16-element view of the 8 GiB KV pool keeps its whole storage allocated"),
    _cuda("pinned-state_kept-cuda", "colocated_pinned", "state_kept", "offload_drop", "still_referenced",
          "the device AdamW state kept as a backup of its pinned copy, under expandable segments",
          args=("--expandable",)),
    _cuda("pinned-no_empty_cache-cuda", "colocated_pinned", "no_empty_cache", "offload_drop", "cached_not_returned",
          "the state dropped without empty_cache: expandable segments keep it mapped", args=("--expandable",)),
    _cuda("pinned-leak-cuda", "colocated_pinned", "leak", "leak", "sustained_growth",
          "256 MiB of hidden states kept every iteration"),
]

CASES = CPU_CASES + CUDA_CASES


def cases(device: str | None = None, only: list[str] | None = None) -> list[Case]:
    """The cases of one device (all: None), narrowed to names containing any of `only`."""
    chosen = [c for c in CASES if device is None or c.device == device]
    if only:
        chosen = [c for c in chosen if any(o in c.name for o in only)]
    return chosen
