"""Helpers shared by the benchmarks: device choice, timing, ratio printing. No plotting imports."""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores, torch {torch.__version__}"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, no GPU, torch {torch.__version__}"


def median(values: list[float]) -> float:
    return statistics.median(values)


def quartiles(values: list[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles."""
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return q1, q3


def write_result(out: str | None, name: str, result: dict[str, Any]) -> None:
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), **result}
    print(json.dumps(result, indent=1))
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(result, indent=1))
