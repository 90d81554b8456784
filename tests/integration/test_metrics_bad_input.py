"""The metrics endpoint under bad input, with real sockets and processes: a port in use, a scrape of a
deleted run, a scraper that never reads, prometheus_client missing; no read before a scrape; and
what the exposition imports."""
from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

from miles_profile.metrics import serve
from tests.conftest import REPO, python_env
from tests.metrics_run import HOST, MiB, row, run  # noqa: F401 - run is a fixture


def test_nothing_is_read_until_someone_scrapes_and_a_deleted_run_serves_nothing(run):
    run_dir, samples, _ = run
    row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    server = serve(run_dir, 0, "127.0.0.1", hostname=HOST)
    try:
        time.sleep(0.3)
        assert server.state._processes == {}  # no scrape: the files were not even listed
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read()
        assert b'miles_profile_process_resident_memory_bytes{hostname="metricshost",rank="3",role="actor"}' in body
        shutil.rmtree(run_dir)  # a scrape during shutdown, or of a run someone deleted
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read()
        assert b"miles_profile_kills_total" in body
    finally:
        server.stop()


def test_a_port_in_use_is_one_line_and_no_server(run, caplog):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="miles_profile"):
            assert serve(run[0], port, "127.0.0.1", hostname=HOST) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"miles_profile: warning: metrics not served on port {port}: Address already in use"]


def test_a_scraper_that_never_reads_harms_no_one(run):
    run_dir, samples, _ = run
    row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    server = serve(run_dir, 0, "127.0.0.1", hostname=HOST)
    stuck = []
    try:
        for _ in range(4):  # connections that send half a request, or a whole one, and never read
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" if len(stuck) % 2 else b"GET /metrics HTTP/1.1\r\n\r\n")
            stuck.append(s)
        start = time.monotonic()
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read()
        assert b"miles_profile_process_resident_memory_bytes" in body and time.monotonic() - start < 2
    finally:
        start = time.monotonic()
        server.stop()
        assert time.monotonic() - start < 2
        for s in stuck:
            s.close()


def test_without_prometheus_client_one_line_and_the_job_goes_on(tmp_path):
    code = ("import sys; sys.modules['prometheus_client'] = None\n"
            "from miles_profile.metrics import serve\n"
            f"print(serve({str(tmp_path)!r}, 0))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=python_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout == "None\n"
    assert done.stderr.splitlines() == ["miles_profile: warning: --metrics-port ignored: prometheus_client is not "
                                        "installed (pip install prometheus-client)"]


def test_record_with_a_port_in_use_runs_the_job_and_says_so_once(tmp_path):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path / "logs"),
                               "--metrics-port", str(port), "--exec", "--", sys.executable, "-c", "print('job ran')"],
                              cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "job ran\n"
    assert [line for line in done.stderr.splitlines() if "metrics" in line] == [
        f"miles_profile: warning: metrics not served on port {port}: Address already in use"]


def test_the_exposition_imports_only_the_recorder_and_log_format_layers():
    """It runs in `record` on GPU hosts: no plotly, dash or pandas, and nothing of the report or verdicts."""
    code = ("import sys, miles_profile.metrics, miles_profile.metrics.families\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('plotly', 'dash', 'pandas')"
            " or m.startswith(('miles_profile.report', 'miles_profile.verdicts', 'miles_profile.dashboards'))))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=python_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout == "[]\n", done.stderr


def test_a_per_node_sampler_serves_the_port_record_was_given(run, monkeypatch):
    run_dir = run[0]
    monkeypatch.delenv("MILES_PROFILE_METRICS_PORT", raising=False)
    from miles_profile.metrics import serve_from_env
    assert serve_from_env(run_dir, hostname=HOST) is None  # no port asked for: nothing, silently
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MILES_PROFILE_METRICS_PORT", str(port))
    server = serve_from_env(run_dir, hostname=HOST)
    try:
        assert server.port == port
        assert b"miles_profile_kills_total" in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        server.stop()
