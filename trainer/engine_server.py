"""python -m trainer.engine_server: one rollout engine in its own process, served over HTTP like an
SGLang server (endpoint names and JSON bodies: trainer/engine_http.py, docs/trainer.md).

A rank starts it (trainer/engine_client.py), waits for the port file and /health, drives it, and
stops it with SIGTERM. It also stops when its parent dies (PR_SET_PDEATHSIG, and a watchdog on
getppid for the case the signal was missed), so a killed rank never leaves an engine behind.

With MILES_PROFILE_RUN_DIR set it records itself like any process of the run: every request runs in a
`miles_profile.phase` named after the phase the rank is in (header X-Miles-Profile-Phase) or, without
one, after the endpoint.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

if __name__ == "__main__":
    from trainer import gc_startup
    gc_startup.defer_collections()  # torch's import: 175,000 lasting objects (trainer/gc_startup.py)

import torch  # noqa: E402

import miles_profile as mp
from miles_profile.names import BUILTIN, TAGS, TORCH_MEMORY_SAVER
from trainer import engine_http as api, memory_backend
from trainer.config import ModelConfig
from trainer.errors import EngineError
from trainer.model import settle_torch
from trainer.rollout_engine import RolloutEngine

PARENT_POLL_S = 1.0


class EngineHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, engine: RolloutEngine):
        super().__init__(address, Handler)
        self.engine = engine
        self.engine_lock = threading.Lock()  # one engine call at a time, as SGLang's scheduler serialises them

    def handle_error(self, request, client_address) -> None:
        # A client that went away before its reply (a rank stopped mid-call) is not the server's error:
        # socketserver would print a traceback into the rank's log.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    server: EngineHTTPServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: Nagle + delayed ACK would add 40 ms

    def log_message(self, *args) -> None:  # no access log: the rank's output stays one line per rollout
        pass

    def do_GET(self) -> None:
        if self.path == api.HEALTH:
            self._send(200, b"", "text/plain")
        elif self.path in (api.SERVER_INFO, api.SERVER_INFO_OLD):
            engine = self.server.engine
            self._reply(200, {"pid": os.getpid(), "device": str(engine.device),
                              "weights_bytes": engine.weights_bytes, "kv_cache_bytes": engine.kv.nbytes,
                              "kv_capacity_tokens": engine.kv.capacity_tokens,
                              "memory_backend": engine.memory_backend})
        elif self.path == api.FLUSH_CACHE:  # SGLang accepts GET and POST
            self._call(api.FLUSH_CACHE, {})
        else:
            self._reply(404, {"error": {"message": f"no endpoint {self.path}"}})

    def do_POST(self) -> None:
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        except ValueError as exc:
            self._reply(400, {"error": {"message": f"invalid JSON: {exc}"}})
            return
        if self.path not in ROUTES:
            self._reply(404, {"error": {"message": f"no endpoint {self.path}"}})
            return
        self._call(self.path, body)

    def _call(self, path: str, body: dict) -> None:
        handler, default_phase = ROUTES[path]
        phase = self.headers.get(api.PHASE_HEADER) or default_phase
        try:
            with self.server.engine_lock:
                engine = self.server.engine
                # A query of the bytes held changes no memory: no phase of its own (it was a heatmap column).
                recorded = (contextlib.nullcontext() if path == api.MEMORY else
                            mp.phase(phase, endpoint=path, **_phase_attrs(engine, path, body)))
                with recorded:
                    status, reply = 200, handler(engine, body)
        except (EngineError, ValueError, KeyError, TypeError) as exc:  # the request's fault
            status, reply = 400, {"error": {"message": str(exc)}}
            if path == api.UPDATE_WEIGHTS:
                reply = {"success": False, "message": str(exc)}
        except Exception as exc:  # e.g. out of memory on resume: the rank gets it as one line, the server lives
            status, reply = 500, {"error": {"message": f"{type(exc).__name__}: {str(exc)[:500]}"}}
        if isinstance(reply, Text):
            self._send(status, reply.encode(), "text/plain")
        else:
            self._reply(status, reply)

    def _reply(self, status: int, payload) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Text(str):
    """A plain-text reply (SGLang answers /flush_cache in text)."""


def _phase_attrs(engine: RolloutEngine, path: str, body: dict) -> dict:
    """The phase's attributes; a release or resume declares the bytes it moves (read under the engine lock),
    so the server's own offload phases are judged like the rank's, not left without expected_bytes."""
    tags = body.get("tags")
    attrs = {"tags": list(tags)} if isinstance(tags, list) else {}
    declared = {api.RELEASE: engine.occupied_bytes, api.RESUME: engine.released_bytes}.get(path)
    if declared is not None:
        try:
            attrs.update(expected_bytes=declared(_tags(body)), backend=engine.memory_backend)
        except (EngineError, ValueError, TypeError):
            pass  # bad tags: the handler answers 400 for them
    return attrs


# --- endpoints: (engine, JSON body) -> JSON reply ------------------------------------------------

def generate(engine: RolloutEngine, body: dict):
    """GenerateReqInput with a batch of `input_ids` (one reply per prompt: a list, as SGLang returns)
    or one prompt (a flat list of ids, as Miles sends one sample: one reply object)."""
    params = body.get("sampling_params") or {}
    single = bool(body["input_ids"]) and not isinstance(body["input_ids"][0], list)
    prompts = torch.tensor([body["input_ids"]] if single else body["input_ids"], dtype=torch.long)
    new_tokens = int(params["max_new_tokens"])
    out = engine.generate(prompts, new_tokens, seed=int(params.get("sampling_seed") or 0),
                          temperature=float(params.get("temperature", 1.0)))
    replies = [{"output_ids": row, "meta_info": {"id": str(i), "prompt_tokens": prompts.shape[1],
                                                 "completion_tokens": new_tokens,
                                                 "finish_reason": {"type": "length", "length": new_tokens}}}
               for i, row in enumerate(out.tolist())]
    return replies[0] if single else replies


def release(engine: RolloutEngine, body: dict):
    engine.release_memory_occupation(_tags(body))
    return None  # SGLang's handler returns nothing: JSON null


def resume(engine: RolloutEngine, body: dict):
    engine.resume_memory_occupation(_tags(body))
    return None


def update_weights(engine: RolloutEngine, body: dict):
    """UpdateWeightsFromTensorReqInput: one serialized list of (name, tensor) per TP rank (we have one).
    The engine copies each tensor into its own weight buffer; the shared tensors are dropped before the
    reply, so the sender may free or reuse them once it has the reply."""
    if body.get("load_format") not in (None, "direct"):
        raise ValueError(f"load_format {body['load_format']!r} not supported (only the default)")
    serialized = body["serialized_named_tensors"]
    if len(serialized) != 1:
        raise ValueError(f"expected one serialized_named_tensors entry (tp_size 1), got {len(serialized)}")
    named = api.deserialize(serialized[0])
    try:
        engine.update_weights_from_tensor(named)
    finally:
        del named  # closes the shared-memory mapping / CUDA IPC handle
    if body.get("flush_cache", True):
        engine.flush_cache()
    return {"success": True, "message": "Succeeded to update parameter online."}


def flush_cache(engine: RolloutEngine, body: dict):
    engine.flush_cache()
    return Text("Cache flushed.\n")


def memory(engine: RolloutEngine, body: dict):
    tags = _tags(body)
    return {"occupied_bytes": engine.occupied_bytes(tags), "released_bytes": engine.released_bytes(tags)}


def _tags(body: dict) -> list[str]:
    tags = body.get("tags")
    if tags is None:  # SGLang: no tags means all of them
        return list(TAGS)
    if not isinstance(tags, list):
        raise ValueError(f"tags must be a list, got {type(tags).__name__}")
    return tags


ROUTES = {
    api.GENERATE: (generate, "generate"),
    api.RELEASE: (release, "release_memory_occupation"),
    api.RESUME: (resume, "resume_memory_occupation"),
    api.UPDATE_WEIGHTS: (update_weights, "update_weights"),
    api.FLUSH_CACHE: (flush_cache, "flush_cache"),
    api.MEMORY: (memory, "memory_occupation"),
}


# --- process -------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.engine_server",
                                description="A rollout engine behind SGLang-style HTTP endpoints.")
    p.add_argument("--model-config", required=True, type=json.loads, help="ModelConfig fields as JSON")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N (the rank's device)")
    p.add_argument("--kv-cache-bytes", type=int, required=True)
    p.add_argument("--cuda-graph", action="store_true")
    p.add_argument("--memory-backend", choices=[BUILTIN, TORCH_MEMORY_SAVER], default=BUILTIN,
                   help="how the engine releases memory (trainer.memory_backend)")
    p.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (written to --port-file)")
    p.add_argument("--port-file", type=Path, help="file that receives the port once the server listens")
    return p


def serve(args: argparse.Namespace) -> None:
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    if mp.samples_heap():  # `record --heap`: the level the engine's host forecast is measured from
        settle_torch(ModelConfig(**args.model_config))
        mp.heap_baseline()
    engine = RolloutEngine(ModelConfig(**args.model_config), device, args.kv_cache_bytes, cuda_graph=args.cuda_graph,
                           memory_backend=args.memory_backend)
    mp.mark("engine_ready", weights_bytes=engine.weights_bytes, kv_cache_bytes=engine.kv.nbytes)  # starts its recorder
    backend = {"rollout_memory_backend": engine.memory_backend}
    if engine.memory_backend == TORCH_MEMORY_SAVER:
        backend["torch_memory_saver_hook_mode"] = memory_backend.hook_mode()
    mp.annotate(**backend)
    server = EngineHTTPServer((args.host, args.port), engine)
    stop = lambda *_: threading.Thread(target=server.shutdown, daemon=True).start()  # noqa: E731
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=_watch_parent, args=(os.getppid(), stop), daemon=True).start()
    if args.port_file:
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(str(server.server_address[1]))
        tmp.rename(args.port_file)  # the rank never reads a half-written port
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


def _watch_parent(parent: int, stop) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        serve(args)
    except (EngineError, OSError) as exc:
        print(f"engine_server: error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    gc_startup.freeze_imports()
    sys.exit(main())
