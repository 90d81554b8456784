"""A Ray job whose actor grows until Ray's memory monitor kills it: on the node with resource `node3`
(started with a low RAY_memory_usage_threshold), it trains, growing 100 MiB every 0.1 s. The driver sees
Ray's OutOfMemoryError (or the actor's death), says so and exits 0, as a job that handles it would."""
import os
import sys
import time

import ray

import miles_profile as mp

MIB = 1024 * 1024


@ray.remote(num_cpus=0, max_restarts=0)
class Hog:
    def grow(self, steps: int) -> str:
        held = []
        with mp.phase("train", rollout_id=0):
            for _ in range(steps):
                block = bytearray(100 * MIB)
                block[:: 4096] = b"x" * len(block[:: 4096])  # resident
                held.append(block)
                time.sleep(0.1)
        return "survived"


def main() -> int:
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level="ERROR")
    hog = Hog.options(resources={"node3": 0.1}, name="hog").remote()
    try:
        print(ray.get(hog.grow.remote(int(sys.argv[1]) if len(sys.argv) > 1 else 60)), flush=True)
    except (ray.exceptions.OutOfMemoryError, ray.exceptions.RayActorError) as exc:
        print(f"the hog died: {type(exc).__name__}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
