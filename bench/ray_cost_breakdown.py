"""Where a recorded Ray actor's extra step cost goes (issue 31, round 3): the same step in a recorded and a
plain Ray actor, and in a recorded and a plain Python process under `record --exec`, with each process's
CPU split by thread (Linux schedstat: ns on CPU per thread) and the step split into its phase boundaries.

    python bench/ray_cost_breakdown.py [--rounds 2] [--steps 300] [--env KEY=VALUE ...] [--b-env KEY=VALUE ...]

`--env` sets a variable in the four measured processes: MILES_PROFILE_HEAP=0 (no heap read at the
boundaries), BREAKDOWN_PARTS=1 (each part of a boundary row timed, wall and CPU: `part:NAME` in the thread
table; the wrappers cost a little themselves), BREAKDOWN_MIMIC=1 (the control: in the two processes that
record nothing, the reads and writes of one phase's two boundary rows, done by hand right after the body
and timed apart: the same work in an unrecorded actor and in a plain process). `--b-env` adds a third
process of each kind, `recorded_b`, recorded with those variables as well, asked in turn with the other two
step by step: an A/B in one run (round 4: MILES_PROFILE_HEAP=0, the boundary work of a process with GPU
columns, which reads no heap at its boundaries).
Prints one JSON object: per kind (actor/local) and mode (recorded/plain), the means per step (µs) of wall,
process CPU, main-thread CPU, the phase's enter and exit (wall and this thread's CPU), the body's CPU and
the control's; each thread's CPU over the measured steps (ms per 100 steps, by name: `main`, our
`miles_profile-sampler`/`-host`, Ray's gRPC and io threads); and in the recorded processes each probe's
read and a whole row in a tight loop (median µs), the thread count, malloc arenas and mappings.
docs/ray.md ("Cost") reads the results (docs/bench/ray_cost/).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARM = 5


def _thread_names() -> dict[int, str]:
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        out[int(tid)] = names.get(int(tid), "") or comm
    return out


def thread_cpu_ns() -> dict[str, int]:
    """ns on CPU so far of every live thread of this process, by name (Python name, else the OS one)."""
    out: dict[str, int] = {}
    for tid, name in _thread_names().items():
        try:
            ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue
        key = "main" if tid == os.getpid() else name
        out[key] = out.get(key, 0) + ns
    return out


def malloc_arenas() -> int:
    """How many malloc arenas this process has (glibc's malloc_info, counted): mallinfo2 walks each."""
    import ctypes
    libc = ctypes.CDLL(None)
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    libc.open_memstream.restype = ctypes.c_void_p
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    text = ctypes.string_at(buf, size.value).decode()
    libc.free(buf)
    return text.count("<heap nr=")


class timed_probe:
    def __init__(self, probe, timed):
        self.name, self.columns = probe.name, probe.columns
        self.read = timed("probe_" + probe.name, probe.read)
        self.close = probe.close
        self.inner = probe


class Probe:
    """The measured step, the same in an actor and in a plain process."""

    def __init__(self):
        import miles_profile as mp
        self.mp = mp
        self.start_threads: dict[str, int] | None = None

    def _wrap(self) -> None:
        """Time the parts of a phase boundary: each wrapped call adds its perf_counter time to self.parts."""
        from miles_profile import recorder
        rec = recorder.active()
        self.parts: dict[str, float] = {}
        if rec is None:
            return

        def timed(name, fn):
            def run(*a, **k):
                t, c = time.perf_counter(), time.thread_time()
                try:
                    return fn(*a, **k)
                finally:
                    self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - t
                    self.parts[name + "@cpu"] = self.parts.get(name + "@cpu", 0.0) + time.thread_time() - c
            return run
        rec._note_cuda = timed("note_cuda", rec._note_cuda)
        sampler = rec._sampler
        sampler.sample = timed("sample", sampler.sample)
        sampler._writer.append = timed("writer_append", sampler._writer.append)
        rec._events.write = timed("event_write", rec._events.write)
        rec._summaries.open = timed("summaries_open", rec._summaries.open)
        rec._summaries.close = timed("summaries_close", rec._summaries.close)
        sampler._plan = [(timed_probe(p, timed), w, partial) for p, w, partial in sampler._plan]

    def step(self, i: int) -> list[float]:
        if i == WARM:
            self.start_threads = thread_cpu_ns()
            if os.environ.get("BREAKDOWN_PARTS"):
                self._wrap()
        wall, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
        ctx = self.mp.phase("train", rollout_id=i)
        t0, c0 = time.perf_counter(), time.thread_time()
        ctx.__enter__()
        t1, c1 = time.perf_counter(), time.thread_time()
        total = 0
        for k in range(300_000):  # pure Python: the GIL is what a sampler thread competes for
            total += k * k
        t2, c2 = time.perf_counter(), time.thread_time()
        ctx.__exit__(None, None, None)
        t3, c3 = time.perf_counter(), time.thread_time()
        mimic = self._mimic() if os.environ.get("BREAKDOWN_MIMIC") else [0.0, 0.0]
        return [time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - main,
                t1 - t0, t3 - t2, c1 - c0, c3 - c2, c2 - c1, *mimic]

    def _mimic(self) -> list[float]:
        """In a process that records nothing: the reads and writes of one phase's two boundary rows
        (the process probe, glibc's heap, a row and an event appended to files), each pair timed as
        this thread's CPU right after the step's body, as a recorded process does them. [heap s, rest s]"""
        from miles_profile import recorder
        if recorder.active() is not None:
            return [0.0, 0.0]
        if not hasattr(self, "_mimic_probe"):
            import tempfile
            from miles_profile.probes.process import OwnProcessProbe
            self._mimic_probe = OwnProcessProbe()
            self._mimic_file = open(tempfile.mkstemp(prefix="bd-mimic-")[1], "w")
        from miles_profile.probes.heap import heap_in_use
        c0 = time.thread_time()
        heap_in_use()
        heap_in_use()
        c1 = time.thread_time()
        for _ in range(2):
            values = self._mimic_probe.read()
            self._mimic_file.write(json.dumps({"t": time.time(), "kind": "begin", "name": "train", "v": values}) + "\n")
            self._mimic_file.flush()
        c2 = time.thread_time()
        return [c1 - c0, c2 - c1]

    def probe_costs(self, n: int = 300) -> dict[str, float]:
        """Median µs of each probe's read (as a boundary row reads it) and of a whole boundary row, in
        this process's recorder; {} when it records nothing."""
        from miles_profile import recorder
        rec = recorder.active()
        if rec is None:
            return {}
        out: dict[str, float] = {}
        for probe, _, partial in rec._sampler._plan:
            times = []
            for _ in range(n):
                t = time.perf_counter()
                probe.read(True) if partial else probe.read()
                times.append(time.perf_counter() - t)
            out[probe.name] = round(statistics.median(times) * 1e6, 2)
        for name, fn in (("status_read", lambda r: r.status.read()),
                         ("clear_refs", lambda r: r.clear_refs.write(b"5"))):
            process = next(p for p, _, _ in rec._sampler._plan if p.name == "process")
            reader = getattr(process, "inner", process)._reader
            times = []
            for _ in range(n):
                t = time.perf_counter()
                fn(reader)
                times.append(time.perf_counter() - t)
            out[name] = round(statistics.median(times) * 1e6, 2)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            rec._sampler.sample()
            times.append(time.perf_counter() - t)
        out["row"] = round(statistics.median(times) * 1e6, 2)
        out["threads"] = len(os.listdir("/proc/self/task"))
        out["malloc_arenas"] = malloc_arenas()
        out["maps"] = sum(1 for _ in open("/proc/self/maps"))
        return out

    def threads(self) -> dict[str, int]:
        end = thread_cpu_ns()
        start = self.start_threads or {}
        out = {name: ns - start.get(name, 0) for name, ns in end.items()}
        out.update({"part:" + k: int(v * 1e9) for k, v in getattr(self, "parts", {}).items()})
        return out


def ray_job(steps: int) -> dict:
    import ray
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
    Actor = ray.remote(num_cpus=0)(Probe)
    envs = mode_envs()
    pairs = {node: {mode: Actor.options(resources={node: 0.1}, runtime_env={"env_vars": env}).remote()
                    for mode, env in envs.items()}
             for node in ("head", "node2")}
    out = {node: {mode: [] for mode in envs} for node in pairs}
    for i in range(steps):
        for node, pair in pairs.items():
            for mode in step_order(list(envs), i):
                out[node][mode].append(ray.get(pair[mode].step.remote(i)))
    return {node: {mode: {"steps": out[node][mode], "threads": ray.get(actor.threads.remote()),
                          "probes": ray.get(actor.probe_costs.remote())}
                   for mode, actor in pair.items()} for node, pair in pairs.items()}


WORKER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from bench.ray_cost_breakdown import Probe
probe = Probe()
for line in sys.stdin:
    if line.strip() == "threads":
        print(json.dumps(probe.threads()), flush=True)
        continue
    if line.strip() == "probes":
        print(json.dumps(probe.probe_costs()), flush=True)
        break
    print(json.dumps(probe.step(int(line))), flush=True)
"""


def mode_envs() -> dict[str, dict[str, str]]:
    """The measured processes' own variables by mode: `recorded`, `plain` (records nothing) and, with
    `--b-env`, `recorded_b` (recorded with those variables too), asked in turn with the other two."""
    extra = json.loads(os.environ.get("BREAKDOWN_ENV", "{}"))
    b_env = json.loads(os.environ.get("BREAKDOWN_B_ENV", "{}"))
    envs = {"recorded": dict(extra), "plain": dict(extra, MILES_PROFILE_RUN_DIR="")}
    if b_env:
        envs["recorded_b"] = dict(extra, **b_env)
    return envs


def step_order(modes: list[str], i: int) -> list[str]:
    """Each step asks every mode once, the order rotated step by step (ABC, BCA, CAB, then reversed)."""
    k = i % len(modes)
    order = modes[k:] + modes[:k]
    return order[::-1] if (i // len(modes)) % 2 else order


def local_job(steps: int) -> dict:
    envs = {mode: dict(os.environ, **env) for mode, env in mode_envs().items()}
    procs = {mode: subprocess.Popen([sys.executable, "-c", WORKER, str(REPO)], env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True) for mode, env in envs.items()}
    out = {mode: [] for mode in envs}

    def ask(mode: str, line: str):
        procs[mode].stdin.write(line + "\n")
        procs[mode].stdin.flush()
        return json.loads(procs[mode].stdout.readline())

    for i in range(steps):
        for mode in step_order(list(envs), i):
            out[mode].append(ask(mode, str(i)))
    result = {"local": {mode: {"steps": out[mode], "threads": ask(mode, "threads"), "probes": ask(mode, "probes")}
                        for mode in procs}}
    for proc in procs.values():
        proc.stdin.close()
        proc.wait(timeout=60)
    return result


def _boundary_mean_se(values: list[float]) -> dict[str, float]:
    mean = statistics.mean(values)
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
    return {"boundary_cpu_us": round(mean * 1e6, 1), "boundary_cpu_se_us": round(se * 1e6, 1)}


def summarize(runs: list[dict]) -> dict:
    """Per kind and mode: medians per step (µs) and thread CPU (ms per 100 steps)."""
    table: dict = {}
    for run in runs:
        for node, modes in run.items():
            kind = "local" if node == "local" else "actor"
            for mode, got in modes.items():
                entry = table.setdefault(kind, {}).setdefault(mode, {"steps": [], "threads": {}, "n": 0, "probes": []})
                entry["probes"].append(got.get("probes") or {})
                entry["steps"] += got["steps"][WARM:]
                entry["n"] += len(got["steps"]) - WARM
                for name, ns in got["threads"].items():
                    entry["threads"][name] = entry["threads"].get(name, 0) + ns
    out: dict = {}
    for kind, modes in table.items():
        for mode, entry in modes.items():
            cols = list(zip(*entry["steps"]))
            out.setdefault(kind, {})[mode] = {
                **{name: round(statistics.mean(col) * 1e6, 1)
                   for name, col in zip(("wall_us", "cpu_us", "main_us", "enter_us", "exit_us",
                                             "enter_cpu_us", "exit_cpu_us", "body_cpu_us",
                                             "mimic_heap_us", "mimic_rest_us"), cols)},
                # the phase's two boundary rows, this thread's CPU, with the standard error of the mean: what
                # an A/B (--b-env) compares across modes
                **_boundary_mean_se([e + x for e, x in zip(cols[5], cols[6])]),
                "threads_ms_per_100_steps": {name: round(ns / 1e6 * 100 / entry["n"], 2)
                                             for name, ns in sorted(entry["threads"].items(), key=lambda x: -x[1])
                                             if ns > 0},
                "probe_us": {name: statistics.median(p[name] for p in entry["probes"] if name in p)
                             for name in entry["probes"][0]} if entry["probes"] and entry["probes"][0] else {},
            }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the measured processes")
    parser.add_argument("--b-env", action="append", default=[],
                        help="KEY=VALUE for a third process of each kind, recorded_b, asked in turn with the other two "
                             "(an A/B in one run: e.g. MILES_PROFILE_HEAP=0)")
    parser.add_argument("--job", choices=("ray", "local"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        print(json.dumps(ray_job(args.steps) if args.job == "ray" else local_job(args.steps)), flush=True)
        return 0
    sys.path.insert(0, str(REPO))
    from miles_profile.identity import HOST_ENV
    from tests.ray_cluster import start_cluster
    extra = dict(kv.split("=", 1) for kv in args.env)
    b_env = dict(kv.split("=", 1) for kv in args.b_env)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               BREAKDOWN_ENV=json.dumps(extra))
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-ray-bd-") as tmp:
        cluster = start_cluster(env, {HOST_ENV: "node2", "MILES_PROFILE_NODE_LOG_DIR": f"{tmp}/node2"})
        try:
            for i in range(args.rounds):
                for job in (("ray", "local") if i % 2 == 0 else ("local", "ray")):
                    command = [sys.executable, "-m", "miles_profile.record", "--log-dir", f"{tmp}/{job}-{i}",
                               "--exec", "--", sys.executable, __file__, "--job", job, "--steps", str(args.steps)]
                    done = subprocess.run(command, env=dict(cluster.env, RAY_ADDRESS=cluster.address,
                                                            BREAKDOWN_ENV=json.dumps(extra),
                                                            BREAKDOWN_B_ENV=json.dumps(b_env)),
                                          capture_output=True, text=True, timeout=1800)
                    if done.returncode != 0:
                        raise RuntimeError(done.stderr[-3000:])
                    runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        finally:
            cluster.stop()
    print(json.dumps({"rounds": args.rounds, "steps": args.steps, "env": extra, "b_env": b_env, "load_avg": os.getloadavg(),
                      **summarize(runs)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
