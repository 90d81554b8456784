"""Everything a scrape reports for one host of a run, read from the run directory.

The recorder's files are the live state: every recording process of the host appends its samples and
events there, and the host sampler its GPUs and the processes NVML lists on them. Reading them here
(only what was appended since the previous read) puts no work on any recorded process, whether
anyone scrapes or not.

Once a scraper has come, a follower thread reads the files whenever nothing read them for a third of the
scrape interval (1 to 5 s: `collect_every`), and a scrape answers from what it read (as dcgm-exporter answers
from its last collection): a scrape renders, whatever the scrape interval, and reads the files itself only
when nothing read them for twice that interval (the first scrape; a follower held up). Levels are then at most
one collect interval (two while a pass is late), plus the writers' 0.5 s flush, old. Nothing runs before the
first scrape, and the follower stops when no scrape came for a long while.

Rendering ahead (`render_ahead`, set by server.metrics_app): after the pass expected to be the last before
the next scrape, the follower also renders the answer, for the formats recent scrapes asked for; a scrape
serves those bytes when nothing was read or taken since they were rendered, which makes them the very bytes
it would render, and takes the peaks they hold. Otherwise (a scrape that reads itself, another format, a
prediction missed, two scrapers) it renders itself, as without it.
"""
from __future__ import annotations

import collections
import copy
import json
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Callable

from miles_profile.logdir.layout import GPU_PROCS_SUFFIX, HOST_META_SUFFIX, HOST_SAMPLES_SUFFIX, PROCESS_META_SUFFIX
from miles_profile.logdir.line_tail import LineTail, read_regular
from miles_profile.metrics.process_state import ProcessState
from miles_profile.metrics.readings import GpuReading, HostReading, ProcessReading

_GPU_USED = "gpu_used:"
# A new process of the host joins the exposition within this long: listing a directory of 64 processes'
# files at every scrape cost more than reading their new rows at a 1 s scrape interval.
DISCOVER_EVERY_S = 2.0
# Of the host sampler's files only the latest rows count: a scrape reads at most this much of their end
# (a row of 8 GPUs is ~300 bytes; the process list of one time ~70 bytes a process).
_HOST_TAIL_BYTES = 64 * 1024
# Below this many new rows in all, each process folds its own: pyarrow's fixed cost (about 1 ms a scrape on
# the development VM) is more than Python's 0.9 us a row (a 1 s scrape of 64 processes: 640 rows).
BATCH_ROWS = 2000
# At most about this many bytes of rows joined for one pyarrow read: a scraper back after hours meets up to
# 8 MiB a process (process_state.MAX_READ_BYTES), and 64 of those joined would be 512 MiB held at once.
BATCH_BYTES = 16 * 1024 * 1024
# The follower reads the files when nothing read them for a third of the scrape interval, between these
# two: a scrape answers from its last pass, so a level is at most that old (plus the writers' 0.5 s flush),
# a third of what one sample of the scraper spans. Every 1 s (a 1 s scraper) costs 2.8 to 4.5 ms of CPU a
# second with 64 processes on the development VM, in real time; at a 15 s interval, passes every 5 s read
# 3,200 rows at once (pyarrow's batch, not Python's row by row) and cost 1.2 to 1.65 ms a second (simulated):
# the endpoint's CPU a minute 1.1 to 1.4 times the scrapes' alone before the follower, against 2 to 3 times
# with 1 s passes (bench/metrics_follower_cpu.py --collect-interval 1 5; docs/prometheus.md, Cost).
COLLECT_INTERVAL_S = 1.0
MAX_COLLECT_INTERVAL_S = 5.0
# A scrape reads the files itself when nothing read them for this many collect intervals: the follower is
# not running (the first scrape) or held up; a pass due at a scrape's time never makes the scrape read.
SCRAPE_READS_AFTER = 2
# The follower stops when no scrape came for IDLE_GAPS times the longest gap between two scrapes it saw,
# and at least IDLE_STOP_S: a scraper that went away; the next scrape starts it again.
IDLE_STOP_S = 300.0
IDLE_GAPS = 10
# The follower renders ahead after a pass when the next scrape is expected before the next pass plus this
# fraction of its interval (a pass that lands next to the scrape's time renders either way, a pass well
# before it leaves the rendering to a later pass), and after every pass while the latest two gaps between
# scrapes differ by more than this fraction (no fixed period to predict from).
RENDER_MARGIN = 0.1

# The answers the follower rendered ahead, by the format's content type (server.metrics_app's).
Rendered = dict[str, bytes]

log = logging.getLogger("miles_profile")


