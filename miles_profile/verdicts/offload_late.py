"""offload_drop's late window: which drop after an offload is its own late free, and which the next phase's
own doing (issue 30, class 8).

An offload that did not drop its declared bytes inside the phase is `freed_late` when they went within the
next phase instance of the same process (`offload_late_phases`, default 1), else `still_referenced` or
`never_freed`. The level in that next phase also moves by what the phase does on its own, two ways:

- it frees memory of its own (prompts prefetched by the train step, dropped by generate once encoded): that
  fall, credited to an offload that never freed, read as a late free;
- it allocates memory of its own (generate's rollout) while a thread frees the offloaded state: read at
  the phase's boundaries only (glibc's heap without `record --heap`), the fall is hidden, and a late free
  read as "still referenced".

What the next phase does on its own is read from its instances that do not follow an offload of the same
process (the first iteration's `generate`): the median of their fall below their begin level (`own_drop`)
and of their end level less their begin level (`own_net`). The late drop is the larger of the fall less
`own_drop` and the fall to the phase's end less `own_net`. A phase without such an instance keeps the raw
fall: nothing tells its own doing apart there. Only on what tensors hold (allocated, glibc's heap in
use): on the driver's series a phase's allocations reuse cached blocks first, so its own doing does not
add up (an onload after an offload that kept its cache rose by less, and read as a late free).

    late_windows(instances, count) -> {instance index: LateWindow}
    late_drop(track, before, at_end, window) -> (bytes gone by the window's end, words or "")
    late_or_own(window, late, inside, expected, need, resolution) -> whether that drop may be the next
        phase's own

Where the next phase ALWAYS follows an offload, nothing tells its own doing apart: a fall inside it is
the offload's late free or the phase's own free (prompts dropped once encoded) of a state never freed. The
declared bytes are the one evidence left: a late free frees what the offload declared, so a fall of that
size, or of what the phase left (within 1 - `offload_min_drop_share` of the declared bytes, or the series'
resolution), stays `freed_late`; a fall of another size is a WARN that names both readings
(`late_or_own_free`), never a FAIL and never a pass.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from miles_profile import names
from miles_profile.runmodel.series import Track
from miles_profile.verdicts.types import gib


@dataclass(frozen=True)
class LateWindow:
    end: float                                  # end of the window (inf: the next phase is still open)
    next_phase: str | None                      # its first phase's name; None: no phase after the offload
    own: tuple[tuple[float, float], ...] = ()   # that phase's instances not right after an offload


def late_windows(inst, count: int) -> dict:
    """Per offload instance (index of `inst`): its LateWindow. The window runs from the offload's end to
    the end of the next `count` phase instances of the same process; none after it (the process's last
    phase): empty, so the process's exit is never taken for a late free."""
    out = {}
    for _, group in inst.groupby("pid", sort=False):
        g = group.sort_values("start", kind="stable")
        starts, ends = g["start"].to_numpy(float), g["end"].to_numpy(float)
        names_ = g["name"].astype(str).to_numpy()
        after_offload = np.r_[False, np.char.startswith(names_[:-1].astype(str), names.OFFLOAD_PREFIX)]
        for k, name, end in zip(g.index, names_, ends):
            if not name.startswith(names.OFFLOAD_PREFIX):
                continue
            j = int(np.searchsorted(starts, end, "left"))
            nxt = slice(j, j + count)
            if j >= len(starts) or count == 0 or not np.isfinite(end):
                out[k] = LateWindow(end, None)
                continue
            # an open next phase has not ended: everything recorded since is in it
            window_end = np.inf if np.isnan(ends[nxt]).any() else float(ends[nxt].max())
            own = ()
            if count == 1:  # the next phase's own doing, from its instances that follow no offload
                mine = (names_ == names_[j]) & ~after_offload & np.isfinite(ends)
                own = tuple(zip(starts[mine].tolist(), ends[mine].tolist()))
            out[k] = LateWindow(window_end, names_[j], own)
    return out


def _own_change(track: Track, spans) -> tuple[float, float]:
    """Medians over `spans` of (begin level - lowest level inside) and (end level - begin level)."""
    drops, nets = [], []
    for start, end in spans:
        begin, last = track.at_or_before(start), track.at_or_before(end)
        inside = track.value[int(np.searchsorted(track.t, start, "right")):int(np.searchsorted(track.t, end, "right"))]
        if not (np.isfinite(begin) and np.isfinite(last)) or not np.isfinite(inside).any():
            continue
        drops.append(begin - float(np.nanmin(inside)))
        nets.append(last - begin)
    if not drops:
        return np.nan, np.nan
    return float(np.median(drops)), float(np.median(nets))


def late_drop(track: Track, before: float, at_end: float, offload_end: float, window: LateWindow,
              resolution: float = 0.0) -> tuple[float, str]:
    """Bytes of the offload gone by the end of its late window, the next phase's own doing taken out
    where its instances after no offload show it; with words saying what was taken out ("" where that
    changed the drop by less than `resolution`, the series' own: the raw drop is kept)."""
    if not window.end > offload_end:
        return before - at_end, ""
    lo = int(np.searchsorted(track.t, offload_end, "right"))
    hi = int(np.searchsorted(track.t, window.end, "right"))
    inside = track.value[lo:hi]
    later_low = min(at_end, float(np.nanmin(inside))) if np.isfinite(inside).any() else at_end
    raw = before - later_low
    own_drop, own_net = _own_change(track, window.own)
    if not np.isfinite(own_drop):
        return raw, ""
    level_end = track.at_or_before(window.end) if np.isfinite(window.end) else track.value[hi - 1]
    by_fall = raw - max(own_drop, 0.0)
    by_end = before - (level_end - own_net) if np.isfinite(level_end) else -np.inf
    late = max(by_fall, by_end, before - at_end)
    if abs(late - raw) <= resolution:
        return raw, ""
    what = (f"{window.next_phase}'s own doing taken out: where no offload precedes it, it falls "
            f"{max(own_drop, 0.0) / 1024 ** 3:.3f} GiB below its begin and ends {own_net / 1024 ** 3:+.3f} GiB "
            "from it")
    return late, what


def late_or_own(window: LateWindow, late: float, inside: float, expected: float, need: float,
                resolution: float) -> bool:
    """A late drop (`late` > `need`) the levels cannot credit to the offload: the next phase always
    follows an offload (no instance of it shows its own doing) and what fell in it is not what the offload
    left: a late free frees at least what was still there at the phase's end and at most what was declared
    (mingpt's state dict freed by the collector in generate: 1.126 GiB, with 0.564 GiB of other memory
    freed inside), within max(1 - offload_min_drop_share of the declared bytes, the resolution)."""
    if window.next_phase is None or window.own:
        return False
    part, tolerance = late - max(inside, 0.0), max(expected - need, resolution)
    return not (expected - max(inside, 0.0) - tolerance <= part <= expected + tolerance)


def ambiguity(window: LateWindow, late: float, inside: float, expected: float, series: str) -> str:
    """What a late_or_own_free WARN says: which phase, and the bytes either way."""
    nxt = window.next_phase
    return (f"ambiguous: {series} fell {gib(late - inside)} more during {nxt}, the next phase, where "
            f"{gib(expected)} was declared ({gib(inside)} inside the phase): either the offload freed its state late, "
            f"in {nxt}, or {nxt} freed {gib(late - inside)} of its own and the offload kept its {gib(expected)}. "
            f"{nxt} always follows an offload here, so its own doing cannot be read apart (a WARN; run one {nxt} "
            "after no offload, e.g. before the loop's first offload, to tell them apart)")
