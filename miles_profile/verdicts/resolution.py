"""What each memory series can resolve, in bytes: below it a difference is noise, and a check says
"too small to judge" instead of pass or fail.

These are measured facts about the sources, kept beside the series they describe (docs/checks.md,
"Resolution", says how each was measured):

- allocator allocated (`gpu{i}_alloc`): the caching allocator rounds every block up (512 B in the small
  pool, 2 MiB segments for it); small tensors of a step and the autograd workspace move it by a few MiB.
- allocator reserved (`gpu{i}_reserved`): whole segments come and go, 20 MiB and more in the large pool.
- NVML (`gpu{i}_proc`, `gpu{i}_used`): sees segments, plus the CUDA context and the driver's own
  granularity (2 MiB pages); read every 100 ms and at phase boundaries.
- host RSS (`rss`, `rss_peak`): pages come and go with glibc's arenas, Python's allocator and the
  kernel's readahead. Measured on healthy CPU runs here (2-core VM, `python -m bench.rss_floor_noise`,
  the per-iteration RSS floor after warm-up around its Theil-Sen line, 11 iterations each):
  `record -- --preset cpu --num-rollout 12`: scatter 0.01 MiB (MAD as a standard deviation), largest
  residual 0.04 MiB; `--torch-loop 12` (an MLP, AdamW, recorded with `record --exec`): 1.57 MiB,
  largest 6.98 MiB. The resolution, 8 MiB, lies above the largest residual seen.
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
