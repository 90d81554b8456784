"""What each memory series can resolve, in bytes: below it a difference is noise, and a check says
"too small to judge" instead of pass or fail.

These are measured facts about the sources, kept beside the series they describe (docs/checks.md,
"Resolution", says how each was measured):

- allocator allocated (`gpu{i}_alloc`, `gpu{i}_alloc_peak`), 2 MiB: PyTorch's caching allocator counts
  the blocks it hands out, each request rounded up to 512 B; a block cut from a large-pool segment is
  split only when more than 1 MiB would remain, so one tensor can count up to 1 MiB above its bytes.
  Freeing one or two tensors therefore moves allocated by their bytes within 2 MiB (on the H200 runs
  in sample_logs/h200 every offload_train's allocated fell by its declared bytes to the KiB).
- allocator reserved (`gpu{i}_reserved`), 20 MiB: memory comes from and goes back to the driver in whole
  segments: 2 MiB segments for blocks of up to 1 MiB (the small pool), 20 MiB segments for requests of
  1-10 MiB, larger requests rounded up to 2 MiB; a segment goes back (empty_cache) only when no block in
  it is live, so a few small tensors can hold 20 MiB.
- NVML per process (`gpu{i}_proc`, read every 100 ms and at phase boundaries by the process holding the
  host role; `gpu{i}_boundary_proc`, read by any other process at its own phase boundaries), 20 MiB: what
  the driver gave the process, in 2 MiB pages: the allocator's segments (so reserved's 20 MiB), plus the
  CUDA context (about 0.5 GiB on the H200, created once: constant across an offload) and library
  workspaces (cuBLAS, NCCL) that come and go with their own sizes.
- NVML device used (`gpu{i}_used`, `gpu{i}_boundary_used`), 20 MiB: the same granularity, summed over
  every process on the GPU: another process's work moves it too, so checks judge it only where nothing
  per process was recorded.
- host RSS (`rss`, `rss_peak`): pages come and go with glibc's arenas, Python's allocator and the
  kernel's readahead. Measured on healthy CPU runs here (2-core VM, `python -m bench.rss_floor_noise`,
  the per-iteration RSS floor after warm-up around its Theil-Sen line, 11 iterations each):
  `record -- --preset cpu --num-rollout 12`: scatter 0.01 MiB (MAD as a standard deviation), largest
  residual 0.04 MiB; the same with `--num-rollout 8 --offload-train --offload-train-target disk
  --offload-rollout` (7 iterations): 0.05 MiB, largest 0.11 MiB; `--torch-loop 12` (an MLP, AdamW,
  recorded with `record --exec`): 1.57 MiB, largest 6.98 MiB. The resolution, 8 MiB, lies above the
  largest residual seen.
- glibc heap (`heap_used`): byte-exact counts (mallinfo2), but freed memory can stay in the heap;
  1 MiB keeps a few small arena moves from counting.
"""
from __future__ import annotations

MiB = 1024 ** 2

# Keyed by the suffix of the column after `gpu{i}_` (or the host column's name).
RESOLUTION_BYTES: dict[str, int] = {
    "alloc": 2 * MiB,
    "alloc_peak": 2 * MiB,
    "reserved": 20 * MiB,
    "proc": 20 * MiB,
    "used": 20 * MiB,
    "boundary_proc": 20 * MiB,
    "boundary_used": 20 * MiB,
    "rss": 8 * MiB,
    "rss_peak": 8 * MiB,
    "heap_used": 1 * MiB,
    "heap_used_peak": 1 * MiB,
}
DEFAULT_BYTES = 64 * MiB


def kind_of(column: str) -> str:
    """`gpu0_alloc_peak` -> `alloc_peak`; `rss` -> `rss`."""
    if column.startswith("gpu"):
        return column.split("_", 1)[1] if "_" in column else column
    return column


def resolution_of(columns) -> float:
    """The coarsest resolution among the columns a value was summed or chosen from."""
    columns = [columns] if isinstance(columns, str) else list(columns)
    return float(max((RESOLUTION_BYTES.get(kind_of(c), DEFAULT_BYTES) for c in columns), default=DEFAULT_BYTES))
