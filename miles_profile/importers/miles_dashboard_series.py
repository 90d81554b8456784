"""The series of a Miles dashboard directory that are not memory: each GPU's utilization and power
(`gpu_util`'s `util` and `power_w`) and the SGLang engine metrics (`engine_series`), for views of their
own. Read when a view asks (not by the import: a 512-GPU hour is 1.8 million gpu_util lines), once per
run.

    engine_series/<YYYYMMDD_HH>.jsonl   {ts, addr, metric, labels: {engine_type?}, value}: Miles'
        EngineSample (store.py at 0e33f812), one scraped value of a whitelisted SGLang metric
        (sglang_scraper.py at 71ef755d: num_running_reqs, num_queue_reqs, gen_throughput, token_usage,
        cache_hit_rate, and the PD disaggregation queues and KV transfer), every ~2 s per engine

    gpu_series(run) -> DataFrame | None      # t, host, gpu, util (%), power_w (W); None: not a Miles import
    engine_series(run) -> DataFrame | None   # t, engine (addr), engine_type, metric, value
    series_note(run) -> str                  # what the dump holds of them, in words (an empty view says why)
"""
from __future__ import annotations

import pandas as pd
import pyarrow as pa

from miles_profile.importers.miles_dashboard import SOURCE
from miles_profile.importers.miles_dashboard_streams import _stream_frame, stream_files

UTIL_SCHEMA = pa.schema([("ts", pa.float64()), ("node", pa.string()), ("gpu", pa.int64()), ("util", pa.float64()),
                         ("power_w", pa.float64())])
ENGINE_SCHEMA = pa.schema([("ts", pa.float64()), ("addr", pa.string()), ("metric", pa.string()),
                           ("labels", pa.struct([("engine_type", pa.string())])), ("value", pa.float64())])
PREFIX = "sglang_"  # the scraper's normalized names ("sglang:x" from an engine, "sglang_x" from the router)


def is_miles(run) -> bool:
    return run.meta.get("source") == SOURCE


def _cached(run, key: str, read):
    cache = run.__dict__.setdefault("_report_cache", {})  # the report and the dashboard both ask
    if key not in cache:
        cache[key] = read()
    return cache[key]


def gpu_series(run) -> pd.DataFrame | None:
    """Each GPU's NVML utilization (%) and power (W) as Miles sampled them, by time; absent values NaN."""
    if not is_miles(run):
        return None
    return _cached(run, "miles_gpu_series", lambda: _read_gpu(run))


def _read_gpu(run) -> pd.DataFrame:
    warnings: list[str] = []
    frame = _stream_frame(run.path, "gpu_util", UTIL_SCHEMA, warnings)
    out = pd.DataFrame({"t": pd.to_numeric(frame["ts"], errors="coerce"), "host": frame["node"],
                        "gpu": pd.to_numeric(frame["gpu"], errors="coerce"),
                        "util": pd.to_numeric(frame["util"], errors="coerce"),
                        "power_w": pd.to_numeric(frame["power_w"], errors="coerce")})
    out = out[out[["t", "host", "gpu"]].notna().all(axis=1) & out[["util", "power_w"]].notna().any(axis=1)]
    return out.astype({"gpu": "int64", "host": str}).sort_values("t", kind="stable").reset_index(drop=True)


def engine_series(run) -> pd.DataFrame | None:
    """The SGLang metrics Miles scraped, one row per value: metric without its `sglang_` prefix."""
    if not is_miles(run):
        return None
    return _cached(run, "miles_engine_series", lambda: _read_engine(run))


def _read_engine(run) -> pd.DataFrame:
    warnings: list[str] = []
    frame = _stream_frame(run.path, "engine_series", ENGINE_SCHEMA, warnings)
    labels = frame["labels"] if "labels" in frame else pd.Series([None] * len(frame))
    out = pd.DataFrame({
        "t": pd.to_numeric(frame["ts"], errors="coerce"),
        "engine": frame["addr"].map(lambda a: a if isinstance(a, str) else None),
        "engine_type": [(v or {}).get("engine_type") or "" if isinstance(v, dict) else "" for v in labels],
        "metric": frame["metric"].map(lambda m: m[len(PREFIX):] if isinstance(m, str) and m.startswith(PREFIX) else m),
        "value": pd.to_numeric(frame["value"], errors="coerce"),
    })
    out = out[out[["t", "engine", "metric", "value"]].notna().all(axis=1)]
    return out.sort_values("t", kind="stable").reset_index(drop=True)


def series_note(run) -> str:
    """What a Miles dump holds besides memory, or why it has none of it (for a view that would be empty)."""
    if not is_miles(run):
        return ""
    gpus, engines = gpu_series(run), engine_series(run)
    parts = []
    if gpus.empty:
        parts.append("no GPU utilization (its gpu_util samples carry no util or power_w)")
    if engines.empty:
        why = ("its engine_series files hold no readable sample" if stream_files(run.path, "engine_series")
               else "no engine_series stream: Miles scraped no SGLang metrics, e.g. no router or engine answered")
        parts.append(f"no SGLang engine series ({why})")
    return ("This Miles dump has " + " and ".join(parts) + ".") if parts else ""
