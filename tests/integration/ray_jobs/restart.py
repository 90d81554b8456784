"""A Ray job whose actor Ray restarts (`max_restarts=1`): a training rank on node2 (RANK 0 of 1) whose
first process is killed (SIGKILL) in the train phase of iteration 1; Ray starts a new process under the
same actor id, the driver retries the step there, and the job finishes its 3 iterations and exits 0.
Prints `pids A B` (the two processes). RAY_ADDRESS names the cluster."""
import os
import signal
import sys
import time
import warnings

import ray

import miles_profile as mp

MB = 1024 * 1024


@ray.remote(num_cpus=0, max_restarts=1, max_task_retries=0)
class Rank:
    def step(self, iteration: int) -> int:
        with mp.phase("generate", rollout_id=iteration):
            time.sleep(0.2)
        with mp.phase("train", rollout_id=iteration):
            state = bytearray(50 * MB)
            state[:: 4096] = b"x" * len(state[:: 4096])
            time.sleep(0.5)
            with warnings.catch_warnings():  # Ray's note about its own internals
                warnings.simplefilter("ignore")
                first = not ray.get_runtime_context().was_current_actor_reconstructed
            if iteration == 1 and first:
                os.kill(os.getpid(), signal.SIGKILL)
        with mp.phase("offload_train", target="disk", expected_bytes=50 * MB):
            del state
            time.sleep(0.2)
        return os.getpid()


def main() -> int:
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level="ERROR")
    env = {"RANK": "0", "WORLD_SIZE": "1", "MILES_PROFILE_ROLE": "actor"}
    rank = Rank.options(resources={"node2": 0.1}, name="rank0", runtime_env={"env_vars": env}).remote()
    pids = []
    for iteration in range(3):
        deadline = time.monotonic() + 180  # a worker takes seconds to start on a loaded machine
        while True:  # the step in flight when the first process died fails: again, until the new one runs it
            try:
                pids.append(ray.get(rank.step.remote(iteration)))
                break
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                print(f"iteration {iteration}: the actor is gone or restarting ({type(exc).__name__})", flush=True)
                if time.monotonic() > deadline:
                    return 1
                time.sleep(0.5)
    print("pids", *dict.fromkeys(pids), flush=True)
    return 0 if len(set(pids)) == 2 and len(pids) == 3 else 1


if __name__ == "__main__":
    sys.exit(main())
