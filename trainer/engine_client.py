"""The rank's side of a rollout engine in its own process: starts `python -m trainer.engine_server` on
the rank's device, drives it over HTTP with SGLang's endpoints, and stops it (even on error).

`RemoteEngine` has the methods of `RolloutEngine` that the training loop calls, so `train.py` does not
know which kind it drives. Weight updates: each chunk is copied into a staging tensor the engine can
map (shared memory on CPU, a device buffer shared by CUDA IPC on GPU), sent as a handle, copied by the
engine into its own weights; the staging tensor is kept alive until the reply, then dropped.
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch

from miles_profile import names, recorder
from miles_profile.lifetime import child_dies_with_us
from miles_profile.names import BUILTIN, TORCH_MEMORY_SAVER
from trainer import engine_http as api
from trainer import memory_backend as memory_backend_lib
from trainer.config import ModelConfig
from trainer.errors import EngineError

START_TIMEOUT_S = 300.0  # the gpu preset allocates a 12 GiB pool and may capture graphs first
STOP_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 600.0
ROLE_ENV = "MILES_PROFILE_ROLE"  # read by the recorder for the process meta's role


@dataclass(frozen=True)
class KVInfo:
    nbytes: int
    capacity_tokens: int


class RemoteEngine:
    """`proc` and `workdir` are None for a server we did not start (`connect`): we never stop it."""

    def __init__(self, proc: subprocess.Popen | None, url: str, workdir: tempfile.TemporaryDirectory | None,
                 device: torch.device):
        self.proc, self.url, self._workdir, self.device = proc, url, workdir, device
        info = self._request("GET", api.SERVER_INFO)
        if not isinstance(info, dict):
            raise EngineError(f"engine server at {url}: {api.SERVER_INFO} answered no JSON object")
        # Our engine server states its sizes; another SGLang-compatible server (SGLang's own /server_info
        # lists its server args instead) leaves them unknown: 0 bytes, and no expected_bytes on the phases.
        self.ours = "kv_cache_bytes" in info
        self.pid: int | None = info.get("pid")
        self.weights_bytes: int = int(info.get("weights_bytes") or 0)
        self.kv = KVInfo(int(info.get("kv_cache_bytes") or 0), int(info.get("kv_capacity_tokens") or 0))
        self.memory_backend: str = info.get("memory_backend", BUILTIN)

    @classmethod
    def connect(cls, url: str, device: torch.device) -> "RemoteEngine":
        """Drive a server already listening at `url` (--rollout-engine-url): ours started by hand, or
        any server with SGLang's endpoints on this host (weights cross as shared memory / CUDA IPC handles)."""
        if device.type == "cpu":
            api.use_file_system_sharing()
        elif device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        engine = cls(None, url.rstrip("/"), None, device)
        engine._request("GET", api.HEALTH)
        return engine

    @classmethod
    def start(cls, cfg: ModelConfig, device: torch.device, kv_cache_bytes: int, cuda_graph: bool = False,
              torch_threads: int | None = None, memory_backend: str = BUILTIN) -> "RemoteEngine":
        """Start the server on `device`, wait until it listens and answers /health."""
        if device.type == "cpu":
            api.use_file_system_sharing()
        elif device.index is None:  # the engine must open the handles on the very same GPU
            device = torch.device("cuda", torch.cuda.current_device())
        workdir = tempfile.TemporaryDirectory(prefix="engine-")
        port_file = Path(workdir.name) / "port"
        command = [sys.executable, "-m", "trainer.engine_server", "--model-config", json.dumps(asdict(cfg)),
                   "--device", str(device), "--kv-cache-bytes", str(kv_cache_bytes),
                   "--torch-threads", str(torch_threads or 0), "--port-file", str(port_file)]
        if cuda_graph:
            command.append("--cuda-graph")
        command += ["--memory-backend", memory_backend]
        env = dict(os.environ, **{ROLE_ENV: "engine"})
        preload = memory_backend_lib.preload_library() if memory_backend == TORCH_MEMORY_SAVER else None
        if preload:  # as SGLang runs it: preload mode, where graph memory can be paused too
            env["LD_PRELOAD"] = ":".join(p for p in (preload, env.get("LD_PRELOAD", "")) if p)
        rec = recorder.active()
        if rec is not None and rec.run_dir is not None:  # `record` in this process: the engine joins its run
            env.setdefault(names.RUN_DIR_ENV, str(rec.run_dir))
        # SIGTERM when the rank dies, even by SIGKILL (the server stops cleanly on it); started on the
        # rank's main thread, which lives as long as the rank (PR_SET_PDEATHSIG follows the thread).
        proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                preexec_fn=child_dies_with_us(signal.SIGTERM))  # noqa: PLW1509 (prctl only)
        try:
            port = _wait_for_port(proc, port_file)
            engine = cls(proc, f"http://127.0.0.1:{port}", workdir, device)
            engine._request("GET", api.HEALTH)
            return engine
        except BaseException:
            _stop(proc)
            workdir.cleanup()
            raise

    # --- the RolloutEngine methods the loop calls -----------------------------------------------

    def generate(self, prompts: torch.Tensor, response_len: int, seed: int, temperature: float = 1.0) -> torch.Tensor:
        body = {"input_ids": prompts.tolist(),
                "sampling_params": {"max_new_tokens": response_len, "temperature": temperature,
                                    "sampling_seed": seed}}
        replies = self._request("POST", api.GENERATE, body)
        try:
            return torch.tensor([r["output_ids"] for r in replies], dtype=torch.long)
        except (TypeError, KeyError, ValueError, IndexError, RuntimeError) as exc:  # no list of token-id lists
            raise EngineError(f"engine server at {self.url}: {api.GENERATE} answered no token ids "
                              f"({type(exc).__name__}: {str(exc)[:100]})") from None

    def release_memory_occupation(self, tags: Sequence[str]) -> None:
        self._request("POST", api.RELEASE, {"tags": list(tags)})

    def resume_memory_occupation(self, tags: Sequence[str]) -> None:
        self._request("POST", api.RESUME, {"tags": list(tags)})

    def occupied_bytes(self, tags: Sequence[str]) -> int | None:
        """Bytes a release of `tags` would free; None from a server without our /memory_occupation."""
        return self._bytes_field("occupied_bytes", tags) if self.ours else None

    def released_bytes(self, tags: Sequence[str]) -> int | None:
        return self._bytes_field("released_bytes", tags) if self.ours else None

    def _bytes_field(self, key: str, tags: Sequence[str]) -> int:
        reply = self._request("POST", api.MEMORY, {"tags": list(tags)})
        value = reply.get(key) if isinstance(reply, dict) else None
        if type(value) is not int or value < 0:
            raise EngineError(f"engine server at {self.url}: {api.MEMORY} answered no byte count {key} "
                              f"({str(value)[:40]})")
        return value

    def flush_cache(self) -> None:
        self._request("POST", api.FLUSH_CACHE, {})

    @torch.no_grad()
    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        named = list(named_tensors)
        staging = torch.empty(sum(t.numel() for _, t in named), dtype=named[0][1].dtype, device=self.device)
        if self.device.type == "cpu":
            staging.share_memory_()  # a named segment the engine maps; the actor's own buffers stay private
        shared, start = [], 0
        for name, tensor in named:
            view = staging[start:start + tensor.numel()].view(tensor.shape)
            view.copy_(tensor)
            shared.append((name, view))
            start += tensor.numel()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the engine reads the buffer from another process
        body = {"serialized_named_tensors": [api.serialize(shared)], "load_format": None, "flush_cache": True}
        reply = self._request("POST", api.UPDATE_WEIGHTS, body)
        del shared, staging  # only now: the engine has copied and dropped its handle
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()  # frees blocks whose IPC handles the engine has closed
            torch.cuda.empty_cache()  # and returns the staging chunk: the engine onloads next
        if not isinstance(reply, dict) or not reply.get("success"):
            message = reply.get("message") if isinstance(reply, dict) else None
            raise EngineError(f"engine server at {self.url}: update_weights_from_tensor failed: "
                              f"{message or 'no message'}")

    def close(self) -> None:
        if self.proc is not None:  # a server we connected to is not ours to stop
            _stop(self.proc)
        if self._workdir is not None:
            self._workdir.cleanup()

    # --- HTTP ------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict | None = None):
        """One call, answered within the time that fits it (ANSWER_TIMEOUT_S) and at most MAX_ANSWER_BYTES;
        anything else is an EngineError naming the URL and what was wrong (never empty)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **_phase_header()}
        try:
            status, reason, payload = _http(self.url, method, path, data, headers)
        except (OSError, http.client.HTTPException, ValueError) as exc:  # refused, reset, timed out, bad URL
            raise self._failed(path, _describe(exc)) from None
        if status >= 400:
            raise EngineError(f"engine server at {self.url}: {path} answered HTTP {status} {reason}".rstrip()
                              + f": {_message(payload) or '(no message)'}")
        if not payload or path == api.FLUSH_CACHE:  # flush: text
            return None
        try:
            return json.loads(payload)
        except ValueError:  # UnicodeDecodeError too: garbage bytes
            raise EngineError(f"engine server at {self.url}: {path} answered {len(payload):,} bytes that are no JSON "
                              f"({payload[:60]!r})") from None

    def _failed(self, path: str, why: str) -> EngineError:
        if self.proc is None:
            return EngineError(f"engine server at {self.url} not answering: {path} failed ({why})")
        code = self.proc.poll()
        state = f"exited with code {code}" if code is not None else "not answering"
        return EngineError(f"engine server (pid {self.proc.pid}) at {self.url} {state}: {path} failed ({why})")


# Connecting is quick or never; each call's answer takes what its work takes: a health check or a size
# query is instant, a generation or a weight update on a large model takes minutes.
CONNECT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = {api.HEALTH: 30.0, api.SERVER_INFO: 30.0, api.MEMORY: 60.0, api.FLUSH_CACHE: 120.0}
MAX_ANSWER_BYTES = 256 * 1024 ** 2  # a generation's token ids are megabytes; more is no answer of ours


def _http(url: str, method: str, path: str, data: bytes | None, headers: dict) -> tuple[int, str, bytes]:
    """(status, reason, body) of one request. The answer's whole time is bounded, not each read, so
    a server that trickles bytes (or sends gigabytes) is cut off as one that sends nothing."""
    parts = urllib.parse.urlsplit(url + path)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname or "", parts.port, timeout=CONNECT_TIMEOUT_S)
    answer_s = ANSWER_TIMEOUT_S.get(path, REQUEST_TIMEOUT_S)
    try:
        try:
            connection.connect()
        except TimeoutError:
            raise TimeoutError(f"could not connect within {CONNECT_TIMEOUT_S:.0f} s") from None
        sock = connection.sock
        sock.settimeout(answer_s)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        deadline = time.monotonic() + answer_s
        try:
            connection.request(method, target, body=data, headers=headers)
            response = connection.getresponse()
            chunks, size = [], 0
            while not response.isclosed():  # closed once the whole body is read
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                chunk = response.read1(1024 * 1024)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise ValueError(f"an answer over {MAX_ANSWER_BYTES // 1024 ** 2} MiB")
                chunks.append(chunk)
        except TimeoutError:
            raise TimeoutError(f"no complete answer within {answer_s:.0f} s") from None
        return response.status, response.reason or "", b"".join(chunks)
    finally:
        connection.close()


def _describe(exc: BaseException) -> str:
    """What went wrong, never an empty string (TimeoutError() and some socket errors have no text)."""
    text = str(getattr(exc, "reason", "") or exc or "")
    if isinstance(exc, (TimeoutError, socket.timeout)) and "within" not in text:
        text = f"timed out{': ' + text if text and text != 'timed out' else ''}"
    return text or type(exc).__name__


def _phase_header() -> dict[str, str]:
    rec = recorder.active()
    phase = rec.current_phase() if rec is not None else ""
    return {api.PHASE_HEADER: phase} if phase else {}


def _message(payload: bytes) -> str:
    try:
        reply = json.loads(payload)
        return reply.get("error", {}).get("message") or reply.get("message") or str(reply)
    except (ValueError, AttributeError):
        return payload.decode(errors="replace")[:200]


def _wait_for_port(proc: subprocess.Popen, port_file: Path) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if port_file.exists():
            return int(port_file.read_text())
        code = proc.poll()
        if code is not None:
            raise EngineError(f"engine server exited with code {code} before it listened")
        time.sleep(0.05)
    raise EngineError(f"engine server did not listen within {START_TIMEOUT_S:.0f} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