class _HostFiles:
    """One host sampler's files (a host's role can move to another process: each has its own)."""

    def __init__(self, run_dir: Path, stem: str):
        self.meta_path = run_dir / f"{stem}{HOST_META_SUFFIX}"
        self.samples = LineTail(run_dir / f"{stem}{HOST_SAMPLES_SUFFIX}", _HOST_TAIL_BYTES)
        self.procs = LineTail(run_dir / f"{stem}{GPU_PROCS_SUFFIX}", _HOST_TAIL_BYTES)
        self.header: list[str] | None = None
        self.last_row: list[str] | None = None
        self.gpus: list[dict] = []
        self.start = 0.0
        self.procs_t = ""                         # the latest host sample's time, as the file writes it
        self.procs_now: dict[int, tuple[str, int]] = {}  # pid -> (UUID, bytes) at that time

    def refresh(self) -> None:
        if not self.gpus:
            try:
                meta = json.loads(self.meta_path.read_bytes())
                self.gpus, self.start = list(meta.get("gpus") or []), float(meta.get("start_time", 0))
            except (OSError, ValueError):
                pass
        if self.header is None:
            first = read_regular(self.samples.path, 0, 65536).split(b"\n", 1)
            if len(first) == 2:
                self.header = first[0].decode(errors="replace").split(",")
        lines = self.samples.read(last=_HOST_TAIL_BYTES).split(b"\n")
        for line in reversed(lines):  # only the latest complete row matters
            cells = line.decode(errors="replace").split(",")
            if self.header is not None and len(cells) == len(self.header) and cells != self.header:
                self.last_row = cells
                break
        self._read_procs(self.procs.read(last=_HOST_TAIL_BYTES))

    def _read_procs(self, data: bytes) -> None:
        # Only the rows of the latest time: read backwards while the time is the same.
        latest: dict[int, tuple[str, int]] = {}
        t_latest = None
        for line in reversed(data.split(b"\n")):
            cells = line.decode(errors="replace").split(",")
            if len(cells) != 4 or cells[0] == "t":
                continue
            if t_latest is None:
                t_latest = cells[0]
            elif cells[0] != t_latest:
                break
            if cells[2].isdigit() and cells[3].isdigit():
                latest[int(cells[2])] = (cells[1], int(cells[3]))
        if t_latest is not None:
            self.procs_t, self.procs_now = t_latest, latest

    def close(self) -> None:
        self.samples.close()
        self.procs.close()

    def used(self) -> dict[str, int | None]:
        if self.header is None or self.last_row is None:
            return {}
        return {c[len(_GPU_USED):]: (int(v) if v.isdigit() else None)
                for c, v in zip(self.header, self.last_row) if c.startswith(_GPU_USED)}


def _fold_rows(pending: list[tuple[ProcessState, bytes]]) -> dict[ProcessState, list]:
    """The peaks per run of one phase of every process's new rows, folded at once for the processes
    whose rows share a layout (row_peaks.py); a process missing from the answer folds its own."""
    groups: dict[tuple, list[tuple[ProcessState, bytes]]] = collections.defaultdict(list)
    rows = 0
    for process, data in pending:
        if data:
            groups[process.row_layout()].append((process, data))
            rows += data.count(b"\n")
    if rows < BATCH_ROWS:
        return {}
    try:  # pyarrow and numpy: imported at the first scrape of many rows, never before
        from miles_profile.metrics import row_peaks
    except ImportError:  # a GPU host without them: each process folds its own rows, slower
        return {}

    runs: dict[ProcessState, list] = {}
    for (width, columns), members in groups.items():
        batch: list[tuple[ProcessState, bytes]] = []
        size = 0
        for k, (process, data) in enumerate(members):
            batch.append((process, data))
            size += len(data)
            if size >= BATCH_BYTES or k == len(members) - 1:
                folded = row_peaks.fold([d for _, d in batch], width, columns)
                if folded is not None:
                    runs.update(zip((p for p, _ in batch), folded))
                batch, size = [], 0
    return runs


