"""Check the scrapes scripts/gpu_metrics.sh brought back from a GPU (issue 32): every GPU series carries
NVML's index and UUID as nvidia-smi names them, the GPU process's allocator, NVML and RSS gauges and its
true-peak gauge are there, and the largest peak any scrape exposed against the log's own recorded peak.

    python scripts/check_gpu_metrics.py OUT_DIR     (OUT_DIR holds nvidia_smi.csv and logs.tgz)
Exit 1 when a check fails, with the reason.
"""
from __future__ import annotations

import argparse
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

P = "miles_profile_"


def scrapes(root: Path) -> list[dict[str, list]]:
    """Each scrape as {sample name: [(labels, value)]}."""
    found = []
    for path in sorted((root / "scrapes").glob("*.txt")):
        by_name: dict[str, list] = defaultdict(list)
        for family in text_string_to_metric_families(path.read_text()):
            for s in family.samples:
                by_name[s.name].append((s.labels, s.value))
        found.append(by_name)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    out = parser.parse_args().out_dir
    gpus = {}
    for line in (out / "nvidia_smi.csv").read_text().splitlines():
        index, uuid, *_ = [c.strip() for c in line.split(",")]
        gpus[index] = uuid
    work = Path(tempfile.mkdtemp(prefix="gpu-metrics-"))
    with tarfile.open(out / "logs.tgz") as tar:
        tar.extractall(work, filter="data")
    taken = scrapes(work)
    problems = []
    if len(taken) < 5:
        problems.append(f"only {len(taken)} scrapes")
    used = [(labels, v) for s in taken for labels, v in s.get(P + "gpu_memory_used_bytes", [])]
    seen_uuids = {(labels["gpu"], labels["UUID"]) for labels, _ in used}
    if not used or any(gpus.get(i) != u for i, u in seen_uuids):
        problems.append(f"gpu_memory_used_bytes labels {sorted(seen_uuids)} against nvidia-smi {gpus}")
    print(f"{len(taken)} scrapes; GPUs exposed {sorted(seen_uuids)}; nvidia-smi {gpus}")
    for name in ("process_gpu_memory_allocated_bytes", "process_gpu_memory_reserved_bytes",
                 "process_gpu_memory_used_bytes", "process_resident_memory_bytes",
                 "process_gpu_memory_allocated_peak_bytes", "process_phase"):
        rows = [(labels, v) for s in taken for labels, v in s.get(P + name, [])]
        top = max((v for _, v in rows), default=None)
        gpu_rows = [labels for labels, _ in rows if "UUID" in labels]
        bad = [labels for labels in gpu_rows if gpus.get(labels.get("gpu")) != labels["UUID"]]
        print(f"{name:48s} {len(rows):5d} samples, max {top if top is None else f'{top / 2**30:.3f} GiB' if 'bytes' in name else top}")
        if not rows or (name != "process_phase" and not top):
            problems.append(f"{name}: no sample above 0")
        if bad:
            problems.append(f"{name}: UUID not NVML's in {bad[:2]}")
    peaks = [v for s in taken for _, v in s.get(P + "process_gpu_memory_allocated_peak_bytes", [])]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from miles_profile.logdir.reader import load_run  # noqa: E402  (the log's own peak, for the comparison)
    run_dirs = [p for p in (work / "logs").iterdir() if p.is_dir()]
    if run_dirs:
        samples = load_run(run_dirs[0]).samples
        peak_columns = [c for c in samples.columns if c.endswith("_alloc_peak")]
        recorded = max((float(samples[c].max()) for c in peak_columns), default=0.0)
        print(f"largest scraped allocated peak {max(peaks, default=0) / 2**30:.3f} GiB; "
              f"the log's largest recorded peak {recorded / 2**30:.3f} GiB")
    for p in problems:
        print("FAIL:", p)
    print("PASS" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
