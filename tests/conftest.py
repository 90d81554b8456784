"""Shared fixtures. Browser tests use Debian's Chromium through Playwright (no browser download)."""
from __future__ import annotations

import fcntl
import gc
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# CI runs the same examples every time (a failure there is reproducible, never a new random draw);
# a developer's run keeps exploring new ones. .ci/run sets HYPOTHESIS_PROFILE=ci.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# OpenMP's threads (torch's intra-op pool) spin after each parallel region by default: with two xdist
# workers each running torch programs on two cores, the spinning threads took most of the CPU (the README's
# quick start beside other work: 93 CPU-s and 110 s, against 26 CPU-s and 37 s with waiting threads asleep).
# Set before any torch import: this process, every subprocess and every Ray node inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# numpy's OpenBLAS starts a thread per core when it loads, and they spin before they sleep: 0.09 CPU-s of
# every process that imports numpy (`python -c "import numpy"`: 0.20 against 0.115 CPU-s with one thread),
# and the suite starts hundreds. Nothing the tests run multiplies numpy matrices large enough to want two.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("MILES_PROFILE_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = REPO / "artifacts"  # screenshots saved by browser tests (git-ignored)


def python_env() -> dict[str, str]:
    """Environment for subprocesses that run the project from source."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def ram_dir(tmp_path) -> Path:
    """A directory on tmpfs for a test whose program writes GiBs it throws away (a disk offload, a disk
    calibration), removed after the test; `tmp_path` where there is no /dev/shm. On the suite's VM a GiB
    written to ext4 costs 0.3 to 7.5 CPU-s of kernel time, 3.3 to 3.7 on average, on tmpfs about 0.4
    (bench/scratch_write_cost.py). What such a test checks is the program's behaviour, not the disk's."""
    import tempfile
    try:
        path = Path(tempfile.mkdtemp(prefix="miles-test-", dir="/dev/shm"))
    except OSError:
        yield tmp_path
        return
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def py() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium. In CI (.ci/run installs chromium) a missing browser is a failure, not a skip."""
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        if os.environ.get("CI"):
            pytest.fail(f"Chromium not found at {CHROMIUM}")
        pytest.skip(f"Chromium not found at {CHROMIUM}")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield chromium
        chromium.close()


class WorkerPages:
    """Chromium pages that a test worker's browser tests take in turn, one per kind: a report read offline
    (`open_report`) and a dashboard (`dashboard_page`). A new page costs a renderer process and compiling
    plotly.js again: a report load used 2.4 to 2.7 CPU-s of the machine in a new context, 0.7 to 1.4 in a
    page navigated again (V8's compilation cache lives in the renderer; `bench/page_open_cost.py --reuse`),
    and the browser tests 281 -> 240 CPU-s (bench/tests_cpu_ab.py). A test that adds listeners or routes of
    its own takes a page of its own; a module that keeps one page for its tests makes its own WorkerPages."""

    def __init__(self, browser):
        self.context = browser.new_context()
        self.pages: dict[str, object] = {}
        self.requests: list[str] = []  # the current report's attempts to reach the network (aborted)
        self.errors: list[str] = []    # and its uncaught JavaScript errors

    def page(self, kind: str, viewport: dict):
        page = self.pages.get(kind)
        if page is None or page.is_closed():
            page = self.pages[kind] = self.context.new_page()
            if kind == "report":  # a report must not need the network
                page.route("http://*/**", self._block)
                page.route("https://*/**", self._block)
                page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.set_viewport_size(viewport)
        return page

    def open_report(self, html_path, width: int = 1400, height: int = 900):
        """(page, requests, errors): the report drawn in the report page, offline; `requests` lists what it
        tried to fetch (aborted), `errors` its uncaught JavaScript errors."""
        page = self.page("report", {"width": width, "height": height})
        self.requests.clear()
        self.errors.clear()
        page.goto(Path(html_path).as_uri())
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
        return page, self.requests, self.errors

    def _block(self, route):
        self.requests.append(route.request.url)
        route.abort()

    def release(self, kind: str) -> None:
        """After a test: its page blank (a dashboard stops polling; the renderer stays for the next test)."""
        page = self.pages.get(kind)
        if page is not None and not page.is_closed():
            try:
                page.goto("about:blank")
            except Exception:  # a page the test broke: the next test gets a new one
                page.close()


def table_cells(page, table: str, cells: str = "th, td") -> list[list[str]]:
    """The text of the `cells` of every body row of the HTML table at CSS selector `table`, rows with none left
    out (`cells="td"`: a Dash DataTable, whose header row sits in its body as `th`)."""
    return page.evaluate("([sel, cells]) => [...document.querySelectorAll(sel + ' tbody tr')]"
                         ".map(tr => [...tr.querySelectorAll(cells)].map(c => c.innerText.trim()))"
                         ".filter(r => r.length)", [table, cells])


@pytest.fixture(scope="session")
def worker_pages(browser):
    pages = WorkerPages(browser)
    yield pages
    pages.context.close()


@pytest.fixture
def open_report(worker_pages):
    """open_report(html_path, width=1400, height=900) -> (page, requests, errors): WorkerPages.open_report."""
    yield worker_pages.open_report
    worker_pages.release("report")