class HostState:
    """The host `hostname` of the run in `run_dir`. `read()` is what one scrape reports.

    `collect_interval_s`: the follower's shortest interval (None: no follower, the files are read at
    scrape time only). `idle_stop_s`: the follower's shortest idle stop. `clock`: monotonic seconds. `follower_thread`
    False: no thread, the caller calls `follow_step()` itself (a benchmark in simulated time).
    `render_ahead`: renders a reading in the formats recent scrapes asked for (server.metrics_app sets it);
    None: scrapes render, nothing is rendered ahead."""

    def __init__(self, run_dir: str | os.PathLike, hostname: str, collect_interval_s: float | None = COLLECT_INTERVAL_S,
                 idle_stop_s: float = IDLE_STOP_S, clock: Callable[[], float] = time.monotonic,
                 follower_thread: bool = True):
        self.run_dir = Path(run_dir)
        self.host = hostname
        self.collect_interval_s = collect_interval_s
        self.idle_stop_s = idle_stop_s
        self._clock = clock
        self._processes: dict[str, ProcessState] = {}
        self._hosts: dict[str, _HostFiles] = {}
        # Scrapes (two Prometheus servers) and the follower's passes take turns.
        self._lock = threading.Lock()
        self._discovered = -math.inf
        self._closed = False
        self._read_at = -math.inf            # when the files were last read, by a scrape or a pass
        self._scraped_at = -math.inf
        self._longest_gap = 0.0              # between two scrapes while followed
        self._last_gap = 0.0                 # the latest one: the scrape interval the follower paces to
        self._gap_before: float | None = None  # the one before it, once known
        self._gaps_seen = 0
        self._following = False
        self._follower_thread = follower_thread
        self._follower: threading.Thread | None = None
        self._stop = threading.Event()
        self._failed = False                 # a pass's exception is logged once
        self.passes = 0                      # the follower's passes that read the files
        self.render_ahead: Callable[[HostReading], Rendered] | None = None
        # Moves at every read of the files and every taking of the peaks: bytes rendered ahead at the
        # same `_folds` are what a scrape would render now.
        self._folds = 0
        self._rendered: tuple[int, Rendered] | None = None
        self.renders_ahead = 0               # the follower's renders ahead
        self.served_ahead = 0                # scrapes answered with them

    @property
    def following(self) -> bool:
        """Whether the follower runs (from the first scrape until it stops)."""
        return self._following

    def _discover(self) -> bool:
        """List the run directory for new processes, every DISCOVER_EVERY_S at most; True when it did."""
        if self._clock() - self._discovered < DISCOVER_EVERY_S:
            return False
        self._discovered = self._clock()
        prefix = f"{self.host}-"
        try:
            entries = os.listdir(self.run_dir)
        except OSError:  # the run directory went away (a scrape during shutdown): report nothing new
            return True
        for entry in entries:
            if not entry.startswith(prefix):
                continue
            if entry.endswith(HOST_META_SUFFIX):
                stem = entry[: -len(HOST_META_SUFFIX)]
                if stem[len(prefix):].isdigit() and stem not in self._hosts:
                    self._hosts[stem] = _HostFiles(self.run_dir, stem)
            elif entry.endswith(PROCESS_META_SUFFIX):
                stem = entry[: -len(PROCESS_META_SUFFIX)]
                if stem[len(prefix):].isdigit() and stem not in self._processes:
                    self._processes[stem] = ProcessState(self.run_dir, stem)
        return True

    def read(self) -> HostReading:
        """One scrape: the reading as the follower's last pass left it (the files read here when none
        came for SCRAPE_READS_AFTER collect intervals, or without a follower), its peaks those folded
        since the previous scrape. The first scrape starts the follower."""
        reading = self.scrape(None)
        assert isinstance(reading, HostReading)
        return reading

    def scrape(self, content_type: str | None) -> bytes | HostReading:
        """read(), or the answer in `content_type` the follower rendered ahead when it is still the one
        a scrape would render (nothing read, nothing taken since): its peaks taken, as read() takes them."""
        with self._lock:
            if self._closed:
                return HostReading(hostname=self.host.lower())
            self._scraped()
            if self.collect_interval_s is None or \
                    self._clock() - self._read_at >= SCRAPE_READS_AFTER * self.collect_every():
                self._collect()
            rendered, self._rendered = self._rendered, None
            if rendered is not None and rendered[0] == self._folds and content_type in rendered[1]:
                for process in self._processes.values():
                    process.take_peaks()
                self._folds += 1
                self.served_ahead += 1
                return rendered[1][content_type]
            return self._reading()

    def _collect(self) -> None:
        """Read what the files gained and fold it: a scrape's reading half, and the follower's pass."""
        start = self._clock()
        listed = self._discover()
        for files in self._hosts.values():
            files.refresh()
        # A meta changes at start and end only: looked at when listing.
        pending = [(process, process.read_new(meta=listed)) for process in self._processes.values()]
        runs = _fold_rows(pending)
        self._folds += 1
        for process, data in pending:
            process.add_rows(data, runs.get(process))
        # Only a read that went through counts: after failed passes the scrape reads (and says why).
        self._read_at = start

    def _scraped(self) -> None:
        now = self._clock()
        if self._following:  # a gap the follower waited through: what its idle stop is measured against
            self._gap_before = self._last_gap if self._gaps_seen else None
            self._gaps_seen += 1
            self._last_gap = now - self._scraped_at
            self._longest_gap = max(self._longest_gap, self._last_gap)
        self._scraped_at = now
        if self._following or self.collect_interval_s is None:
            return
        self._following = True
        if self._follower_thread:
            if self._follower is not None:
                self._follower.join()  # one that stopped idle: past its last use of the lock, returning
            self._follower = threading.Thread(target=self._follow, name="miles_profile-metrics-follower", daemon=True)
            self._follower.start()

    def follow_step(self) -> float | None:
        """One wake of the follower: a pass over the files when nothing read them for collect_every().
        The seconds until the next wake; None when the follower stops (closed, or no scrape for long).
        A pass's exception is logged once and never leaves: the next pass tries again, and a scrape
        reads the files itself (its own failure logged by the collector) until a pass goes through."""
        with self._lock:
            now = self._clock()
            idle = max(self.idle_stop_s, IDLE_GAPS * self._longest_gap)
            if self._closed or not self._following or now - self._scraped_at > idle:
                self._following = False
                return None
            due = self._read_at + self.collect_every() - now
            if due > 0:
                return due
            try:
                self._collect()
                self.passes += 1
                if self.render_ahead is not None and self._scrape_before_next_pass(now):
                    self._rendered = (self._folds, self.render_ahead(self._reading(take=False)))
                    self.renders_ahead += 1
            except Exception as exc:  # noqa: BLE001 - whatever the files hold, the job never sees it
                if not self._failed:
                    self._failed = True
                    log.warning("miles_profile: metrics collection between scrapes failed (said once): %r", exc)
            return self.collect_every()

    def _scrape_before_next_pass(self, now: float) -> bool:
        """Whether the next scrape is expected before the follower's next pass: Prometheus scrapes at a
        fixed period, the latest gap, from the latest scrape. Never before a second scrape shows a gap;
        always while the latest two gaps differ (two scrapers, a curl between two scrapes: no period)."""
        if not self._gaps_seen:
            return False
        before, last = self._gap_before, self._last_gap
        if before is not None and abs(last - before) > RENDER_MARGIN * max(last, before):
            return True
        return self._scraped_at + last <= now + self.collect_every() * (1 + RENDER_MARGIN)

    def collect_every(self) -> float:
        """The follower's interval now: a third of the latest gap between two scrapes, at least
        collect_interval_s, at most MAX_COLLECT_INTERVAL_S (or collect_interval_s where that is more)."""
        least = self.collect_interval_s or COLLECT_INTERVAL_S
        return min(max(least, self._last_gap / 3), max(least, MAX_COLLECT_INTERVAL_S))

    def _follow(self) -> None:
        wait = self.collect_interval_s
        while wait is not None and not self._stop.wait(wait):
            wait = self.follow_step()

    def close(self) -> None:
        """Stop the follower (joined) and close the files kept open between reads; a scrape still
        running finishes first, later ones report nothing (their file descriptors could be another
        file's by then)."""
        with self._lock:
            self._closed, self._following = True, False
            follower = self._follower
            for files in self._hosts.values():
                files.close()
            for process in self._processes.values():
                process.close()
        self._stop.set()
        if follower is not None:
            follower.join()

    def _reading(self, take: bool = True) -> HostReading:
        """What a scrape reports; its peaks taken (`take`), else left for the scrape (rendering ahead)."""
        if take:
            self._folds += 1
        reading = HostReading(hostname=self.host.lower())
        hosts = sorted(self._hosts.values(), key=lambda h: h.start)
        index: dict[str, str] = {}
        totals: dict[str, int | None] = {}
        used: dict[str, int | None] = {}
        procs: dict[int, tuple[str, int]] = {}
        for files in hosts:  # a later holder of the host role overrides an earlier one
            for g in files.gpus:
                index[str(g.get("uuid"))] = str(g.get("index", ""))
                totals[str(g.get("uuid"))] = g.get("total")
            used.update(files.used())
            if files.procs_t:
                procs = files.procs_now
        reading.gpus = [GpuReading(index[u], u, totals.get(u), used.get(u)) for u in index]
        kills: collections.Counter = collections.Counter()
        dead: set[int] = set()
        for process in self._processes.values():
            kills.update(process.kills)
            dead |= process.dead_pids
        by_key: dict[tuple[str, str], ProcessReading] = {}
        for process in self._processes.values():
            r = process.reading
            peaks = process.take_peaks() if take else process.peaks()
            if process.ended or not process.meta or r.pid in dead:
                continue  # a finished or killed process has no current memory; its deaths still count above
            if r.pid in procs:
                uuid, r.nvml_used = procs[r.pid]
                r.uuid = r.uuid or uuid
            r.gpu = index.get(r.uuid, "")
            key = (r.rank, r.role)
            if key in by_key:  # two processes of one (rank, role), e.g. a forked child: keep the first seen
                continue
            # A copy with its own peaks (and the dicts a pass adds to): a scrape renders it outside the lock,
            # while the follower may fold the next rows and render ahead with the peaks of later ones.
            r = copy.copy(r)
            r.peaks, r.offloads, r.transitions = peaks, dict(r.offloads), dict(r.transitions)
            by_key[key] = r
        reading.processes = list(by_key.values())
        reading.kills = dict(kills)
        return reading
