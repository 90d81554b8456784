"""A small program with phases that allocate and free host memory, for `record --exec` demos and tests.

    python -m miles_profile.record --exec -- python examples/phased_allocations.py --rounds 3
"""
import argparse
import time

import miles_profile as mp

MiB = 1024 ** 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=256, help="size of the 'weights' buffer")
    parser.add_argument("--hold-s", type=float, default=0.2)
    args = parser.parse_args()
    for rollout_id in range(args.rounds):
        with mp.phase("generate", rollout_id=rollout_id):
            kv_cache = bytearray(args.mib * MiB)  # zero-filled: really resident
            time.sleep(args.hold_s)
        with mp.phase("offload_rollout", rollout_id=rollout_id, tags=["kv_cache"], expected_bytes=len(kv_cache)):
            del kv_cache
        with mp.phase("train", rollout_id=rollout_id):
            grads = bytearray(args.mib * MiB // 2)
            time.sleep(args.hold_s)
            del grads
    mp.mark("done")


if __name__ == "__main__":
    main()