@pytest.fixture
def dashboard_page(worker_pages):
    """dashboard_page(viewport) -> this worker's dashboard page at that size (the test navigates it)."""
    yield lambda viewport: worker_pages.page("dashboard", viewport)
    worker_pages.release("dashboard")


def pytest_configure(config):
    """Children of the tests get the signal dispositions of a terminal's foreground job. A suite started
    in the background (`nohup`, `cmd &` in a script) inherits SIGINT, SIGQUIT or SIGHUP ignored, and an
    ignored signal stays ignored across exec: every Ctrl-C and signal test would then time out."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


def pytest_collection_finish(session):
    """What collection made (the test modules and what they import: pandas, plotly, torch, about 300,000
    objects) lives as long as the session: out of every walk of the cyclic collector, which walked it again
    and again for no garbage (8 to 28 % of a worker's CPU in the full suite, bench/suite_perf.py)."""
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Grouping and order for the parallel suite (`make test` runs pytest-xdist with `--dist loadgroup`).
    Tests that share a module-scoped fixture (a recorded run, a dashboard server) stay on one worker, so
    the fixture is built once, not once per worker; the slow end-to-end tests run after the fast ones, so
    a broken unit shows within the first minute, the slow groups largest first."""
    group_size: dict[str, int] = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info and any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
            group_size[item.module.__name__] = group_size.get(item.module.__name__, 0) + 1

    def order(item) -> tuple[bool, int]:
        # Among the slow tests, the largest groups first (one worker runs a group from start to end): started
        # last, a group of eight cluster tests kept one core busy for minutes while the other had nothing left.
        slow = item.get_closest_marker("slow") is not None
        grouped = item.get_closest_marker("xdist_group") is not None
        return slow, -group_size.get(item.module.__name__, 0) if slow and grouped else 0

    items.sort(key=order)  # stable: the rest keep their order
    yield  # xdist's own hook turns the marks into the node ids its scheduler reads
    if getattr(config.option, "loadgroup", False):  # set by xdist on its workers, where collection runs
        for item in items:
            keep_in_group(item)


def keep_in_group(item) -> None:
    """xdist's loadgroup scheduler reads a test's group from a `@group` suffix of its node id, which xdist's
    hook writes to `item._nodeid`; pytest 9.2 reads the id from `item._id`, so that write was lost and
    every group was split over both workers, each building the module's fixtures (two Ray clusters, two
    Prometheus servers, every shared recorded run twice). Written here where xdist's write did not take."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None or "@" in item.nodeid:
        return
    item._id = type(item.id).parse(f"{item.nodeid}@{mark.args[0]}")


def shared_across_workers(tmp_path_factory) -> Path:
    """A directory every pytest-xdist worker of this session sees (the session's own otherwise)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def record_once(tmp_path_factory, name: str, trainer_args: list[str],
                record_flags: tuple[str, ...] = ()) -> Path:
    """The log dir of `python -m miles_profile.record <record_flags> -- <trainer_args>`, recorded once per
    session by whichever pytest-xdist worker asks first (the others wait on a lock), for tests that only read
    it (or copy it first)."""
    shared = shared_across_workers(tmp_path_factory)
    log_dir, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait here until it is recorded
        if not done.exists():
            shutil.rmtree(log_dir, ignore_errors=True)  # a half-recorded run of a worker that died
            log_dir.mkdir()
            subprocess.run([sys.executable, "-m", "miles_profile.record", *record_flags, "--log-dir", str(log_dir),
                            "--", *trainer_args],
                           cwd=REPO, env=python_env(), check=True, capture_output=True, timeout=300)
            done.touch()
    return log_dir


@pytest.fixture(scope="session")
def h200_report(tmp_path_factory) -> Path:
    """The report of the nine committed H200 runs (`visualize sample_logs/h200 --no-check`, ~7 CPU-s), written
    once per session by whichever worker asks first and opened read-only by the browser tests of its comparison."""
    shared = shared_across_workers(tmp_path_factory)
    out, done = shared / "h200-report" / "h200.html", shared / "h200-report.done"
    with open(shared / "h200-report.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            from miles_profile.visualize import main  # here: most sessions never need the report's imports
            out.parent.mkdir(exist_ok=True)
            assert main([str(REPO / "sample_logs" / "h200"), "-o", str(out), "--no-check"]) == 0
            done.touch()
    return out


@pytest.fixture(scope="session")
def recorded_cpu_run(tmp_path_factory) -> Path:
    """One recorded CPU trainer run with both offloads (~15 s to record), shared read-only."""
    return record_once(tmp_path_factory, "recorded-cpu-run",
                       ["--preset", "cpu", "--num-rollout", "2", "--offload-train", "--offload-rollout"])


@pytest.fixture(scope="session")
def recorded_two_rank_run(tmp_path_factory) -> Path:
    """One recorded two-rank run (torchrun under `record -- --nproc-per-node 2`: 2 ranks, 2 engine servers,
    5 processes importing torch, ~20 s on 2 cores), shared read-only by the tests that judge or load it."""
    return record_once(tmp_path_factory, "recorded-two-rank-run",
                       ["--nproc-per-node", "2", "--preset", "tiny", "--num-rollout", "2"])


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
