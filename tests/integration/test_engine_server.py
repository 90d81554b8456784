"""The rollout engine in its own process (trainer/engine_server.py), driven over HTTP by the rank's
client (trainer/engine_client.py): memory really released and resumed (the server's RSS, read from
/proc), weights crossing by shared memory and landing exactly, SGLang's bodies and error replies."""
from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from trainer.config import MiB, ModelConfig
from trainer.engine_client import RemoteEngine
from trainer.engine_server import EngineHTTPServer
from trainer.errors import EngineError
from trainer.model import GPT, init_weights
from trainer.rollout_engine import RolloutEngine

# ~12.6 MB of fp32 weights and a 64 MiB KV pool: both far above the allocator's noise in RSS.
CFG = ModelConfig(vocab_size=16, d_model=256, n_layer=4, n_head=4, max_seq_len=12)
KV_BYTES = 64 * MiB
CPU = torch.device("cpu")
ALL = ["kv_cache", "weights"]


def rss(pid: int) -> int:
    """Resident bytes of `pid`, from /proc/<pid>/status (VmRSS is in kB)."""
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def _weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    model = GPT(CFG)
    init_weights(model, torch.Generator().manual_seed(seed))
    return [(name, p.detach()) for name, p in model.named_parameters()]


def _send(engine, named, per_chunk: int = 5) -> None:
    for i in range(0, len(named), per_chunk):  # chunks, as the actor sends them
        engine.update_weights_from_tensor(named[i:i + per_chunk])


@pytest.fixture(scope="module")
def engine():
    remote = RemoteEngine.start(CFG, CPU, KV_BYTES, torch_threads=1)
    yield remote
    remote.close()
    assert remote.proc.poll() is not None  # close() stopped the server process


def _post(engine, path: str, body) -> tuple[int, dict]:
    request = urllib.request.Request(engine.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            data, is_json = response.read(), response.headers["Content-Type"] == "application/json"
            return response.status, json.loads(data) if is_json else data.decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_weights_cross_by_shared_memory_and_generate_like_the_in_process_engine(engine):
    named = _weights(1)
    _send(engine, named)
    local = RolloutEngine(CFG, CPU, KV_BYTES)
    local.update_weights_from_tensor(named)
    prompts = torch.randint(0, 10, (8, 6), generator=torch.Generator().manual_seed(0))
    assert torch.equal(engine.generate(prompts, 6, seed=7), local.generate(prompts, 6, seed=7))


def test_release_and_resume_over_http_really_free_and_take_back_the_memory(engine):
    _send(engine, _weights(2))
    expected = engine.occupied_bytes(ALL)
    assert expected >= KV_BYTES + engine.weights_bytes
    before = rss(engine.pid)
    engine.release_memory_occupation(ALL)
    released = rss(engine.pid)
    assert before - released >= 0.8 * expected, (before, released, expected)
    assert engine.released_bytes(ALL) == expected
    with pytest.raises(EngineError, match="released"):
        engine.generate(torch.zeros((2, 6), dtype=torch.long), 6, seed=0)
    engine.resume_memory_occupation(ALL)
    assert rss(engine.pid) - released >= 0.8 * expected
    _send(engine, _weights(2))  # resumed weights are zeros until refilled, as in SGLang
    assert engine.generate(torch.zeros((2, 6), dtype=torch.long), 6, seed=0).shape == (2, 6)


@pytest.mark.slow
def test_sglang_bodies_and_errors(engine):
    assert _post(engine, "/release_memory_occupation", {"tags": ["kv_cache"]}) == (200, None)  # SGLang: null
    assert _post(engine, "/resume_memory_occupation", {"tags": ["kv_cache"]}) == (200, None)
    status, reply = _post(engine, "/release_memory_occupation", {"tags": ["gpu_everything"]})
    assert status == 400 and "unknown memory tag" in reply["error"]["message"]
    status, reply = _post(engine, "/update_weights_from_tensor",
                          {"serialized_named_tensors": [""], "load_format": "flattened_bucket"})
    assert status == 400 and reply["success"] is False
    with urllib.request.urlopen(engine.url + "/health", timeout=10) as response:
        assert response.status == 200
    assert _post(engine, "/flush_cache", {}) == (200, "Cache flushed.\n")  # SGLang answers in text
    engine.flush_cache()
    assert _post(engine, "/no_such_endpoint", {})[0] == 404


@pytest.mark.gpu
def test_cuda_ipc_weights_generate_like_the_in_process_engine():
    """On a GPU the weights cross as CUDA IPC handles; the engine's copy must be exact."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cuda = torch.device("cuda", 0)
    named = [(name, t.to(cuda)) for name, t in _weights(3)]
    remote = RemoteEngine.start(CFG, cuda, KV_BYTES)
    try:
        _send(remote, named)
        local = RolloutEngine(CFG, cuda, KV_BYTES)
        local.update_weights_from_tensor(named)
        prompts = torch.randint(0, 10, (8, 6), generator=torch.Generator().manual_seed(0))
        assert torch.equal(remote.generate(prompts, 6, seed=7), local.generate(prompts, 6, seed=7))
        before = torch.cuda.mem_get_info(cuda)[0]
        remote.release_memory_occupation(ALL)
        assert torch.cuda.mem_get_info(cuda)[0] - before >= 0.8 * KV_BYTES  # the engine process gave it back
    finally:
        remote.close()


def test_a_client_gone_before_its_reply_leaves_no_traceback_and_the_server_serving(capsys):
    """A rank stopped mid-call (torchrun SIGTERMs it) closes its connection; writing the reply then fails.
    That is the client's leaving, not a server error: nothing may reach the rank's log."""
    class JoinedServer(EngineHTTPServer):
        daemon_threads = False  # server_close() joins the handler threads: their output is all in

    server = JoinedServer(("127.0.0.1", 0), RolloutEngine(CFG, CPU, KV_BYTES))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    body = json.dumps({"input_ids": [[1, 2, 3]], "sampling_params": {"max_new_tokens": 2}}).encode()
    with server.engine_lock:  # the handler waits here, request read, while the client goes away
        client = socket.create_connection(server.server_address)
        client.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.3)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        client.close()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/health", timeout=10) as reply:
            assert reply.status == 200
    finally:
        server.shutdown()
        server.server_close()
    assert "Traceback" not in capsys.readouterr().err
