"""The rollout engine's HTTP protocol, shared by `engine_server` and `engine_client`.

Endpoint names and JSON bodies follow SGLang's HTTP server (sglang/srt/entrypoints/http_server.py and
the request structs of sglang/srt/managers/io_struct.py); docs/trainer.md lists what was checked.
Tensors never travel as data in JSON: `serialize` pickles (name, tensor) pairs with torch's
multiprocessing reductions (ForkingPickler), as SGLang's `MultiprocessingSerializer` does, so a CPU
tensor crosses as the name of a shared-memory segment and a CUDA tensor as a CUDA IPC handle; the
bytes go base64-encoded in `serialized_named_tensors`.
"""
from __future__ import annotations

import base64
import io
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401  (registers torch's reductions with ForkingPickler)

GENERATE = "/generate"
RELEASE = "/release_memory_occupation"
RESUME = "/resume_memory_occupation"
UPDATE_WEIGHTS = "/update_weights_from_tensor"
FLUSH_CACHE = "/flush_cache"
HEALTH = "/health"
SERVER_INFO = "/server_info"
SERVER_INFO_OLD = "/get_server_info"  # SGLang's deprecated name, still served
MEMORY = "/memory_occupation"  # ours, not SGLang's: bytes a release/resume of some tags would move

# The rank's current phase name, so the engine's own samples carry the phase the rank is in.
PHASE_HEADER = "X-Miles-Profile-Phase"


def use_file_system_sharing() -> None:
    """CPU tensors cross as named shared-memory segments. torch's default on Linux passes file
    descriptors through a socket authenticated with the multiprocessing authkey, which an unrelated
    process (the engine server is not a multiprocessing child) does not share."""
    torch.multiprocessing.set_sharing_strategy("file_system")


def serialize(named_tensors: list[tuple[str, torch.Tensor]]) -> str:
    """MultiprocessingSerializer.serialize(obj, output_str=True): ForkingPickler bytes, base64."""
    buf = io.BytesIO()
    ForkingPickler(buf).dump(named_tensors)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def deserialize(data: str) -> list[tuple[str, torch.Tensor]]:
    return ForkingPickler.loads(base64.b64decode(data, validate=True))
