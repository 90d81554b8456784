"""python -m trainer.launch <torchrun arguments>: torchrun, dying with its parent and stopping in one line.

What `record -- --nproc-per-node N ...` runs. What torchrun does not do:
- its ranks die with it (PR_SET_PDEATHSIG, trainer/dist.py), as it dies with `record` (which starts
  it so) and each engine server with its rank: a `kill -9` of any leaves nothing behind;
- Ctrl-C or SIGTERM ends with 130 / 143 and one line, not exit 1 and a traceback per process: the
  ranks, told by a file this launcher creates that the stop was asked for, stop without a word;
- a rank that fails ends the launch with exit 1 and one line naming it (torchrun raises its
  ChildFailedError, a traceback and a block of its own, after the rank has said why).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from trainer.dist import LAUNCHER_PID_ENV, STOP_FILE_ENV


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # torch.distributed takes seconds to import: only once the launch is really run
    from trainer import gc_startup
    gc_startup.defer_collections()  # torch's import: 175,000 lasting objects (trainer/gc_startup.py)
    from torch.distributed.elastic.multiprocessing import api as elastic_api
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main
    gc_startup.freeze_imports()

    with tempfile.TemporaryDirectory(prefix="trainer-launch-") as workdir:
        stop_file = Path(workdir) / "stopped"
        os.environ[STOP_FILE_ENV] = str(stop_file)
        os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
        _mark_stops(elastic_api, stop_file)
        _quiet_elastic_warnings()
        if not any(a.split("=")[0] in ("--log-dir", "--log_dir", "--logs-specs", "--logs_specs") for a in argv):
            # else torchrun leaves a /tmp/torchelastic_* directory behind on every run
            argv = ["--log-dir", str(Path(workdir) / "torchrun"), *argv]
        try:
            torchrun_main(argv)
        except elastic_api.SignalException as exc:
            signum = int(exc.sigval)
            print(f"trainer: stopped by {signal.Signals(signum).name}; every rank stopped", file=sys.stderr,
                  flush=True)
            return 128 + signum
        except ChildFailedError as exc:  # the first to fail; the others were stopped because of it
            print(f"trainer: {failed_rank(*exc.get_first_failure())}; every rank stopped", file=sys.stderr, flush=True)
            return 1
    return 0


def failed_rank(rank: int, failure) -> str:
    """A torchrun failure (its global rank, its ProcessFailure) in words: "rank 1 exited with code 1"."""
    if failure.exitcode >= 0:
        return f"rank {rank} exited with code {failure.exitcode}"
    try:
        return f"rank {rank} was killed by {signal.Signals(-failure.exitcode).name}"
    except ValueError:
        return f"rank {rank} was killed by signal {-failure.exitcode}"


def _quiet_elastic_warnings() -> None:
    """Its warnings while stopping ("Received 2 death signal", "Sending process ... closing signal")
    are not the user's news; its errors (a rank failed) still are. Each of its loggers has a level of
    its own (torch's get_logger), set at import, so each is lowered after torchrun is imported."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.ERROR)


def _mark_stops(elastic_api, stop_file: Path) -> None:
    """torchrun turns SIGINT/SIGTERM/SIGHUP/SIGQUIT into SignalException, then SIGTERMs the ranks:
    the stop file exists before they get it, so they know it was asked for (not a peer's failure)."""
    original = elastic_api._terminate_process_handler

    def terminate(signum, frame):
        stop_file.touch()
        original(signum, frame)

    elastic_api._terminate_process_handler = terminate  # read when torchrun registers its handlers


if __name__ == "__main__":
    sys.exit(main())
