"""Every view renders the one verdict (verdicts/engine.py), checked in real Chromium on real recordings
with planted failures: the dashboard's checks panel lists the same checks with the same statuses as
visualize --json, on a one-process run and a two-process (fleet) run, and the HTML report's header
says what the exit code says, a failing --baseline gate included.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from dashboards.serve import dashboard_process
from tests.conftest import REPO, python_env

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# One process: 3 rounds of generate -> offload_rollout -> train. MODE keep: the offload keeps a
# reference to the KV cache (the planted defect: offload_drop fails); free: it frees it inside.
PROCESS = """
import sys, time
import miles_profile as mp
mode, mib = sys.argv[1], int(sys.argv[2])
MiB = 1024 ** 2
kept = []
for rollout_id in range(3):
    with mp.phase("generate", rollout_id=rollout_id):
        kv_cache = bytearray(mib * MiB)
        time.sleep(0.2)
    with mp.phase("offload_rollout", rollout_id=rollout_id, tags=["kv_cache"], expected_bytes=len(kv_cache)):
        if mode == "keep":
            kept.append(kv_cache)
        del kv_cache
    with mp.phase("train", rollout_id=rollout_id):
        time.sleep(0.2)
"""
# Two ranks, each a process of its own with phases (a fleet run): rank 1 keeps its KV cache.
FLEET = """
import os, subprocess, sys
process = sys.argv[1]
children = [subprocess.Popen([sys.executable, process, mode, "128"],
                             env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                                  "MILES_PROFILE_ROLE": "actor"}) for rank, mode in ((0, "free"), (1, "keep"))]
sys.exit(max(child.wait() for child in children))
"""
CHECKS_JS = """() => Array.from(document.querySelectorAll('#checks-list .checks-item')).map(item =>
  [item.querySelector('.checks-name').dataset.check, item.querySelector('.badge').dataset.status])"""


def _record(log_dir: Path, *command: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "miles_profile.record", "--log-dir", str(log_dir), "--heap", "--exec", "--",
                             sys.executable, *command], cwd=REPO, env=python_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """{"single", "fleet", "big", "small"}: each its run directory (big/small: healthy, 128 and 32 MiB)."""
    root = tmp_path_factory.mktemp("views_agree")
    process, fleet = root / "process.py", root / "fleet.py"
    process.write_text(PROCESS)
    fleet.write_text(FLEET)
    jobs = {"single": _record(root / "dashboard", str(process), "keep", "128"),
            "fleet": _record(root / "fleet", str(fleet), str(process)),
            "big": _record(root / "big", str(process), "free", "128"),
            "small": _record(root / "small", str(process), "free", "32")}
    for child in jobs.values():
        assert child.wait(timeout=120) == 0
    found = {name: sorted((root / ("dashboard" if name == "single" else name)).glob("run-*")) for name in jobs}
    assert all(len(dirs) == 1 for dirs in found.values()), found
    # the dashboard lists one log root: the fleet run moves in beside the one-process run
    fleet_dir = found["fleet"][0].rename(root / "dashboard" / found["fleet"][0].name)
    return {**{name: dirs[0] for name, dirs in found.items()}, "fleet": fleet_dir}


def visualize(run: Path, out: Path, *args: str) -> tuple[int, dict, str]:
    """(exit code, the --json document, the HTML header's overall status) of one visualize call."""
    json_path, html_path = out.with_suffix(".json"), out.with_suffix(".html")
    done = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(run), "-o", str(html_path),
                           "--json", str(json_path), *args], cwd=REPO, env=python_env(), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(json_path.read_text()), html_path.read_text()


def header_status(open_report, html_path: Path) -> str:
    page, _, _ = open_report(html_path)
    return page.locator("#overall").get_attribute("data-status")


@pytest.fixture(scope="module")
def page(browser, runs, tmp_path_factory):
    stderr_path = tmp_path_factory.mktemp("views_agree_server") / "stderr.txt"
    with open(stderr_path, "w") as stderr, dashboard_process(runs["single"].parent, stderr=stderr) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        page.goto(url)
        yield page
        context.close()
    assert "Traceback" not in stderr_path.read_text()


def dashboard_checks(page, run_id: str, expected: list) -> list[tuple[str, str]]:
    """The (name, status) pairs the checks panel lists for `run_id`, once it shows `expected`'s count
    for that run (or after 30 s: then whatever it shows, for the assertion to name the difference)."""
    page.click(f"#runs-list button:has(.runs-id:text-is('{run_id}'))")
    page.wait_for_selector(f".runs-item-selected .runs-id:text-is('{run_id}')")
    want = json.dumps(sorted(map(list, expected)))
    with contextlib.suppress(PlaywrightTimeout):  # the assertion below says what differs
        page.wait_for_function(f"() => JSON.stringify(({CHECKS_JS})().sort()) === JSON.stringify({want})",
                               timeout=30_000)
    return [tuple(x) for x in page.evaluate(CHECKS_JS)]


@pytest.mark.parametrize("which", ["single", "fleet"])
def test_dashboard_checks_equal_visualize_json(page, runs, which, tmp_path, open_report):
    code, data, _ = visualize(runs[which], tmp_path / "report")
    (run,) = data["runs"]
    expected = [(c["name"], c["status"]) for c in run["checks"]]
    assert code == data["exit_code"] == run["exit_code"] == 1 and data["status"] == run["status"] == "fail"
    assert ("offload_drop", "fail") in expected  # the planted defect is found
    if which == "fleet":
        assert {"rank_imbalance", "floor_trend_leak", "serialized_peaks_per_gpu"} <= {n for n, _ in expected}
    shown = dashboard_checks(page, runs[which].name, expected)
    assert sorted(shown) == sorted(expected)
    assert shown[0][1] == "fail"  # failures first
    assert header_status(open_report, tmp_path / "report.html") == "fail"


def test_html_header_is_the_exit_code_with_a_failing_gate(runs, tmp_path, open_report):
    code, data, _ = visualize(runs["big"], tmp_path / "alone")
    assert code == 0 and data["status"] != "fail"
    assert header_status(open_report, tmp_path / "alone.html") == data["status"]
    # 128 MiB against 32 MiB: +300%, over 5% and 0 bytes; the checks themselves still pass
    code, data, _ = visualize(runs["big"], tmp_path / "gated", "--baseline", str(runs["small"]),
                              "--baseline-threshold", "5%,0")
    (run,) = data["runs"]
    assert all(c["status"] != "fail" for c in run["checks"])
    assert code == 1 and data["exit_code"] == 1 and run["gates"][0]["status"] == "fail"
    assert run["baseline"]["status"] == "fail"  # the key CI scripts read is kept
    assert header_status(open_report, tmp_path / "gated.html") == "fail"
