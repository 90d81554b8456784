"""What opening the dashboard costs the machine in Chromium with the cartesian plotly.js build it serves
(dashboards/plotly_js.py) against Dash's own loading of plotly.py's 4.8 MB bundle (what a missing vendored
build falls back to), side by side: one browser, a fresh context a page, until every figure of the page is
drawn; the machine's CPU-seconds (every process: the two servers, the driver, the browser) and the wall time
per page, the two servers in turn.

    python bench/dashboard_open_cost.py [LOG_DIR] [--pages 4] [--rounds 3]     (default: sample_logs/cpu)
"""
from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from page_open_cost import ARGS, CHROMIUM  # noqa: E402 - the tests' Chromium flags
from scratch_write_cost import busy_s  # noqa: E402

from dashboards.serve import REPO, dashboard_process  # noqa: E402

# The fallback: the app made with no usable vendored build, so Dash loads plotly.py's bundle itself.
WITHOUT_BUILD = ("import sys; from pathlib import Path; from miles_profile.report import plotly_bundle; "
                 "plotly_bundle.CARTESIAN_BUILD = Path('/nonexistent/plotly.js'); "
                 "from dashboards.__main__ import main; sys.exit(main(sys.argv[1:]))")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log_dir", nargs="?", type=Path, default=REPO / "sample_logs" / "cpu")
    parser.add_argument("--pages", type=int, default=4, help="opens of each server a round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not args.log_dir.is_dir():
        parser.error(f"no such directory: {args.log_dir}")
    from playwright.sync_api import sync_playwright
    with contextlib.ExitStack() as stack, sync_playwright() as pw:
        quiet = subprocess.DEVNULL
        servers = {"cartesian build (served)": stack.enter_context(dashboard_process(args.log_dir, stderr=quiet)),
                   "Dash's plotly.py bundle": stack.enter_context(
                       dashboard_process(args.log_dir, stderr=quiet, python_args=["-c", WITHOUT_BUILD]))}
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        figures = {}
        for k in range(args.rounds):
            for name, url in (servers.items() if k % 2 == 0 else reversed(servers.items())):
                cpu0, t0 = busy_s(), time.monotonic()
                for _ in range(args.pages):
                    context = browser.new_context(viewport={"width": 1440, "height": 900})
                    page = context.new_page()
                    fetched: list[str] = []
                    page.on("request", lambda r, fetched=fetched: fetched.append(r.url))
                    page.goto(url)
                    page.wait_for_function("() => { const g = document.querySelectorAll('.js-plotly-plot');"
                                           " return g.length >= 3 && Array.from(g).every(d => d._fullLayout); }",
                                           timeout=60_000)
                    figures[name] = (page.evaluate("document.querySelectorAll('.js-plotly-plot').length"),
                                     next((u.rsplit("/", 1)[1] for u in fetched if "plotly" in u.rsplit("/", 1)[1]), "?"))
                    context.close()
                print(f"{name:28s} {(busy_s() - cpu0) / args.pages:5.2f} machine CPU-s a page, "
                      f"{(time.monotonic() - t0) / args.pages:5.2f} s", flush=True)
        for name, (count, script) in figures.items():
            print(f"{name}: {count} figures drawn, plotly.js from {script}")
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
