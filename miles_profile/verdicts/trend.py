"""Is a per-iteration floor growing? A robust trend with its uncertainty, and the one-time step told
apart from a sustained climb. Pure functions over numbers; `leak` (one process's series) and
`floor_trend_leak` (every GPU and process of a fleet) both judge with `judge_floors`, and the fleet
view ranks its "fastest-rising floor" with `robust_slope` (the fits: runmodel/slopes.py).

The rule (docs/checks.md, "leak"):

- fewer than `min_iterations` finite floors after the warm-up: n/a, "needs N iterations";
- the Theil-Sen slope and its confidence interval (the numbers of `scipy.stats.theilslopes`, computed
  for many series in one numpy pass by `theil_sen`): one noisy iteration moves the median of pairwise
  slopes little, where least squares or first-against-last follow it;
- the largest jump between two consecutive floors is a one-time step when, that jump taken out, the
  rest is not growing and the jump alone exceeds the allowed growth: its own finding (status pass,
  cause `one_time_step`), since memory kept once (glibc's heap after an offload round trip, the CUDA
  caching allocator's blocks) is retention, not a leak;
- fail (`sustained_growth`) only when the interval's lower bound times the iterations judged exceeds
  the allowed growth (the caller derives it from the series' resolution and the run's peak), and the
  growth goes on: a floor whose later half rises clearly slower than the whole run (its interval below
  the run's slope, its lower bound over the run within the allowed growth) levelled off: `growth_stopped`,
  a pass;
- growth that is real (lower bound above zero), estimated below the series' resolution while the
  interval reaches the allowed growth: too small to judge; an interval whose top stays within the
  allowed growth is judged (pass, its top named).

No scipy at run time (the GPU machine has none): the tests check `theil_sen` against scipy's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from miles_profile.runmodel.slopes import CONFIDENCE, Slope, robust_slope, slopes_of, theil_sen  # noqa: F401 - the fits this module judges

GiB = 1024 ** 3


@dataclass
class FloorVerdict:
    status: str                      # "pass", "fail", "n/a" or "too small to judge"
    cause: str | None                # "sustained_growth", "one_time_step" or None
    text: str                        # what was measured, in words (no series name: the caller adds it)
    numbers: dict = field(default_factory=dict)


def _mib(n: float) -> str:
    return f"{n / 1024 ** 2:+.1f} MiB"


def _gib(n: float) -> str:
    return f"{n / GiB:.3f} GiB"


def _one_time_fall(x: np.ndarray, y: np.ndarray, allowed: float, resolution: float) -> tuple[int, float] | None:
    """(k, size) when the largest fall, after x[k], exceeds the allowed growth (and the resolution) with
    at least two floors after it (a fall at the very end, a cleanup, is left to the trend), and the level
    fell with it: the median floor before it is above the median after by as much. One high floor that
    came back down (an iteration of long sequences only) is scatter for the trend, not a level that fell:
    a varying-length loop's floors [0.36, 0.47, 0.36, ...] read as two "falls", then "needs 5 iterations",
    a pass that judged nothing. None otherwise."""
    d = -np.diff(y)
    k = int(np.argmax(d))
    size = float(d[k])
    least = max(allowed, resolution)
    if size <= least or k > len(y) - 3 or float(np.median(y[:k + 1]) - np.median(y[k + 1:])) <= least:
        return None
    return k, size


def _largest_jump(x: np.ndarray, y: np.ndarray) -> tuple[int, float]:
    """Index k of the largest rise y[k+1] - y[k], and that rise."""
    d = np.diff(y)
    k = int(np.argmax(d))
    return k, float(d[k])


def judge_floors(iterations, floors, *, resolution: float, allowed: float, min_iterations: int,
                 step_cause: str = "", fit: Slope | None = None, over: str | None = None,
                 unit: str = "iteration") -> FloorVerdict:
    """The verdict on floors (bytes) measured at `iterations` (already past the warm-up).

    `resolution`: bytes the series can resolve; `allowed`: the growth over the iterations judged that
    fails (at least the resolution); `step_cause`: the likely cause of a one-time step, in words; `fit`:
    the floors' robust_slope when the caller fitted many series at once (`slopes_of`); `over`: what the
    floors span, in words, where each is not one iteration (windows of several); `unit`: what `iterations`
    counts (`min` where the floors are windows of time and `iterations` their minutes: rates per minute)."""
    x, y = np.asarray(iterations, dtype=float), np.asarray(floors, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if 2 <= len(x) < min_iterations:
        short = _short_run(x, y, resolution, allowed, min_iterations, step_cause)
        if short is not None:
            return short
    if len(x) < min_iterations:
        return FloorVerdict("n/a", None, f"needs {min_iterations} iterations after warm-up with a floor "
                            f"measured throughout, has {len(x)}", dict(iterations=len(x)))
    fit = fit or robust_slope(x, y)
    growth, growth_low = fit.slope * fit.span, fit.low * fit.span
    numbers = dict(slope=fit.slope, slope_low=fit.low, slope_high=fit.high, iterations=fit.n, growth=growth,
                   growth_low=growth_low, allowed=float(allowed), resolution=float(resolution),
                   first=float(y[0]), last=float(y[-1]), floors=[float(v) for v in y])

    def at(v: float) -> str:
        return f"iteration {int(v)}" if unit == "iteration" else f"{v:.1f} {unit}"

    measured = (f"floor {_gib(y[0])} → {_gib(y[-1])} over {over or f'{fit.n} iterations'}, {_mib(fit.slope)}/{unit} "
                f"({CONFIDENCE:.0%} interval {_mib(fit.low)} to {_mib(fit.high)})")
    fall = _one_time_fall(x, y, allowed, resolution)
    if fall is not None:
        # The floor fell once (a warm-up buffer freed) by more than the allowed growth (issue 30, class 8:
        # "floor 0.095 GiB → 0.036 GiB" was called growth): judged from after the fall, where a leak that
        # goes on still fails; first against last would read the fall as the run's trend.
        k, size = fall
        rest = judge_floors(x[k + 1:], y[k + 1:], resolution=resolution, allowed=allowed,
                            min_iterations=min_iterations, step_cause=step_cause, unit=unit)
        rest.numbers.update(fall=size, fall_after_iteration=int(x[k]))
        head = f"the floor fell {_gib(size)} after {at(x[k])} ({_gib(y[k])} → {_gib(y[k + 1])})"
        if rest.status in ("fail", "warn"):
            return FloorVerdict(rest.status, rest.cause, f"{head}, then: {rest.text}", rest.numbers)
        numbers.update(growth=float(y[-1] - y[0]), growth_low=min(growth_low, float(y[-1] - y[0])), fall=size,
                       fall_after_iteration=int(x[k]))
        return FloorVerdict("pass", None, f"{head}: not growth; after it {rest.text}", numbers)
    step = _one_time_step(x, y, allowed)
    if step is not None:
        k, size, rest = step
        numbers.update(step=size, step_after_iteration=int(x[k]), growth_without_step=rest.slope * rest.span)
        return FloorVerdict("pass", "one_time_step",
                            f"one-time step of {_gib(size)} after {at(x[k])}, flat before and after "
                            f"({_mib(rest.slope)}/{unit} without it): not a leak; {measured}"
                            + (f". Likely {step_cause}" if step_cause else ""), numbers)
    if growth_low > allowed:
        later = _stopped(x, y, fit, allowed)
        if later is not None:
            numbers.update(later_slope=later.slope, later_slope_low=later.low, later_slope_high=later.high,
                           later_from_iteration=int(x[len(x) // 2]))
            return FloorVerdict("pass", "growth_stopped",
                                f"growth that stopped: {measured}; from {at(x[len(x) // 2])} on "
                                f"{_mib(later.slope)}/{unit} ({_mib(later.low)} to {_mib(later.high)}), below "
                                "the run's rate: bounded (a cache or the allocator's pools filling up), not a leak",
                                numbers)
        return FloorVerdict("fail", "sustained_growth", f"sustained growth: {measured}; at least "
                            f"{_gib(growth_low)} over the run, allowed {_gib(allowed)}", numbers)
    growth_high = fit.high * fit.span
    # a rise the interval says is real, estimated below what the series resolves, while the interval
    # still reaches a growth that fails: neither flat nor a leak. Where even the interval's top stays
    # within the allowed growth the run is judged: no leak of the size this check fails on (the README's
    # loop, +0.8 MiB/iteration of glibc heap, top 12 MiB against 64 MiB allowed, was "too small" before).
    if fit.low > 0 and growth < resolution and growth_high > allowed:
        return FloorVerdict("too small to judge", None, f"too small to judge (growth {_gib(growth)} below the "
                            f"resolution {_gib(resolution)} of the series): {measured}", numbers)
    bound = f"; at most {_gib(growth_high)} over the run" if 0 < growth_high <= allowed else ""
    return FloorVerdict("pass", None, f"{measured}{bound}; allowed {_gib(allowed)} over the run", numbers)


# A short run's floor rising in every iteration by at least this many times the series' resolution
# (and this share of the allowed growth) is a leak before a trend has `min_iterations` floors.
SHORT_STEP_RESOLUTIONS = 4.0
SHORT_STEP_ALLOWED_SHARE = 0.25
# ... and fails only where the rise over the run is at least this many times the allowed growth (less:
# WARN, a healthy loop's heap warming up looks the same over 3 floors)
SHORT_FAIL_ALLOWED_MULTIPLE = 2.0
# ... and where the last rise kept this share of the earlier ones' mean: a leak keeps its pace, a heap
# warming up slows (a healthy 4-iteration HF llama loop on a loaded machine: +109.5 then +61.4 MiB, 2.01x
# the allowed growth, was a false FAIL)
SHORT_FAIL_KEPT_PACE = 0.75


def _short_run(x: np.ndarray, y: np.ndarray, resolution: float, allowed: float, min_iterations: int,
               step_cause: str) -> FloorVerdict | None:
    """Too few floors for a trend (2 to min_iterations - 1): a floor that rose in every iteration by far
    above the resolution, more than `allowed` in all, fails with its rate from 3 floors on (0.5 GiB of
    logits kept per iteration over 4 iterations on the H200); with 2 floors the rise may be a one-time
    step: a warning. A rise in one iteration only, flat otherwise, is a one-time step (pass). None: flat
    or within the allowed growth, left to the n/a rule."""
    d = np.diff(y)
    total = float(y[-1] - y[0])
    if total <= allowed:
        return None
    step = max(SHORT_STEP_RESOLUTIONS * resolution, SHORT_STEP_ALLOWED_SHARE * allowed)
    rate = total / float(x[-1] - x[0])
    numbers = dict(slope=rate, slope_low=float(d.min() / np.diff(x).max()), slope_high=float(d.max()),
                   iterations=len(x), growth=total, growth_low=float(d.min()) * (len(x) - 1),
                   allowed=float(allowed), resolution=float(resolution), first=float(y[0]), last=float(y[-1]),
                   floors=[float(v) for v in y])
    measured = (f"floor {_gib(y[0])} → {_gib(y[-1])} over {len(x)} iterations after warm-up, {_mib(rate)}/iteration "
                f"(each iteration {_mib(d.min())} to {_mib(d.max())}; resolution {_gib(resolution)})")
    if (d >= step).all():
        kept_pace = d[-1] >= SHORT_FAIL_KEPT_PACE * d[:-1].mean() if len(d) > 1 else False
        if len(x) >= 3 and total >= SHORT_FAIL_ALLOWED_MULTIPLE * allowed and kept_pace:
            return FloorVerdict("fail", "sustained_growth", f"sustained growth in every iteration of a short run: "
                                f"{measured}; {_gib(total)} over the run, allowed {_gib(allowed)} (too few iterations "
                                f"for a trend, {min_iterations} needed, but every one rose)", numbers)
        if len(x) >= 3 and not kept_pace:
            return FloorVerdict("warn", "few_iterations", f"rose in every iteration of a short run, the last rise "
                                f"{_mib(d[-1])} below the earlier ones': {measured}; {_gib(total)} over the run, "
                                f"allowed {_gib(allowed)}: a heap warming up slows, a leak keeps its pace; too few "
                                f"iterations to tell ({min_iterations} needed)", numbers)
        if len(x) >= 3:  # every iteration rose, but by less than twice what the run may grow: a heap
            # warming up over a 4-iteration healthy HF loop (+61 to +70 MiB each, 0.128 GiB against 0.083
            # allowed) looks the same as a slow leak this short: unsure, said so
            return FloorVerdict("warn", "few_iterations", f"rose in every iteration of a short run: {measured}; "
                                f"{_gib(total)} over the run, allowed {_gib(allowed)}: a slow leak or a heap warming "
                                f"up, too few iterations to tell ({min_iterations} needed)", numbers)
        return FloorVerdict("warn", "few_iterations", f"rose in its one judged iteration: {measured}; allowed "
                            f"{_gib(allowed)}: a leak or a one-time step, too few iterations to tell "
                            f"({min_iterations} needed)", numbers)
    if (d >= step).sum() == 1 and (np.abs(np.delete(d, np.argmax(d))) < step).all():
        numbers.update(step=float(d.max()), step_after_iteration=int(x[int(np.argmax(d))]))
        return FloorVerdict("pass", "one_time_step", f"one-time step of {_gib(d.max())}, flat otherwise: not a "
                            f"leak; {measured}" + (f". Likely {step_cause}" if step_cause else ""), numbers)
    return FloorVerdict("warn", "few_iterations", f"rose {_gib(total)} over {len(x)} iterations, not in every "
                        f"one: {measured}; allowed {_gib(allowed)}; too few iterations for a trend "
                        f"({min_iterations} needed)", numbers)


def _stopped(x: np.ndarray, y: np.ndarray, fit: Slope, allowed: float) -> Slope | None:
    """The later half's trend when the growth did not go on to the end: its interval lies below the whole
    run's slope, and its lower bound over the whole run stays within `allowed` (a climb after a step
    fails on its own). A steady leak keeps its rate in the later half (its interval holds the run's
    slope); a floor that rose and then levelled off (glibc's heap or a cache filling over the first
    rounds) does not. None: sustained, or too few floors (MIN_LATER) in the later half to tell."""
    later_x, later_y = x[len(x) // 2:], y[len(y) // 2:]
    if len(later_x) < MIN_LATER:
        return None
    later = robust_slope(later_x, later_y)
    if later is None or later.high >= fit.slope or later.low * fit.span > allowed:
        return None
    return later


MIN_LATER = 4  # floors in the later half: with fewer, its interval says nothing


def _one_time_step(x: np.ndarray, y: np.ndarray, allowed: float):
    """(k, size, trend without it) when the largest jump, after iteration x[k], is a one-time step:
    larger than `allowed`, with the floors flat once it is taken out. None otherwise."""
    k, size = _largest_jump(x, y)
    # flat before and after needs two floors on each side; a jump at the very end is left to the trend
    if size <= allowed or k < 1 or k > len(y) - 3:
        return None
    flattened = np.where(np.arange(len(y)) > k, y - size, y)
    rest = robust_slope(x, flattened)
    # the rest must be flat: its lower bound over the run within the allowed growth, and its estimate
    # under half the step (a climb of equal increments keeps its slope when one of them is removed)
    if rest is None or rest.low * rest.span > allowed or rest.slope * rest.span > size / 2:
        return None
    return k, size, rest


# Likely causes of a one-time step, by what the series measures: words the user can act on.
STEP_CAUSES = {
    "host": ("glibc keeps freed memory in its heap after an offload round trip (the freed CPU copies of "
             "tensors): set MALLOC_TRIM_THRESHOLD_ (e.g. 0) or MALLOC_ARENA_MAX=2, call "
             "ctypes.CDLL('libc.so.6').malloc_trim(0) after the onload, or run with jemalloc"),
    # a run with no offload: glibc keeps freed memory too, but no round trip made it
    "host_no_offload": ("glibc keeps freed memory in its heap (freed blocks below its mmap threshold stay "
                        "resident): set MALLOC_TRIM_THRESHOLD_ (e.g. 0) or MALLOC_ARENA_MAX=2, or call "
                        "ctypes.CDLL('libc.so.6').malloc_trim(0) after the phase that freed them"),
    "device": ("the CUDA caching allocator keeps freed blocks reserved: call torch.cuda.empty_cache() after "
               "the phase that freed them, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    "allocated": ("tensors allocated once and kept (optimizer state created at the first step, a cache "
                  "filled once): expected if its size matches that state"),
}


def step_cause_of(series_kind: str, offloads: bool = True) -> str:
    """`series_kind`: a column kind (`rss`, `heap_used`, `reserved`, `proc`, `used`, `alloc`); `offloads`:
    whether the run (or process) has an offload_* phase: without one, no round trip is blamed."""
    if series_kind in ("rss", "rss_peak", "heap_used", "host"):
        return STEP_CAUSES["host" if offloads else "host_no_offload"]
    if series_kind in ("alloc", "alloc_peak"):
        return STEP_CAUSES["allocated"]
    return STEP_CAUSES["device"]
