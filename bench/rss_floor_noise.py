"""The scatter of host RSS's per-iteration floor on a healthy run: what `resolution.py` takes as the
resolution of `rss` (docs/checks.md, "Resolution").

    python -m bench.rss_floor_noise RUN_DIR [RUN_DIR ...]     # runs recorded with `record`
    python -m bench.rss_floor_noise --torch-loop N            # a plain torch loop, recorded here

For each run: the lowest RSS of each iteration (by rollout_id) of its main process, the warm-up
iteration left out, then the residuals around their Theil-Sen line: their median absolute deviation
(scaled to a standard deviation) and their largest absolute value.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

MiB = 1024 ** 2
LOOP = """
import torch, miles_profile as mp
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
opt = torch.optim.AdamW(model.parameters())
for k in range({n}):
    with mp.phase("generate", rollout_id=k):
        with torch.no_grad():
            out = [model(torch.randn(256, 512)) for _ in range(20)]
        del out
    with mp.phase("train", rollout_id=k):
        for _ in range(10):
            loss = model(torch.randn(256, 512)).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
"""


def floors_of(path: Path) -> np.ndarray:
    from miles_profile.logdir.reader import load_run
    from miles_profile.runmodel.series import main_pid, series_arrays
    from miles_profile.runmodel.stats import phase_instances
    run = load_run(path)
    pid = main_pid(run)
    inst = phase_instances(run)
    spans = inst[(inst["pid"] == pid) & (inst["iteration"] >= 0)].groupby("iteration").agg(
        start=("start", "min"), end=("end", "max")).sort_index()
    t, rss = series_arrays(run, pid, "rss")
    return np.array([np.nanmin(rss[(t > s) & (t <= e)]) for s, e in zip(spans["start"], spans["end"])])


def scatter(floors: np.ndarray) -> dict:
    from scipy.stats import median_abs_deviation, theilslopes
    y = floors[1:]  # the first iteration is warm-up
    x = np.arange(len(y), dtype=float)
    slope, intercept, _, _ = theilslopes(y, x)
    residual = y - (intercept + slope * x)
    return dict(iterations=len(y), slope_mib=slope / MiB,
                mad_sd_mib=median_abs_deviation(residual, scale="normal") / MiB,
                max_abs_mib=float(np.max(np.abs(residual))) / MiB)


def record_torch_loop(n: int, log_dir: Path) -> Path:
    program = log_dir / "loop.py"
    program.write_text(LOOP.format(n=n))
    subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(log_dir / "logs"), "--exec", "--",
                    sys.executable, str(program)], check=True, stdout=subprocess.DEVNULL)
    return next(p for p in (log_dir / "logs").iterdir() if p.is_dir())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--torch-loop", type=int, default=0, help="record a plain torch loop of N iterations")
    args = parser.parse_args(argv)
    runs = list(args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        if args.torch_loop:
            runs.append(record_torch_loop(args.torch_loop, Path(tmp)))
        for run in runs:
            floors = floors_of(run)
            print(run.name, " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                     for k, v in scatter(floors).items()),
                  "floors_mib=" + ",".join(f"{f / MiB:.1f}" for f in floors))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
