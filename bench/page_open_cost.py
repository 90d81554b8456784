"""What opening a page costs the machine in Chromium, as the browser tests open reports: one browser, a fresh
context a page, until the first Plotly figure is drawn; the machine's CPU-seconds (every process: the driver,
the browser, its renderer and GPU processes) and the wall time per page, each file in turn, alternating.

    python bench/page_open_cost.py [REPORT.html ...] [--bundle plotly] [--bundle FILE.js] [--pages 4] [--rounds 2]
    python bench/page_open_cost.py REPORT.html ... --reuse     (also: one page navigated again, and the ratio)

`--bundle plotly` adds a page holding only plotly.py's own plotly.js and one 3-point figure; `--bundle FILE.js`
the same with another build (e.g. npm's plotly.js-cartesian-dist-min of the same version).

`--reuse` measures beside each fresh page one page that goes from report to report, as the tests'
`open_report` (tests/conftest.py WorkerPages) does: the renderer process and V8's compilation of plotly.js
are kept from one report to the next.

Why: the suite's browser tests open reports and dashboards again and again (a full run started 135 Chromium
renderer processes before they took their worker's page, 29 after: docs/benchmarks.md, Round 15), and most
of a report page's cost is Plotly's JavaScript bundle (Round 8): compare a report with a page holding only the
bundle and one small figure.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from scratch_write_cost import busy_s  # the machine's CPU-seconds so far (/proc/stat)

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]  # the tests' (tests/conftest.py)


def bundle_page(bundle: str, folder: Path) -> Path:
    """A page with `bundle` inline (plotly.py's own for "plotly") and one small figure."""
    if bundle == "plotly":
        from plotly.offline import get_plotlyjs
        source, name = get_plotlyjs(), "plotly.py's bundle"
    else:
        source, name = Path(bundle).read_text(), Path(bundle).name
    page = folder / f"only {name}.html".replace("/", "_")
    page.write_text(f'<html><body><script>{source}</script><div id="f"></div>'
                    '<script>Plotly.newPlot("f", [{y: [1, 3, 2]}])</script></body></html>')
    return page


def open_in(page, page_file: Path) -> None:
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(page_file.resolve().as_uri())
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)


def open_in_new_context(browser, page_file: Path) -> None:
    context = browser.new_context()
    open_in(context.new_page(), page_file)
    context.close()


def measure(open_once, count: int) -> tuple[float, float]:
    """Machine CPU-seconds and wall seconds per open."""
    cpu0, t0 = busy_s(), time.monotonic()
    for _ in range(count):
        open_once()
    return (busy_s() - cpu0) / count, (time.monotonic() - t0) / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path, help="HTML files, each with a Plotly figure")
    parser.add_argument("--bundle", action="append", default=[], help="plotly, or a plotly.js file: a page of it alone")
    parser.add_argument("--pages", dest="count", type=int, default=4, help="opens of each file a round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reuse", action="store_true", help="also one page navigated from report to report")
    args = parser.parse_args(argv)
    missing = [str(p) for p in [*args.pages, *(Path(b) for b in args.bundle if b != "plotly")] if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    if not args.pages and not args.bundle:
        parser.error("give a page or a --bundle")
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        args.pages += [bundle_page(b, Path(tmp)) for b in args.bundle]
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        again = browser.new_context().new_page() if args.reuse else None
        for _ in range(args.rounds):
            for page_file in args.pages:
                fresh = measure(lambda: open_in_new_context(browser, page_file), args.count)
                print(f"{page_file.name:40s} {fresh[0]:5.2f} machine CPU-s a page, {fresh[1]:5.2f} s  (new context)",
                      flush=True)
                if again is not None:
                    reused = measure(lambda: open_in(again, page_file), args.count)
                    print(f"{page_file.name:40s} {reused[0]:5.2f} machine CPU-s a page, {reused[1]:5.2f} s  "
                          f"(one page again): {reused[0] / fresh[0]:.2f} of the CPU", flush=True)
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
