"""Retake the dashboard screenshots of the README and docs at 1500x1000 in headless Chromium.

    python scripts/docs_screenshots.py [--out bench/out] [--only fleet|10m] [--samples 10000000]

  fleet  docs/img/dashboard-fleet.png: the fleet view of 64 hosts x 8 GPUs x (actor, engine)
         (bench/make_fleet_log.py, as bench/bench_dashboard_fleet.py writes it), the hottest train phase
         opened from the outliers, the page scrolled to the fleet panel
  10m    docs/img/dashboard-10m-zoomed.png: 200 s of the 10-million-sample log
         (bench/make_synthetic_log.py, as bench/bench_dashboard.py writes it), re-reduced from the full data

The logs are written once under --out and reused. The benchmarks measure; this only photographs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_dashboard import GRAPH, SPAN_JS  # noqa: E402
from bench.make_fleet_log import write_fleet_run  # noqa: E402
from bench.make_synthetic_log import INTERVAL_S, write_log  # noqa: E402
from dashboards.serve import dashboard_process  # noqa: E402

CHROMIUM = os.environ.get("MILES_PROFILE_CHROMIUM", "/usr/bin/chromium")
VIEWPORT = {"width": 1500, "height": 1000}
HEATMAP = "document.querySelector('#fleet-heatmap .js-plotly-plot')"
GPU = "document.querySelector('#fleet-gpu-graph .js-plotly-plot')"


def fleet(pw, out: Path, png: Path) -> None:
    logs = out / "fleet-logs-64x8-3min"
    if not (logs / "run-fleet" / "meta.json").exists():
        write_fleet_run(logs / "run-fleet", 64, 8, 3.0)
    stderr_path = out / "docs-screenshots-fleet.log"
    with open(stderr_path, "w") as stderr, dashboard_process(logs, stderr=stderr, timeout_s=120) as url:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(url)  # the page waits for the server's read (minutes on a loaded 2-core machine)
        page.wait_for_function(f"() => {{ const g = {HEATMAP}; return g && g._fullData && g._fullData.length "
                               "&& g._fullData[0].y.length === 512; }", timeout=1_500_000, polling=2000)
        # clicked once the page is idle (its default lanes drawn), as bench_dashboard_fleet.py does
        page.wait_for_function("() => document.querySelectorAll('#fleet-lanes .js-plotly-plot').length === 8",
                               timeout=600_000, polling=2000)
        page.wait_for_timeout(3000)
        page.locator(".fleet-outlier:has-text('train')").first.click()
        page.wait_for_function(f"() => {{ const g = {GPU}; return g && g.data && g.data.length; }}", timeout=600_000,
                               polling=1000)
        page.wait_for_timeout(2000)
        page.evaluate("() => document.querySelector('#fleet-panel').scrollIntoView({block: 'start'})")
        page.mouse.move(5, 995)  # off the outliers: no hover outline in the picture
        page.wait_for_timeout(500)
        page.screenshot(path=str(png), full_page=False)
        browser.close()


def zoomed(pw, out: Path, png: Path, samples: int) -> None:
    logs = out / "dashboard-logs"
    run_dir = logs / f"run-synthetic-{samples}"
    if not run_dir.exists():
        write_log(run_dir, samples)
    duration = (samples - 1) * INTERVAL_S
    stderr_path = out / "docs-screenshots-10m.log"
    with open(stderr_path, "w") as stderr, dashboard_process(logs, stderr=stderr, timeout_s=120) as url:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(url)
        page.wait_for_function(f"() => {{ const s = ({SPAN_JS})(); return s && s[1] > {duration * 0.99}; }}",
                               timeout=1_500_000, polling=2000)
        page.wait_for_timeout(5000)  # the page's first callbacks (checks, tables) settle before the zoom
        lo = duration * 0.5 - 100
        hi = lo + 200  # 200 s: the window bench_dashboard.py photographs (0.1% of the run)
        page.evaluate(f"() => Plotly.relayout({GRAPH}, {{'xaxis.range': [{lo}, {hi}]}})")
        near = 0.05 * (hi - lo)
        page.wait_for_function(f"() => {{ const s = ({SPAN_JS})(); return s && s[0] >= {lo - 1e-6} && s[1] <= {hi + 1e-6} "
                               f"&& s[0] <= {lo + near} && s[1] >= {hi - near}; }}", timeout=900_000, polling=1000)
        page.wait_for_timeout(1500)
        page.evaluate("() => document.querySelector('.panel.timeline').scrollIntoView({block: 'start'})")
        page.wait_for_timeout(500)
        page.screenshot(path=str(png), full_page=False)
        browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--only", choices=("fleet", "10m"))
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--img", type=Path, default=REPO / "docs" / "img")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        for name, take in (("fleet", lambda: fleet(pw, args.out, args.img / "dashboard-fleet.png")),
                           ("10m", lambda: zoomed(pw, args.out, args.img / "dashboard-10m-zoomed.png", args.samples))):
            if args.only in (None, name):
                started = time.perf_counter()
                take()
                print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
