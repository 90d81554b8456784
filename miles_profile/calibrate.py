"""What each memory link of this machine can do, measured once per host: the ceilings the transition
meter (runmodel/transitions.py) holds every offload, onload and weight update against.

    measure(nbytes=DEFAULT_BYTES, disk_dir=None, repeats=3) -> dict    # one measurement, now
    for_this_host(disk_dir=None, refresh=False, cache_dir=None) -> dict  # cached per host, measured in a child
                                                                         # (refresh: `record --recalibrate`)
    python -m miles_profile.calibrate [--bytes N] [--disk-dir D]       # measure(), as JSON on stdout
    ceilings_of(meta) -> dict[str, float]                              # link -> bytes/s; {} when none

Links (bytes per second, the best of `repeats` copies of `nbytes`):
    pinned_d2h, pinned_h2d       device <-> page-locked host buffer (CUDA only)
    pageable_d2h, pageable_h2d   device <-> ordinary host memory (CUDA only)
    device_copy                  device -> device, one buffer to another (CUDA only)
    host_copy                    host memory -> host memory (memcpy)
    disk_write, disk_read        a temporary file in `disk_dir`: written and fsync'ed, then dropped
                                 from the page cache (posix_fadvise) and read back
A link that could not be measured here is absent, never zero: a ceiling is never invented.

`record --calibrate` stores the result in the run meta under CALIBRATION_KEY (docs/transitions.md).
Imports numpy, and torch only when it is installed (the recorder's dependencies).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from miles_profile.errors import MilesProfileError
from miles_profile.identity import host_name

CALIBRATION_KEY = "calibration"
VERSION = 1
DEFAULT_BYTES = 256 * 1024**2
CACHE_ENV = "MILES_PROFILE_CACHE_DIR"
LINKS = ("pinned_d2h", "pinned_h2d", "pageable_d2h", "pageable_h2d", "device_copy", "host_copy",
         "disk_write", "disk_read")
_CHUNK = 8 * 1024**2
CACHE_MAX_BYTES = 64 * 1024  # a calibration is under 1 KiB
MAX_BYTES_PER_S = 1e15  # a petabyte per second: no memory link is faster; a larger ceiling is damage


def _best(copy: Callable[[], None], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    """The shortest of `repeats` timed calls, after one untimed warm-up (first-touch page faults)."""
    copy()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        copy()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def _host_copy(nbytes: int, repeats: int) -> float:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    return nbytes / _best(lambda: np.copyto(dst, src), repeats)


def _disk(nbytes: int, directory: Path, repeats: int) -> tuple[float, float]:
    """(write, read) bytes/s of a file of `nbytes` in `directory`, written in 8 MiB chunks."""
    chunk = np.full(min(_CHUNK, nbytes), 7, dtype=np.uint8)
    into = bytearray(len(chunk))
    fd, name = tempfile.mkstemp(prefix=".miles_calibrate_", dir=directory)
    write_s, read_s = float("inf"), float("inf")
    try:
        for _ in range(max(1, repeats)):
            os.lseek(fd, 0, os.SEEK_SET)
            start = time.perf_counter()
            for _ in range(0, nbytes, len(chunk)):
                os.write(fd, chunk)
            os.fsync(fd)
            write_s = min(write_s, time.perf_counter() - start)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read from the disk, not the page cache
            os.lseek(fd, 0, os.SEEK_SET)
            start = time.perf_counter()
            with open(fd, "rb", buffering=0, closefd=False) as f:
                while f.readinto(into):
                    pass
            read_s = min(read_s, time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(name)
    written = len(chunk) * -(-nbytes // len(chunk))
    return written / write_s, written / read_s


def _cuda(nbytes: int, repeats: int) -> tuple[dict[str, float], str | None]:
    if "torch" not in sys.modules and not os.path.exists("/dev/nvidiactl"):
        return {}, None  # no NVIDIA driver here: importing torch (seconds) would only say so
    try:
        import torch  # seconds to import, and only where a driver could answer
    except ImportError:
        return {}, None
    if not torch.cuda.is_available():
        return {}, None
    device = torch.device("cuda", torch.cuda.current_device())
    sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    other = torch.empty_like(on_device)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pageable.fill_(1)
    links = {
        "pinned_d2h": nbytes / _best(lambda: pinned.copy_(on_device, non_blocking=True), repeats, sync),
        "pinned_h2d": nbytes / _best(lambda: on_device.copy_(pinned, non_blocking=True), repeats, sync),
        "pageable_d2h": nbytes / _best(lambda: pageable.copy_(on_device), repeats, sync),
        "pageable_h2d": nbytes / _best(lambda: on_device.copy_(pageable), repeats, sync),
        "device_copy": nbytes / _best(lambda: other.copy_(on_device), repeats, sync),
    }
    name = torch.cuda.get_device_name(device)
    del on_device, other, pinned, pageable
    torch.cuda.empty_cache()
    return links, name


def measure(nbytes: int = DEFAULT_BYTES, disk_dir: str | Path | None = None, repeats: int = 3) -> dict:
    """Every link this machine has, measured now (a few seconds at 256 MiB on an H200, most of it disk)."""
    if nbytes < 1:
        raise ValueError("nbytes must be positive")
    directory = Path(disk_dir) if disk_dir else Path(tempfile.gettempdir())
    links, device = _cuda(nbytes, repeats)
    links["host_copy"] = _host_copy(nbytes, repeats)
    links["disk_write"], links["disk_read"] = _disk(nbytes, directory, repeats)
    return {"version": VERSION, "host": host_name(), "measured_at": time.time(), "bytes": int(nbytes),
            "repeats": int(repeats), "device": device, "disk_dir": str(directory.resolve()),
            "links": {k: float(links[k]) for k in LINKS if k in links}}


def measure_in_child(nbytes: int = DEFAULT_BYTES, disk_dir: str | Path | None = None) -> dict:
    """measure() in a child process: its CUDA context (half a GiB on an H200) and buffers go with it,
    instead of staying in the recorder for the whole run, where NVML would count them against the job."""
    package_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    command = [sys.executable, "-m", "miles_profile.calibrate", "--bytes", str(int(nbytes))]
    if disk_dir:
        command += ["--disk-dir", str(disk_dir)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise RuntimeError(f"calibration failed: {last[:300]}")
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    """python -m miles_profile.calibrate [--bytes N] [--disk-dir D]: this machine's links as JSON on stdout."""
    parser = argparse.ArgumentParser(prog="python -m miles_profile.calibrate", description=main.__doc__)
    parser.add_argument("--bytes", type=int, default=DEFAULT_BYTES, help="bytes per copy (default: %(default)s)")
    parser.add_argument("--disk-dir", default=None, help="where the temporary file goes (default: the temp dir)")
    args = parser.parse_args(argv)
    if args.bytes < 1:
        parser.error("--bytes must be positive")
    try:
        print(json.dumps(measure(args.bytes, args.disk_dir)))
    except OSError as exc:
        print(f"miles_profile.calibrate: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _cache_path(cache_dir: str | Path | None) -> Path:
    root = Path(cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "miles_profile")
    return root / f"calibration-{host_name()}.json"


def cached_problem(found: object, wanted_disk_dir: str) -> str | None:
    """Why a cache file's content can't be used here (None: it can). Every link must be a finite
    positive number of bytes per second; a wrong type, NaN or 1e300 is damage, not a measurement."""
    if not isinstance(found, dict):
        return "not a JSON object"
    if found.get("version") != VERSION or found.get("host") != host_name() or found.get("disk_dir") != wanted_disk_dir:
        return ""  # another version, host or disk directory: not ours, measured again without a word
    links = found.get("links")
    if not isinstance(links, dict) or not links:
        return "no links"
    for name, value in links.items():
        if name not in LINKS:
            return f"unknown link {str(name)[:40]!r}"
        if type(value) not in (int, float) or not 0 < value < MAX_BYTES_PER_S:  # NaN and inf fail it too
            return f"link {name} is {json.dumps(value)[:40]}, not a number of bytes/s"
    return None


def _read_cache(path: Path, wanted_disk_dir: str, warn: Callable[[str], None]) -> dict | None:
    """The cached calibration at `path`, or None (with one `warn` line when the file is damaged). Read
    as run files are (logdir/files.py): a FIFO or a link to /dev/zero is refused, never waited on."""
    from miles_profile.logdir.files import read_small
    if not os.path.lexists(path):
        return None
    try:
        found = json.loads(read_small(path, limit=CACHE_MAX_BYTES))
    except (OSError, ValueError, RecursionError, MilesProfileError) as exc:
        warn(f"ignoring the calibration cache {path} ({str(exc)[:200] or type(exc).__name__}); measuring again")
        return None
    problem = cached_problem(found, wanted_disk_dir)
    if problem:
        warn(f"ignoring the calibration cache {path} ({problem}); measuring again")
    return None if problem is not None else found


def _write_cache(path: Path, result: dict) -> None:
    """Atomically (a temporary file renamed over it: a link there is replaced, never followed)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with open(fd, "w") as f:
            f.write(json.dumps(result, indent=1))
        os.replace(tmp, path)
    except OSError:  # a cache that can't be written is measured again next time
        try:
            os.unlink(tmp)
        except OSError:
            pass


def for_this_host(disk_dir: str | Path | None = None, refresh: bool = False, cache_dir: str | Path | None = None,
                  nbytes: int = DEFAULT_BYTES, warn: Callable[[str], None] = lambda line: None) -> dict:
    """This host's calibration: the cached one (per host name, and per disk directory), else measured
    now and cached; `refresh` measures again (a measurement taken under load would be kept for good).
    A cache that can't be read is measured again; a damaged one (a wrong type, a FIFO, a link to
    /dev/zero) is said in one `warn` line first: it is a cache, the job never waits on it."""
    path = _cache_path(cache_dir)
    wanted = str(Path(disk_dir or tempfile.gettempdir()).resolve())
    if not refresh:
        found = _read_cache(path, wanted, warn)
        if found is not None:
            return {**found, "cached": True}
    result = measure_in_child(nbytes, disk_dir)
    _write_cache(path, result)
    return {**result, "cached": False}


def ceilings_of(meta: dict | None) -> dict[str, float]:
    """link -> bytes/s from a run meta's calibration; {} when the run was recorded without one."""
    found = (meta or {}).get(CALIBRATION_KEY)
    if not isinstance(found, dict) or not isinstance(found.get("links"), dict):
        return {}
    return {k: float(v) for k, v in found["links"].items()  # 10**30 (an int numpy can't hold) is dropped too
            if k in LINKS and type(v) in (int, float) and 0 < v < MAX_BYTES_PER_S}  # NaN and inf fail it too


if __name__ == "__main__":
    sys.exit(main())
