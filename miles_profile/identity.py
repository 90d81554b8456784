"""Who a recording process is within a distributed run: rank, role, host, run id, and its GPU's UUID.

Everything comes from the environment torchrun (and the launcher) set, read once at recorder start.
The GPU's UUID is read only after the program itself has initialised CUDA: the recorder never
creates a CUDA context (hundreds of MiB on the device) of its own.
"""
from __future__ import annotations

import os
import re
import socket
import sys
from typing import Any

# Environment variables (docs/log-format.md).
RUN_ID_ENV = "MILES_PROFILE_RUN_ID"  # hosts of one run agree on it; record --run-id sets it
ROLE_ENV = "MILES_PROFILE_ROLE"      # e.g. "actor" for ranks, "engine" for rollout engine processes
HOST_ENV = "MILES_PROFILE_HOST"      # overrides the host name (tests fake several hosts with it)


def host_name() -> str:
    """The host as the log names it; MILES_PROFILE_HOST wins. A GPU is (host, UUID)."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:  # a malformed value must not stop the program being recorded
        return default


def process_identity(default_role: str) -> dict[str, Any]:
    """rank, local_rank, world_size (torchrun's RANK, LOCAL_RANK, WORLD_SIZE; else 0, 0, 1), role, host."""
    return {"rank": _env_int("RANK", 0), "local_rank": _env_int("LOCAL_RANK", 0),
            "world_size": _env_int("WORLD_SIZE", 1),
            "role": os.environ.get(ROLE_ENV) or default_role, "host": host_name()}


# multiprocessing's own names for a process its program did not name
_UNNAMED = re.compile(r"(Spawn|Fork|Forkserver)?(Process|PoolWorker)-\d+(:\d+)*")


def python_process_name() -> str | None:
    """A multiprocessing child's name: the one its program gave it, else its target function's (an actor and a
    reference model started with torch.multiprocessing are `actor` and `reference`); None in a main process,
    and for a target of multiprocessing's or torch's own (a pool's worker, mp.spawn's wrapper)."""
    mp = sys.modules.get("multiprocessing")
    try:
        if mp is None or mp.parent_process() is None:
            return None
        process = mp.current_process()
        if not _UNNAMED.fullmatch(process.name):
            return process.name
        target = getattr(process, "_target", None)  # the Process's function: kept as it was given
        name, module = getattr(target, "__qualname__", None), getattr(target, "__module__", None) or ""
        if not isinstance(name, str) or name.startswith("_") or module.split(".")[0] in ("multiprocessing", "torch"):
            return None
        return name
    except Exception:  # an odd multiprocessing: the process is still recorded, unnamed
        return None


def distributed_rank() -> tuple[int, int] | None:
    """(rank, world size) of torch.distributed's default group once the program has initialised it (never
    imported here), else None: ranks started by mp.spawn get no RANK variable, so each said rank 0."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        pass
    return None


def _uuid_text(value: Any) -> str:
    text = str(value)
    # torch prints the bare UUID; NVML (and the host files) prefix it with "GPU-" (or "MIG-").
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def _uuid_by_pci_bus_id(props) -> str | None:
    """NVML's UUID of the device at torch's PCI address (torch builds whose properties lack `uuid`)."""
    try:
        import pynvml  # optional (nvidia-ml-py): without it or a driver the UUID stays unknown
        pynvml.nvmlInit()
        try:
            bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByPciBusId(bus))
            return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def cuda_identity() -> dict[str, Any] | None:
    """{gpu_uuid, cuda_devices} once the program has initialised CUDA, else None (nothing touched).

    `gpu_uuid` is the UUID of the current device (a rank's `torch.cuda.set_device`); `cuda_devices`
    maps every CUDA index this process sees to its UUID, name and total bytes."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        devices = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            uuid = getattr(props, "uuid", None)
            uuid = _uuid_text(uuid) if uuid is not None else _uuid_by_pci_bus_id(props)
            devices.append({"index": index, "uuid": uuid, "name": props.name, "total": int(props.total_memory)})
        current = torch.cuda.current_device()
    except Exception:  # a broken CUDA setup is the program's business, not the recorder's
        return None
    return {"gpu_uuid": devices[current]["uuid"] if current < len(devices) else None, "cuda_devices": devices}
