"""python -m dashboards LOG_DIR [--host 127.0.0.1] [--port 8050] [--phase LIST]: the live dashboard over a log directory."""
from __future__ import annotations

import argparse
import gc
import logging
import socket
import sys

from dashboards.hosts import HostPolicy
from miles_profile.errors import MilesProfileError
from miles_profile.phase_select import parse_phases

DEFAULT_HOST = "127.0.0.1"  # local only: the page shows command lines and paths
DEFAULT_PORT = 8050


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dashboards",
        description="Serve a live dashboard of the miles-profile runs under LOG_DIR (a run directory or a "
                    "directory of runs). Runs being recorded update while they are written.")
    parser.add_argument("log_dir", metavar="LOG_DIR", help="e.g. /tmp/memory_logs")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help="address to listen on (default: %(default)s); requests are answered only for the "
                             "loopback names and this one (0.0.0.0: also this machine's name and any IP address)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help="port (default: %(default)s; 0: a free one, printed)")
    parser.add_argument("--poll-ms", type=_positive, default=1000,
                        help="how often the page looks for new runs and samples (default: %(default)s)")
    parser.add_argument("--phase", metavar="LIST",
                        help="show and judge only these phases, as visualize --phase: families offload, onload, "
                             "rollout, all, or phase names, e.g. offload,train,rollout (default: what each run's "
                             "record --phase asked for, else all)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.phase is not None:
            # names a run recorded of its own are accepted in the page; here only what any run may hold
            parse_phases(args.phase)
        port = _check_address(args.host, args.port)
        from dashboards.app import create_app  # dash, plotly, pandas: only once the flags are valid
        app = create_app(args.log_dir, poll_ms=args.poll_ms, hosts=HostPolicy.for_listen_address(args.host),
                         phase_selection=args.phase)
    except MilesProfileError as exc:
        print(f"dashboards: {exc}", file=sys.stderr)
        return exc.exit_code
    # dash, plotly, pandas and the app: 113,000 objects that live as long as the server, left out of
    # the cyclic collector's walks while it serves (9 % of a dashboard process's CPU was that collector)
    gc.freeze()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per poll request
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("dashboards: %(message)s"))
    logging.getLogger("dashboards").addHandler(handler)
    logging.getLogger("dashboards").setLevel(logging.INFO)
    shown = f"[{args.host}]" if ":" in args.host and not args.host.startswith("[") else args.host
    print(f"miles-profile dashboard: http://{shown}:{port}/  (runs under {args.log_dir})", flush=True)
    try:
        app.run(host=args.host, port=port, debug=False)
    except KeyboardInterrupt:
        pass
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _check_address(host: str, port: int) -> int:
    """The port to listen on (port 0: the free one the system picks, so the printed URL is true).
    Fails with a sentence, before the server would exit on its own with a longer one."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
            return probe.getsockname()[1]
    except (OSError, OverflowError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise MilesProfileError(f"cannot listen on {host}:{port}: {reason}") from None


if __name__ == "__main__":
    sys.exit(main())
