"""The benchmark's Ray job: on each node two actors of the same class run the same steps of fixed CPU work
(about 30 ms each, each step a `train` phase), one recorded, one not (its runtime env blanks
MILES_PROFILE_RUN_DIR, so its phases stay one function call). The driver asks them in turn, step by step,
in ABBA order (recorded first on even steps, plain first on odd ones): a machine whose load drifts
slows both alike, and the pair's ratio keeps the recorder's cost.

Prints {"init_s": driver's ray.init, "steps": {node: {"recorded": [[wall s, cpu s]...], "plain": [...]}}}.
Usage: python bench/ray_step_job.py STEPS   (RAY_ADDRESS names the cluster; STEPS 0: ray.init only)"""
import json
import os
import sys
import time

import ray

import miles_profile as mp

NODES = ("head", "node2")  # the custom resources of bench_ray's cluster (tests/ray_cluster.py)


@ray.remote(num_cpus=0)
class Stepper:
    def step(self, i: int) -> tuple[float, float]:
        """(wall s, CPU s of the whole process: the recorder's sampler thread included)."""
        start, cpu = time.perf_counter(), time.process_time()
        with mp.phase("train", rollout_id=i):
            total = 0
            for k in range(300_000):  # pure Python: the GIL is what a sampler thread competes for
                total += k * k
        return time.perf_counter() - start, time.process_time() - cpu


def main() -> int:
    steps = int(sys.argv[1])
    start = time.perf_counter()
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
    init_s = time.perf_counter() - start
    out: dict = {"init_s": init_s, "steps": {}}
    if steps:
        pairs = {node: {"recorded": Stepper.options(resources={node: 0.1}).remote(),
                        "plain": Stepper.options(resources={node: 0.1},
                                                 runtime_env={"env_vars": {"MILES_PROFILE_RUN_DIR": ""}}).remote()}
                 for node in NODES}
        out["steps"] = {node: {"recorded": [], "plain": []} for node in NODES}
        for i in range(steps):
            for node, pair in pairs.items():
                for mode in (("recorded", "plain") if i % 2 == 0 else ("plain", "recorded")):
                    out["steps"][node][mode].append(ray.get(pair[mode].step.remote(i)))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
