"""Today's per-process recording cost, measured the way bench/ray_step_job.py measures an actor's: two
plain Python worker processes (no Ray) run the same ~15-30 ms step, one recorded (it inherits the run
directory of `record --exec`), one not (its MILES_PROFILE_RUN_DIR blanked), asked in turn step by step in
ABBA order over pipes.

Usage: python -m miles_profile.record --log-dir L --exec -- python bench/local_step_pair.py STEPS
Prints {"steps": {"local": {"recorded": [[wall s, cpu s]...], "plain": [...]}}} as JSON."""
import json
import os
import subprocess
import sys

WORKER = """
import sys, time
import miles_profile as mp
for line in sys.stdin:
    i = int(line)
    start, cpu = time.perf_counter(), time.process_time()
    with mp.phase("train", rollout_id=i):
        total = 0
        for k in range(300_000):  # the actor's step (bench/ray_step_job.py)
            total += k * k
    print(time.perf_counter() - start, time.process_time() - cpu, flush=True)
"""


def main() -> int:
    steps = int(sys.argv[1])
    workers = {"recorded": dict(os.environ), "plain": dict(os.environ, MILES_PROFILE_RUN_DIR="")}
    procs = {mode: subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True) for mode, env in workers.items()}
    out = {"recorded": [], "plain": []}
    try:
        for i in range(steps):
            for mode in (("recorded", "plain") if i % 2 == 0 else ("plain", "recorded")):
                procs[mode].stdin.write(f"{i}\n")
                procs[mode].stdin.flush()
                out[mode].append([float(x) for x in procs[mode].stdout.readline().split()])
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait(timeout=60)
    print(json.dumps({"steps": {"local": out}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
