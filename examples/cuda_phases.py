"""A tiny CUDA program with phases that allocate and free device memory: checks the GPU probes.

    python -m miles_profile.record --exec -- python examples/cuda_phases.py     # sampled from outside
    python examples/cuda_phases.py --log-dir /tmp/memory_logs                    # in-process recorder
"""
import argparse
import contextlib
import time

import torch

import miles_profile as mp

GiB = 1024 ** 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log-dir", help="start an in-process recorder writing here")
    parser.add_argument("--gib", type=float, default=2.0)
    args = parser.parse_args()
    recorder = mp.Recorder(args.log_dir) if args.log_dir else contextlib.nullcontext()
    n = int(args.gib * GiB)
    with recorder:
        for rollout_id in range(2):
            with mp.phase("generate", rollout_id=rollout_id, tags=["kv_cache"]):
                kv = torch.empty(n, dtype=torch.uint8, device="cuda")
                spike = torch.empty(n // 2, dtype=torch.uint8, device="cuda")  # freed before any sample
                del spike
                time.sleep(0.1)
            with mp.phase("offload_rollout", rollout_id=rollout_id, tags=["kv_cache"], expected_bytes=n):
                del kv
                torch.cuda.empty_cache()
            with mp.phase("train", rollout_id=rollout_id):
                a = torch.randn(8192, 8192, device="cuda")
                for _ in range(10):
                    a = a @ a / 8192
                torch.cuda.synchronize()
            with mp.phase("offload_train", rollout_id=rollout_id, target="cpu", expected_bytes=a.nbytes):
                a = a.cpu()
                torch.cuda.empty_cache()
    print("done")


if __name__ == "__main__":
    main()
