"""Dashboard responsiveness on a 10-million-sample log, measured in headless Chromium.

    python bench/bench_dashboard.py [--samples 10000000] [--out bench/out]

Writes the synthetic log (bench/make_synthetic_log.py) once under bench/out/dashboard-logs, starts
`python -m dashboards` on it, waits until the server has preloaded the run, then measures in a fresh
browser page each time:
  * first paint: navigation to the timeline drawn with the whole run;
  * zoom update: `Plotly.relayout` of the x axis to the timeline redrawn from the full data for that
    window (the server re-reduces it), for windows from 30 % down to 0.01 % of the run, and back out.
Targets (issue 5): first paint <= 3 s, zoom update <= 0.5 s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.make_synthetic_log import INTERVAL_S, write_log  # noqa: E402
from dashboards.serve import dashboard_process  # noqa: E402

CHROMIUM = os.environ.get("MILES_PROFILE_CHROMIUM", "/usr/bin/chromium")
GRAPH = "document.querySelector('#timeline-graph .js-plotly-plot')"
SPAN_JS = f"""() => {{ const g = {GRAPH}; if (!g || !g._fullData) return null;
  const d = g._fullData.find(d => d.type === 'scatter' && d.legendgroup !== 'phases' && d.x && d.x.length);
  return d ? [d.x[0], d.x[d.x.length - 1], d.x.length] : null; }}"""
ZOOM_SHARES = (0.3, 0.1, 0.01, 0.001, 0.0001)


def wait_for_preload(stderr_path: Path, timeout_s: float = 300) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in stderr_path.read_text().splitlines():
            if "preloaded" in line:
                return float(line.rsplit(" in ", 1)[1].rstrip(" s"))
        time.sleep(0.2)
    raise RuntimeError("the dashboard did not finish preloading: " + stderr_path.read_text()[-2000:])


def first_paint(browser, url: str, duration_s: float) -> float:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    started = time.perf_counter()
    page.goto(url)
    page.wait_for_function(f"() => {{ const s = ({SPAN_JS})(); return s && s[1] > {duration_s * 0.99}; }}",
                           timeout=60_000, polling="raf")
    elapsed = time.perf_counter() - started
    context.close()
    return elapsed


def zoom_updates(browser, url: str, duration_s: float, artifacts: Path | None) -> list[dict]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(url)
    page.wait_for_function(f"() => {{ const s = ({SPAN_JS})(); return s && s[1] > {duration_s * 0.99}; }}",
                           timeout=60_000)
    results = []
    for k, share in enumerate(ZOOM_SHARES):
        center = duration_s * (0.2 + 0.15 * k)
        lo, hi = center - share * duration_s / 2, center + share * duration_s / 2
        started = time.perf_counter()
        page.evaluate(f"() => Plotly.relayout({GRAPH}, {{'xaxis.range': [{lo}, {hi}]}})")
        near = 0.05 * (hi - lo)  # the new data fills the window (not an older, narrower one inside it)
        page.wait_for_function(f"() => {{ const s = ({SPAN_JS})(); return s && s[0] >= {lo - 1e-6} "
                               f"&& s[1] <= {hi + 1e-6} && s[0] <= {lo + near} && s[1] >= {hi - near}; }}",
                               timeout=30_000, polling="raf")
        elapsed = time.perf_counter() - started
        span = page.evaluate(SPAN_JS)
        results.append({"window_share": share, "window_s": round(hi - lo, 3), "seconds": round(elapsed, 3),
                        "points_drawn_first_trace": span[2],
                        "samples_in_window": int((hi - lo) / INTERVAL_S)})
        if artifacts is not None and share == 0.001:
            page.screenshot(path=str(artifacts / "dashboard-10m-zoomed.png"), full_page=False)
    started = time.perf_counter()
    page.evaluate(f"() => Plotly.relayout({GRAPH}, {{'xaxis.autorange': true}})")
    page.wait_for_function(f"() => {{ const s = ({SPAN_JS})(); return s && s[0] < 1 && s[1] > {duration_s * 0.99}; }}",
                           timeout=30_000, polling="raf")
    results.append({"window_share": 1.0, "window_s": duration_s, "seconds": round(time.perf_counter() - started, 3),
                    "points_drawn_first_trace": page.evaluate(SPAN_JS)[2], "samples_in_window": "all (zoom out)"})
    if artifacts is not None:
        page.screenshot(path=str(artifacts / "dashboard-10m.png"), full_page=False)
    context.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--repeat", type=int, default=3, help="first paints to measure (median reported)")
    args = parser.parse_args(argv)
    logs = args.out / "dashboard-logs"
    run_dir = logs / f"run-synthetic-{args.samples}"
    if not run_dir.exists():
        started = time.perf_counter()
        write_log(run_dir, args.samples)
        print(f"wrote {args.samples:,} samples in {time.perf_counter() - started:.1f} s", flush=True)
    duration_s = (args.samples - 1) * INTERVAL_S
    stderr_path = args.out / "dashboard-server.log"
    from playwright.sync_api import sync_playwright
    with open(stderr_path, "w") as stderr, dashboard_process(logs, stderr=stderr) as url, \
            sync_playwright() as pw:
        preload_s = wait_for_preload(stderr_path)
        print(f"server preloaded the run in {preload_s:.1f} s (read, reduce, checks, table)", flush=True)
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        paints = [first_paint(browser, url, duration_s) for _ in range(args.repeat)]
        zooms = zoom_updates(browser, url, duration_s, args.out)
        browser.close()
    result = {
        "samples": args.samples, "machine": f"{os.cpu_count()} CPU cores, headless Chromium, no GPU",
        "date": time.strftime("%Y-%m-%d"), "server_preload_s": preload_s,
        "first_paint_s": [round(p, 3) for p in paints], "first_paint_median_s": round(statistics.median(paints), 3),
        "zoom_updates": zooms, "zoom_update_max_s": max(z["seconds"] for z in zooms),
        "targets": {"first_paint_s": 3.0, "zoom_update_s": 0.5},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_dashboard.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    ok = result["first_paint_median_s"] <= 3.0 and result["zoom_update_max_s"] <= 0.5
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
