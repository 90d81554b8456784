"""A Ray job as a user writes it, knowing nothing of the recorder but `miles_profile.phase`: one actor on
each node (custom resources `head` and `node2`), each generating, training, then offloading 50 MB of its
state (freed from the host, as a disk offload does). The second actor passes env_vars of its own.

    python two_actors.py [--iterations N] [--tolerate-loss] [--drop-hook] [--blank-run-dir] [--fail-early]
                         [--stranger]

--tolerate-loss: when the node2 actor dies (its node lost), go on with the head actor and exit 3.
--drop-hook: remove RAY_RUNTIME_ENV_HOOK before ray.init (a program that replaces it; as an old Ray).
--blank-run-dir: the node2 actor's runtime env blanks MILES_PROFILE_RUN_DIR (it replaced ours).
--fail-early: raise after ray.init, before any actor starts.
--stranger: a worker of another cluster on this machine with this job's id (each cluster counts its jobs
  from 1): `ray::Trainer.step`, RAY_JOB_ID of this job, another raylet's pid, no run directory. Not ours.
RAY_ADDRESS names the cluster."""
import argparse
import atexit
import os
import subprocess
import sys
import time

import ray

import miles_profile as mp

MB = 1024 * 1024


@ray.remote(num_cpus=0)
class Trainer:
    def step(self, iteration: int) -> int:
        with mp.phase("generate", rollout_id=iteration):
            time.sleep(0.3)
        with mp.phase("train", rollout_id=iteration):
            state = bytearray(50 * MB)
            state[:: 4096] = b"x" * len(state[:: 4096])  # touched: resident
            time.sleep(0.3)
        with mp.phase("offload_train", target="disk", expected_bytes=50 * MB):
            del state
            time.sleep(0.3)
        return os.getpid()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=2)
    for flag in ("--tolerate-loss", "--drop-hook", "--blank-run-dir", "--fail-early", "--stranger"):
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args()
    if args.drop_hook:
        os.environ.pop("RAY_RUNTIME_ENV_HOOK", None)
    strangers: list[subprocess.Popen] = []
    atexit.register(lambda: [p.kill() for p in strangers])  # before ray.init: runs after the recorder's last pull
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level="ERROR")
    if args.stranger:
        env = {key: value for key, value in os.environ.items() if not key.startswith("MILES_PROFILE")}
        env.update(RAY_JOB_ID=ray.get_runtime_context().get_job_id(), RAY_RAYLET_PID=str(os.getpid()))
        strangers.append(subprocess.Popen(["ray::Trainer.step", "60"], executable="/bin/sleep", env=env))
        print(f"stranger pid {strangers[0].pid}", flush=True)
    if args.fail_early:
        raise SystemExit("job failed before its actors started")
    env_vars = {"USER_FLAG": "1", **({"MILES_PROFILE_RUN_DIR": ""} if args.blank_run_dir else {})}
    actors = {"head": Trainer.options(resources={"head": 0.1}, name="trainer-head").remote(),
              "node2": Trainer.options(resources={"node2": 0.1}, runtime_env={"env_vars": env_vars}).remote()}
    lost = False
    for iteration in range(args.iterations):
        refs = {where: actor.step.remote(iteration) for where, actor in actors.items()}
        for where, ref in refs.items():
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                if not args.tolerate_loss:
                    raise
                actors.pop(where)
                lost = True
        print(f"iteration {iteration} done", flush=True)
    return 3 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
