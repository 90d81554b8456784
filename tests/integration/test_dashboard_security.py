"""Whatever the browser sends, the server reads nothing outside the log directory and answers with a
message, never a traceback. Requests are made the way the page makes them, straight to the server."""
from __future__ import annotations

import http.client
import json
import os
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from dashboards.serve import dashboard_process

SECRET = "SECRET-7f3a"


def make_run(run_dir: Path, command: str, rss: int) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(json.dumps({"format_version": 1, "start_time": 1000.0, "command": [command]}))
    (run_dir / "h-1.meta.json").write_text(json.dumps({"format_version": 1, "pid": 1, "end_time": 1001.0}))
    (run_dir / "h-1.samples.csv").write_text(f"t,phase,rss,rss_peak\n1000.0,,{rss},{rss}\n1000.5,,{rss},{rss}\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("security")
    logs = base / "logs"
    make_run(logs / "run-ok", "ordinary", 1 << 20)
    outside = base / "outside-run"
    make_run(outside, SECRET, 777_777_777)
    os.symlink(outside, logs / "linked-out")                  # a run directory that is a link out
    make_run(logs / "run-with-link", "has a link", 1 << 20)
    os.symlink(outside / "h-1.samples.csv", logs / "run-with-link" / "h-2.samples.csv")
    (base / "secret.txt").write_text(SECRET)
    stderr_path = base / "stderr.txt"
    with open(stderr_path, "w") as stderr, dashboard_process(logs, stderr=stderr) as url:
        yield url, outside, base
    log = stderr_path.read_text()
    assert "Traceback" not in log and SECRET not in log, log


def dependencies(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "_dash-dependencies") as response:
        return json.load(response)


def call(url: str, output_prefix: str, values: dict[str, object]) -> tuple[int, str]:
    """POST the callback whose output starts with `output_prefix`, inputs from `values` ('id.prop')."""
    callback = next(c for c in dependencies(url) if c["output"].lstrip(".").startswith(output_prefix))

    def arg(spec):
        if isinstance(spec["id"], dict):  # pattern-matching (ALL): no components
            return []
        return {**spec, "value": values.get(f"{spec['id']}.{spec['property']}")}

    outputs = [dict(zip(("id", "property"), o.rsplit(".", 1))) for o in callback["output"].strip(".").split("...")]
    body = {"output": callback["output"], "outputs": outputs if len(outputs) > 1 else outputs[0],
            "inputs": [arg(s) for s in callback["inputs"]], "state": [arg(s) for s in callback["state"]],
            "changedPropIds": [f"{callback['inputs'][0]['id']}.{callback['inputs'][0]['property']}"]}
    request = urllib.request.Request(url + "_dash-update-component", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


ATTACKS = ["../outside-run", "..", "/", "run-ok/../../outside-run", "linked-out", "run-with-link", "%2e%2e",
           "run-ok/", "run-ok\0", "", ["run-ok"], {"id": "run-ok"}, 12, True]


@pytest.mark.parametrize("run_id", ATTACKS, ids=repr)
def test_a_run_id_from_the_browser_never_escapes_the_log_directory(setup, run_id):
    url, outside, _ = setup
    attacks = [("timeline-graph.figure", {"runs-selected.data": run_id}),
               ("checks-list.children", {"runs-selected.data": run_id}),
               ("phases-table.children", {"runs-selected.data": run_id}),
               ("ledger-graph.figure", {"runs-selected.data": run_id}),
               ("compare-note.children", {"compare-runs.value": ["run-ok", run_id]})]
    for output, values in attacks:
        status, text = call(url, output, values)
        assert status in (200, 204), (output, status, text[:300])
        assert SECRET not in text and "777777777" not in text and str(outside) not in text
        if status == 200 and run_id not in ("", None):
            assert "message-error" in text, (output, text[:300])


def test_an_absolute_path_to_a_run_outside_is_refused(setup):
    url, outside, base = setup
    for run_id in (str(outside), str(base / "logs" / "run-ok"), f"{base}/logs/../outside-run"):
        status, text = call(url, "timeline-graph.figure", {"runs-selected.data": run_id})
        assert status == 200 and "message-error" in text and SECRET not in text


def test_the_same_requests_work_for_a_real_run(setup):
    url, _, _ = setup
    status, text = call(url, "timeline-graph.figure", {"runs-selected.data": "run-ok"})
    assert status == 200 and "message-error" not in text and '"RSS' in text


def test_runs_outside_or_linked_out_are_not_listed(setup):
    url, _, _ = setup
    status, text = call(url, "runs-list.children", {})
    assert status == 200 and "run-ok" in text
    assert "linked-out" not in text and "outside-run" not in text and SECRET not in text


@pytest.mark.parametrize("path", [
    "/assets/../../secret.txt", "/assets/%2e%2e/%2e%2e/secret.txt", "/_dash-component-suites/../../secret.txt",
    "/assets/..%2f..%2fsecret.txt", "/../secret.txt", "/assets//etc/passwd",
])
def test_static_routes_serve_nothing_outside_the_package(setup, path):
    url, _, base = setup
    parsed = urllib.parse.urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    connection.request("GET", path.replace("secret.txt", str(base / "secret.txt")) if "//" in path else path)
    response = connection.getresponse()
    body = response.read().decode(errors="replace")
    assert SECRET not in body and "root:" not in body


@pytest.mark.parametrize("body", [b"not json", b"{}", b'{"output": "timeline-graph.figure"}', b"[1, 2]"])
def test_malformed_callback_requests_are_refused_without_a_traceback(setup, body):
    url, _, _ = setup
    request = urllib.request.Request(url + "_dash-update-component", data=body,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert 400 <= refused.value.code < 500
    assert "Traceback" not in refused.value.read().decode()
