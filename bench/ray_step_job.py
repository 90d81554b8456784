"""The benchmark's Ray job: one actor per node runs STEPS steps of fixed CPU work (about 30 ms each),
each step a `train` phase, and the driver prints the steps' durations and its own `ray.init` time as JSON.
Usage: python bench/ray_step_job.py STEPS   (RAY_ADDRESS names the cluster)"""
import json
import os
import sys
import time

import ray

import miles_profile as mp


@ray.remote(num_cpus=0)
class Stepper:
    def run(self, steps: int) -> list[float]:
        durations = []
        for i in range(steps):
            start = time.perf_counter()
            with mp.phase("train", rollout_id=i):
                total = 0
                for k in range(300_000):  # pure Python: the GIL is what a sampler thread competes for
                    total += k * k
            durations.append(time.perf_counter() - start)
        return durations


def main() -> int:
    steps = int(sys.argv[1])
    start = time.perf_counter()
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
    init_s = time.perf_counter() - start
    actors = [Stepper.options(resources={r: 0.1}).remote() for r in ("head", "node2")]
    durations = ray.get([a.run.remote(steps) for a in actors])
    print(json.dumps({"init_s": init_s, "durations": durations}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
