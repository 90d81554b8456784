"""The only way a name from the browser becomes a path: an allow-list of runs under one directory.

A run id is the name of a run directory directly under the root (or the root's own name when the
root is itself a run). Anything else the browser sends, `../x`, `/etc`, a name with a separator, a
non-string, a directory that is a link out of the root, is refused before any file is opened. A
run whose files include a link pointing out of the root is refused as a whole.
"""
from __future__ import annotations

import os
from pathlib import Path

from miles_profile.errors import MilesProfileError
from miles_profile.logdir.layout import RUN_META, is_run_dir

MAX_RUN_ID = 255


class LogRoot:
    """The directory given on the command line, resolved once."""

    def __init__(self, path: str | os.PathLike):
        given = Path(path)
        if not given.is_dir():
            raise MilesProfileError(f"{given}: not a directory")
        self.path = Path(os.path.realpath(given))

    def contains(self, path: Path) -> bool:
        """True when `path`, links resolved, lies under the root."""
        real = os.path.realpath(path)
        return real == str(self.path) or real.startswith(str(self.path) + os.sep)

    def run_dirs(self) -> dict[str, Path]:
        """Run id -> run directory, for every run under the root that stays inside it."""
        if is_run_dir(self.path):
            return {self.path.name: self.path}
        found = {}
        try:
            entries = list(os.scandir(self.path))
        except OSError:
            return {}
        for entry in entries:
            path = Path(entry.path)
            try:
                if entry.is_dir() and self.contains(path) and is_run_dir(path) and self.contains(path / RUN_META):
                    found[entry.name] = path
            except OSError:
                continue
        return found

    def resolve(self, run_id: object) -> Path:
        """The run directory for `run_id`, or MilesProfileError. Never a path outside the root."""
        if not isinstance(run_id, str) or not run_id or len(run_id) > MAX_RUN_ID:
            raise MilesProfileError("no such run")
        if "/" in run_id or "\\" in run_id or "\0" in run_id or run_id in (".", ".."):
            raise MilesProfileError(f"no such run: {run_id!r}")
        run_dir = self.run_dirs().get(run_id)
        if run_dir is None:
            raise MilesProfileError(f"no such run: {run_id!r}")
        self.check_files(run_dir)
        return run_dir

    def check_files(self, run_dir: Path) -> None:
        """Refuse a run that holds a link to anything outside the root (the reader would follow it)."""
        try:
            entries = list(os.scandir(run_dir))
        except OSError as exc:
            raise MilesProfileError(f"{run_dir.name}: unreadable ({exc.strerror})") from None
        for entry in entries:
            if entry.is_symlink() and not self.contains(Path(entry.path)):
                raise MilesProfileError(
                    f"{run_dir.name}: {entry.name} links outside the log directory; run not shown")
