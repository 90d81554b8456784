"""The pure parts of recording Ray jobs (issue 31): what the hook adds to a job's runtime env, how
`record` rewrites `ray job submit`, where a node writes, and what the reader says of cluster.json."""
from __future__ import annotations

import json

import pytest

from miles_profile import names
from miles_profile.cluster import env as cluster_env
from miles_profile.cluster import launch
from miles_profile.errors import MilesProfileError
from miles_profile.logdir.cluster import cluster_warnings, write_cluster


@pytest.fixture
def hook(monkeypatch, tmp_path):
    """The hook as Ray calls it, in a driver whose run is `tmp_path`; Ray's post-init list restored after."""
    ray_worker = pytest.importorskip("ray._private.worker")
    monkeypatch.setenv(names.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(ray_worker, "_post_init_hooks", [])
    from miles_profile.cluster.hook import runtime_env_hook
    return runtime_env_hook


def test_the_hook_adds_the_run_and_keeps_every_field_and_variable_the_job_set(hook, tmp_path):
    user = {"env_vars": {"A": "1", names.RUN_DIR_ENV: "/theirs"}, "worker_process_setup_hook": "m.f", "pip": ["x"]}
    merged = hook(json.loads(json.dumps(user)))
    assert merged["env_vars"] == {"A": "1", names.RUN_DIR_ENV: "/theirs"}  # theirs wins: no merge conflict
    assert merged["worker_process_setup_hook"] == "m.f" and merged["pip"] == ["x"]
    assert hook(None)["env_vars"] == {names.RUN_DIR_ENV: str(tmp_path)}
    assert json.loads((tmp_path / "cluster.json").read_text())["connected"] is False  # it ran, said before connecting


def test_the_hook_calls_the_users_own_hook_first(hook, monkeypatch):
    monkeypatch.setenv("MILES_PROFILE_NEXT_RUNTIME_ENV_HOOK", "json.loads")  # any importable callable
    with pytest.raises(TypeError):  # json.loads(None): the user's hook really ran
        hook(None)
    env = launch.with_hook({"RAY_RUNTIME_ENV_HOOK": "theirs.hook"})
    assert env["RAY_RUNTIME_ENV_HOOK"] == cluster_env.HOOK and env["MILES_PROFILE_NEXT_RUNTIME_ENV_HOOK"] == "theirs.hook"


def test_job_submit_carries_the_run_in_the_submissions_runtime_env():
    env = {names.RUN_DIR_ENV: "/logs/run-1", "PATH": "/bin"}
    command = ["/venv/bin/ray", "job", "submit", "--runtime-env-json", '{"env_vars": {"MINE": "2"}, "pip": ["x"]}',
               "--", "python", "job.py", "--runtime-env-json", "not ours"]
    assert launch.is_job_submit(command) and not launch.is_job_submit(["python", "ray", "job"])
    out = launch.submit_command(command, env)
    assert out[out.index("--"):] == ["--", "python", "job.py", "--runtime-env-json", "not ours"]
    runtime_env = json.loads(out[out.index("--runtime-env-json") + 1])
    assert runtime_env["pip"] == ["x"]
    assert runtime_env["env_vars"] == {"MINE": "2", names.RUN_DIR_ENV: "/logs/run-1",
                                       "RAY_RUNTIME_ENV_HOOK": cluster_env.HOOK}
    with pytest.raises(MilesProfileError, match="--runtime-env-json"):
        launch.submit_command(["ray", "job", "submit", "--runtime-env", "env.yaml", "--", "python"], env)


def test_a_worker_on_a_node_with_its_own_log_dir_writes_a_run_of_the_same_name_there(monkeypatch, tmp_path):
    shared = tmp_path / "logs" / "run-7"
    assert cluster_env.node_run_dir(shared) == shared  # not a Ray worker: as handed over
    monkeypatch.setenv(cluster_env.RAY_JOB_ID_ENV, "02000000")
    monkeypatch.setenv(cluster_env.NODE_LOG_DIR_ENV, str(tmp_path / "node"))
    monkeypatch.setenv("MILES_PROFILE_RUN_ID", "the-run")
    local = cluster_env.node_run_dir(shared)
    assert local == tmp_path / "node" / "run-7"
    assert json.loads((local / "meta.json").read_text())["run_id"] == "the-run"


def test_the_reader_says_what_ray_cost_the_run(tmp_path):
    write_cluster(tmp_path, {"hook_ran": True, "connected": True, "nodes": [
        {"node_id": "aa" * 28, "host": "h1", "state": "stopped", "shared": True, "stems": ["h1-1"]},
        {"node_id": "bb" * 28, "host": "h2", "state": "lost", "lost_at": 0.0, "shared": False, "stems": ["h2-5"]},
        {"node_id": "cc" * 28, "host": "h3", "state": "running", "shared": False, "node_dir": "/d", "stems": []},
        {"node_id": "dd" * 28, "host": "h4", "state": "failed", "error": "ModuleNotFoundError: x"}],
        "unreached": [{"pid": 9, "title": "ray::Critic"}]})
    text = "\n".join(cluster_warnings(tmp_path, []))
    assert "Ray node bbbbbbbb (h2) was lost at" in text and "h2-5" in text
    assert "Ray node cccccccc (h3): its logs were not all gathered" in text and "/d" in text
    assert "no sampler started (ModuleNotFoundError: x)" in text
    assert "ray::Critic (pid 9)" in text and "h1" not in text
    write_cluster(tmp_path, {"hook_ran": False, "drivers": [12], "nodes": []})
    assert "hook never ran" in cluster_warnings(tmp_path, [])[0]
    assert cluster_warnings(tmp_path / "absent", []) == []
