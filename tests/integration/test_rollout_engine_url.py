"""--rollout-engine-url: the trainer drives a server it did not start (issue 20 item 5), here our own
engine server started by hand as a separate process, as an SGLang server would be."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from trainer.args import parse_args
from trainer.config import PRESETS, model_config

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env.pop("MILES_PROFILE_RUN_DIR", None)
    return env


@pytest.mark.parametrize("flags, says", [
    (["--rollout-engine-url", "localhost:30000"], "is not an http:// or https:// URL"),
    (["--rollout-engine-url", "http://127.0.0.1:1", "--rollout-engine", "in_process"], "does not go with"),
])
def test_a_wrong_engine_url_is_one_line_and_exit_2(flags, says, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--preset", "tiny", *flags], cuda_available=False)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_one_url_is_for_one_rank(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--preset", "tiny", "--rollout-engine-url", "http://h:1"], cuda_available=False, world_size=2)
    assert "one rank" in capsys.readouterr().err


def test_the_url_makes_the_engine_a_server():
    cfg = parse_args(["--preset", "tiny", "--rollout-engine-url", "http://127.0.0.1:30000"], cuda_available=False)
    assert cfg.rollout_engine == "server" and cfg.rollout_engine_url == "http://127.0.0.1:30000"


@pytest.fixture
def server(tmp_path):
    """Our engine server for the tiny preset, started by hand (not by the trainer)."""
    preset = PRESETS["tiny"]
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "trainer.engine_server", "--model-config",
                             json.dumps(asdict(model_config(preset, preset.digits))),
                             "--kv-cache-bytes", str(preset.kv_cache_bytes), "--port-file", str(port_file)],
                            cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the engine server did not listen"
            time.sleep(0.1)
        yield proc, f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


@pytest.mark.slow
def test_the_trainer_drives_a_server_it_did_not_start_and_leaves_it_running(server, tmp_path):
    proc, url = server
    # Output to a file, not a pipe: on CPU, torch's shared-memory manager that the trainer starts lives as
    # long as the server holds the weights' segments, and keeps a pipe open after the trainer is gone.
    with open(tmp_path / "out", "w") as out:
        code = subprocess.run([sys.executable, "-m", "trainer.train", "--preset", "tiny", "--num-rollout", "2",
                               "--offload-rollout", "--rollout-engine-url", url],
                              cwd=REPO, env=_env(), stdout=out, stderr=subprocess.STDOUT, timeout=300).returncode
    text = (tmp_path / "out").read_text()
    assert code == 0, text[-2000:]
    assert f"engine server (pid {proc.pid})" in text  # the pid its /server_info gave: that server
    assert "rollout 2/2" in text
    assert proc.poll() is None  # not ours to stop


def test_a_url_nobody_listens_on_is_one_line_and_exit_1():
    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = subprocess.run([sys.executable, "-m", "trainer.train", "--preset", "tiny", "--num-rollout", "1",
                          "--rollout-engine-url", f"http://127.0.0.1:{port}"],
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert f"engine server at http://127.0.0.1:{port} not answering" in run.stderr
