"""Recording Ray jobs on a real two-node cluster (issue 31): `ray start --head` and a second node on this
machine, started before the job with its own temp dir, resources, host name and node-local log dir (no
shared path with the driver), and stopped by its processes' ids (never `ray stop`). One cluster for the
module; the test that kills a node runs last."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import miles_profile as mp
from miles_profile.cluster.env import NODE_LOG_DIR_ENV
from miles_profile.identity import HOST_ENV
from miles_profile.logdir.cluster import read_cluster
from miles_profile.runmodel.forecast import stored_plan
from miles_profile.verdicts.oom import check_oom
from miles_profile.verdicts.per_process import per_process_checks
from tests.conftest import python_env
from tests.ray_cluster import add_node, start_cluster
from trainer.args import parse_args
from trainer.plan import forecast

pytestmark = pytest.mark.slow
JOB = Path(__file__).with_name("ray_jobs") / "two_actors.py"
OOM_JOB = JOB.with_name("ray_oom.py")
RESTART_JOB = JOB.with_name("restart.py")
NODE2_HOST = "fakehost2"
PHASES = ("generate", "train", "offload_train")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("ray")
    node2_logs = tmp_path_factory.mktemp("node2-logs")
    found = start_cluster(python_env(), {HOST_ENV: NODE2_HOST, NODE_LOG_DIR_ENV: str(node2_logs)})
    found.node2_logs = node2_logs
    yield found
    print(f"\nthe Ray cluster's own processes used {found.cpu_s():.1f} CPU-s", file=sys.stderr)  # pytest -s shows it
    found.stop()
    assert not found.processes(), "the cluster's processes outlived their kill"


def record(cluster, log_dir: Path, *job_args: str, command: list[str] | None = None, **popen) -> subprocess.Popen:
    argv = [sys.executable, "-m", "miles_profile.record", "--log-dir", str(log_dir), "--exec", "--",
            *(command or [sys.executable, str(JOB), *job_args])]
    return subprocess.Popen(argv, env=dict(cluster.env, RAY_ADDRESS=cluster.address), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def finished(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def the_run(log_dir: Path) -> Path:
    (run_dir,) = [p for p in log_dir.iterdir() if p.is_dir()]
    return run_dir


def gone(pids, timeout_s: float = 20.0) -> list[int]:
    """The pids still running after `timeout_s` (zombies count as gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def ours(run_dir: Path, run) -> list[int]:
    """Every process of ours and of the job's actors: samplers from cluster.json, actors from their metas."""
    doc = read_cluster(run_dir)
    return [n["sampler_pid"] for n in doc["nodes"] if n.get("sampler_pid")] + [
        p["pid"] for p in run.processes if p.get("ray_actor_class")]


def stranger(out: str) -> int:
    return int(next(line.split()[-1] for line in out.splitlines() if line.startswith("stranger pid ")))


def test_every_actor_on_both_nodes_is_recorded_and_the_node_local_logs_are_gathered(cluster, tmp_path):
    # --stranger: a `ray::Trainer.step` of another cluster on this machine with this job's id (each cluster
    # counts its jobs from 1: seen in full runs beside other people's test clusters) is not this job's
    code, out, err = finished(record(cluster, tmp_path / "logs", "--stranger"))
    assert code == 0, err[-3000:]
    assert "Traceback" not in err
    run_dir = the_run(tmp_path / "logs")
    run = mp.load(run_dir)
    actors = [p for p in run.processes if p.get("ray_actor_class") == "Trainer"]
    assert sorted(p["host"] for p in actors)[0] == NODE2_HOST and len(actors) == 2
    assert len({p["ray_node_id"] for p in actors}) == 2 and {p["ray_job_id"] for p in actors} != {None}
    assert {p.get("ray_actor_name") for p in actors} == {"trainer-head", None}
    for actor in actors:
        mine = run.phases[run.phases["pid"] == actor["pid"]]
        assert sorted(mine["name"]) == sorted(PHASES * 2), (actor["host"], list(mine["name"]))
    offload = next(r for r in per_process_checks(run) if r.name == "offload_drop")
    judged = [f for f in offload.findings if f.numbers.get("pid") in {p["pid"] for p in actors}]
    assert len(judged) == 4 and all(f.status == "pass" for f in judged), [f.message for f in judged]
    # node2 wrote into its own log dir; its files reached the driver's run through Ray
    doc = read_cluster(run_dir)
    assert not doc["unreached"], (doc["unreached"], stranger(out))
    node2 = next(n for n in doc["nodes"] if n["host"] == NODE2_HOST)
    assert node2["state"] == "stopped" and not node2["shared"]
    assert Path(node2["node_dir"]).parent == cluster.node2_logs
    stem = next(p["stem"] for p in actors if p["host"] == NODE2_HOST)
    assert (Path(node2["node_dir"]) / f"{stem}.samples.csv").is_file() and (run_dir / f"{stem}.samples.csv").is_file()
    assert list(run_dir.glob(f"{NODE2_HOST}-*.host.csv")), "node2's host sampler"
    # each node's sampler said how long its start took; a bound here only guards a hang (the time itself is
    # bench/bench_ray.py's: a loaded CI machine is no place for a 2 s bound)
    assert all(0 <= n["start_s"] < 60 for n in doc["nodes"]), [n["start_s"] for n in doc["nodes"]]
    assert not [w for w in run.warnings if "Ray" in w], run.warnings
    assert not gone(ours(run_dir, run)), "a sampler or actor outlived the job"


def test_ray_job_submit_is_recorded_with_the_submissions_own_runtime_env(cluster, tmp_path):
    submit = [str(Path(sys.executable).with_name("ray")), "job", "submit", "--address", cluster.dashboard,
              "--runtime-env-json", json.dumps({"env_vars": {"USER_SUBMIT": "1"}}), "--",
              sys.executable, str(JOB)]
    code, out, err = finished(record(cluster, tmp_path / "logs", command=submit))
    assert code == 0, (out[-2000:], err[-2000:])
    run = mp.load(the_run(tmp_path / "logs"))
    actors = [p for p in run.processes if p.get("ray_actor_class") == "Trainer"]
    assert sorted(p["host"] for p in actors)[0] == NODE2_HOST and len(actors) == 2
    assert set(run.phases["name"]) == set(PHASES)


def test_workers_the_run_could_not_reach_are_said_never_a_run_without_phases(cluster, tmp_path):
    # (a) the driver replaced our hook: nothing of the job's could be recorded
    code, out, err = finished(record(cluster, tmp_path / "a", "--drop-hook"))
    assert code == 0, err[-3000:]
    assert "hook never ran" in err and "phases its workers tagged were not recorded" in err
    run = mp.load(the_run(tmp_path / "a"))
    assert any("hook never ran" in w for w in run.warnings), run.warnings
    # (b) one actor's runtime env blanked the run directory: that worker is named, once (both nodes'
    # samplers see this machine's processes), and another cluster's worker with this job's id is not
    code_b, out_b, err_b = finished(record(cluster, tmp_path / "b", "--blank-run-dir", "--stranger"))
    assert code_b == 0, err_b[-3000:]
    run_dir = the_run(tmp_path / "b")
    doc = read_cluster(run_dir)
    unreached = doc["unreached"]
    assert len(unreached) == 1 and unreached[0]["title"].startswith("ray::Trainer"), (unreached, doc["nodes"])
    assert unreached[0]["pid"] != stranger(out_b)
    run = mp.load(run_dir)
    assert any("1 worker process(es)" in w and "ray::Trainer" in w for w in run.warnings), run.warnings


def test_a_job_failing_before_its_actors_start_returns_its_code_and_leaves_nothing(cluster, tmp_path):
    code, out, err = finished(record(cluster, tmp_path / "logs", "--fail-early"))
    assert code == 1 and "job failed before its actors started" in err
    assert "Traceback" not in err
    run_dir = the_run(tmp_path / "logs")
    assert not gone(ours(run_dir, mp.load(run_dir)))


def test_kill_9_of_the_driver_leaves_nothing_of_ours_running(cluster, tmp_path):
    proc = record(cluster, tmp_path / "logs", "--iterations", "60")
    run_dir = driver = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # until both nodes sample and node2's actor is gathered
        time.sleep(0.5)
        found = [p for p in (tmp_path / "logs").glob("*/cluster.json")]
        doc = read_cluster(found[0].parent) if found else None
        if doc and any(n["stems"] for n in doc.get("nodes", [])) and all(
                n["state"] == "running" for n in doc["nodes"]) and len(doc["nodes"]) == 2:
            run_dir, driver = found[0].parent, doc["driver_pid"]
            break
    assert driver, proc.communicate()
    time.sleep(1.0)
    psutil.Process(driver).send_signal(signal.SIGKILL)
    code, out, err = finished(proc)
    assert code == 128 + signal.SIGKILL
    run = mp.load(run_dir)
    assert not gone(ours(run_dir, run)), "a sampler or actor outlived the driver's kill -9"
    assert any("not all gathered" in w for w in run.warnings), run.warnings


TRAINER_FLAGS = ["--preset", "tiny", "--num-rollout", "2", "--offload-train", "--offload-rollout", "--use-critic"]


def progress(text: str) -> list[str]:
    """rank 0's `rollout k/N  reward R  loss L` lines, without the step time (and Ray's prefix)."""
    return [line[line.index("rollout "):].rsplit("  step", 1)[0] for line in text.splitlines() if "rollout " in line
            and " reward " in line]


def test_the_trainer_on_ray_trains_as_under_torchrun_and_every_actor_is_recorded(cluster, tmp_path):
    env = dict(cluster.env, RAY_ADDRESS=cluster.address)
    code, out, err = finished(subprocess.Popen(
        [sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path / "logs"), "--", "--launcher", "ray",
         "--nproc-per-node", "2", *TRAINER_FLAGS], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    assert code == 0, err[-3000:]
    torchrun = subprocess.run([sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node", "2", "-m",
                               "trainer.train", *TRAINER_FLAGS], env=cluster.env, capture_output=True, text=True,
                              timeout=300)
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    assert progress(out + err) == progress(torchrun.stdout + torchrun.stderr) != []  # same losses, same rewards
    run = mp.load(the_run(tmp_path / "logs"))
    ranks = sorted((p["rank"], p.get("ray_bundle_index"), p.get("ray_actor_class")) for p in run.processes
                   if p.get("role") == "actor")
    assert ranks == [(0, 0, "RankActor"), (1, 1, "RankActor")]
    # the critic is an actor of its own in its rank's bundle (as Miles runs it), offloading its own state
    critics = sorted((p["rank"], p.get("ray_bundle_index"), p.get("ray_actor_class"), p["pid"]) for p in run.processes
                     if p.get("role") == "critic")
    assert [c[:3] for c in critics] == [(0, 0, "CriticActor"), (1, 1, "CriticActor")], critics
    offload = next(r for r in per_process_checks(run) if r.name == "offload_drop")

    def verdicts(pid):  # its offload_train phases as the check judged them
        return [(f.iteration, f.status) for f in offload.findings if f.numbers.get("pid") == pid
                and f.phase == "offload_train"]
    rank0 = next(p["pid"] for p in run.processes if p.get("role") == "actor" and p["rank"] == 0)
    for *_, pid in critics:  # judged as the rank's own offloads are (CPU state: nothing to move, said so)
        assert {"train", "offload_train", "onload_train"} <= set(run.phases[run.phases["pid"] == pid]["name"])
        assert verdicts(pid) == verdicts(rank0) != [], (verdicts(pid), verdicts(rank0))
    assert sorted(p["rank"] for p in run.processes if p.get("role") == "engine") == [0, 1]
    assert check_oom(run).status == "n/a" and not run.warnings, run.warnings
    assert {"offload_train", "offload_rollout", "train", "generate"} <= set(run.phases["name"])
    # the rank's forecast is its own process's: the critic's state is in the critic's (+99.6 % on an H100 when
    # it held both); the forecast of the same flags without the critic
    _, plan = stored_plan(run)
    alone = forecast(parse_args([f for f in TRAINER_FLAGS if f != "--use-critic"] + ["--rollout-engine", "server"],
                                cuda_available=False, world_size=2, check_environment=False))
    assert plan["phases"] == alone.to_json()["phases"]


def test_a_worker_killed_by_rays_memory_monitor_is_named_with_its_actor_phase_and_curve(cluster, tmp_path):
    """A third node whose raylet kills workers 1.5 GiB above what this machine uses now (Ray's memory
    monitor reads the whole machine's memory); the job's actor there grows 100 MiB per 0.1 s."""
    vm = psutil.virtual_memory()
    threshold = (vm.total - vm.available + 1536 * 2**20) / vm.total
    add_node(cluster, '{"node3": 1}', {"RAY_memory_usage_threshold": f"{threshold:.4f}",
                                       "RAY_memory_monitor_refresh_ms": "100", HOST_ENV: "fakehost3"})
    code, out, err = finished(record(cluster, tmp_path / "logs", command=[sys.executable, str(OOM_JOB), "60"]))
    assert code == 0 and "the hog died" in out, (out, err[-3000:])
    run = mp.load(the_run(tmp_path / "logs"))
    result = check_oom(run)
    assert len(result.findings) == 1, (result.summary, err[-3000:], read_cluster(run.path))
    finding = result.findings[0]
    assert finding.numbers["cause"] == "ray_oom_kill" and finding.numbers["host"] == "fakehost3"
    assert "killed by Ray's memory monitor" in finding.message and "Ray actor Hog 'hog'" in finding.message
    assert finding.numbers["phase"] == "train" and "over Ray's threshold" in finding.message
    assert finding.numbers["grew"][0]["growth"] > 512 * 2**20  # the curve before: its RSS climbed


def test_an_actor_ray_restarted_is_one_actor_in_two_processes_the_first_killed_not_a_lost_rank(cluster, tmp_path):
    """max_restarts=1: rank 0's first process is SIGKILLed in train of iteration 1, Ray starts another
    under the same actor id, the job retries the step there and exits 0."""
    code, out, err = finished(record(cluster, tmp_path / "logs", command=[sys.executable, str(RESTART_JOB)]))
    assert code == 0, (out[-2000:], err[-3000:])
    first, second = (int(p) for p in next(line for line in out.splitlines() if line.startswith("pids ")).split()[1:])
    run = mp.load(the_run(tmp_path / "logs"))
    procs = {p["pid"]: p for p in run.processes}
    assert procs[first]["ray_actor_id"] == procs[second]["ray_actor_id"] and procs[second]["ray_restarted"]
    assert procs[first]["ray_restarted_as"] == second and procs[first]["rank"] == procs[second]["rank"] == 0
    assert any("Ray restarted actor Rank 'rank0'" in w and f"pid {first}" in w and f"pid {second}" in w
               for w in run.warnings), run.warnings
    assert not any("end_time" in w or "ranks are not in the report" in w for w in run.warnings), run.warnings
    result = check_oom(run)  # killed, named with the phase it died in and the process that took over
    (finding,) = result.findings
    assert finding.numbers["pid"] == first and finding.numbers["ray_restarted_as"] == second
    assert (finding.numbers["phase"], finding.numbers["iteration"]) == ("train", 1), finding.message
    assert "Ray restarted the actor as pid" in finding.message
    iterations = run.phases[run.phases["pid"] == second]["rollout_id"]
    assert set(iterations.dropna().astype(int)) == {1, 2}  # the retried step and the last, on the new process


def test_a_node_lost_mid_run_names_its_processes_and_the_rest_is_reported(cluster, tmp_path):
    """Last in the module: node2 does not come back."""
    proc = record(cluster, tmp_path / "logs", "--iterations", "10", "--tolerate-loss")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        found = list((tmp_path / "logs").glob(f"*/{NODE2_HOST}-*.events.jsonl"))
        if found and b'"offload_train"' in found[0].read_bytes():  # node2's first iteration was gathered
            break
        time.sleep(0.5)
    for p in cluster.node_processes(1):
        try:
            p.kill()
        except psutil.Error:
            pass
    code, out, err = finished(proc)
    assert code == 3, err[-3000:]  # the job saw its node2 actor die and finished on the head node
    run_dir = the_run(tmp_path / "logs")
    run = mp.load(run_dir)
    lost = next(n for n in read_cluster(run_dir)["nodes"] if n["host"] == NODE2_HOST)
    assert lost["state"] == "lost" and lost["stems"]
    assert any("was lost at" in w and lost["stems"][0] in w for w in run.warnings), run.warnings
    head = next(p["pid"] for p in run.processes if p.get("ray_actor_name") == "trainer-head")
    assert (run.phases["pid"] == head).sum() == 10 * len(PHASES)
    node2 = next(p["pid"] for p in run.processes if p.get("host") == NODE2_HOST and p.get("ray_actor_class"))
    assert (run.phases["pid"] == node2).sum() >= len(PHASES)
