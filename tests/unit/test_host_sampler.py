"""The host sampler: one per host (flock election, takeover), every GPU and every process on it, host
memory and cgroup; and the identity each process writes in its meta."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import miles_profile as mp
from miles_profile import identity
from miles_profile.host_sampler import HostSampler
from miles_profile.logdir.layout import new_run_dir
from miles_profile.logdir.writer import write_run_meta
from miles_profile.probes.cgroup import CgroupProbe
from miles_profile.probes.nvml_host import Gpu
from tests.conftest import REPO, python_env

GiB = 1024 ** 3


class FakeNvml:
    """A stand-in for the NVML library (the backend HostSampler takes), because this machine has no
    GPU: two GPUs, one shared by this process and a process outside any recorded tree (pid 4242,
    as a server started by Ray or by hand would be), one whose per-process bytes NVML can't tell."""

    def __init__(self):
        self.step = 0
        self.closed = False

    def devices(self):
        return [Gpu("GPU-aaaa", "Fake H200", 141 * GiB, 0, "00000000:19:00.0", "h0"),
                Gpu("GPU-bbbb", "Fake H200", 141 * GiB, 1, "00000000:3B:00.0", "h1")]

    def used(self, handle):
        self.step += 1
        return (10 if handle == "h0" else 1) * GiB + self.step

    def processes(self, handle):
        if handle == "h0":
            return [(os.getpid(), 6 * GiB), (4242, 3 * GiB)]
        return [(4343, None)]

    def close(self):
        self.closed = True


def make_run(tmp_path):
    run_dir = new_run_dir(tmp_path)
    write_run_meta(run_dir, {"interval_ms": 20.0, "run_id": "r1"})
    return run_dir


def test_every_gpu_and_every_process_on_it_is_recorded(tmp_path):
    run_dir = make_run(tmp_path)
    backend = FakeNvml()
    sampler = HostSampler(run_dir, interval_s=0.01, prefer=True, backend=backend).start()
    assert sampler.active
    time.sleep(0.2)
    sampler.stop()
    assert backend.closed
    run = mp.load(run_dir)
    gpus = run.gpu_samples
    assert set(gpus["gpu_uuid"].astype(str)) == {"GPU-aaaa", "GPU-bbbb"}
    assert set(gpus["host"].astype(str)) == {identity.host_name()}
    a = gpus[gpus["gpu_uuid"] == "GPU-aaaa"]["used"]
    assert a.min() > 10 * GiB and a.is_monotonic_increasing
    procs = run.gpu_procs
    assert set(procs["pid"]) == {os.getpid(), 4242, 4343}
    assert (procs[procs["pid"] == 4242]["bytes"] == 3 * GiB).all()
    assert procs[procs["pid"] == 4343]["bytes"].isna().all()  # unknown stays absent, never zero
    # Each host row has its process rows at the very same t.
    host_t = set(run.host_samples["t"])
    assert set(procs["t"]) == host_t and len(host_t) >= 5
    meta = run.hosts[0]
    assert [g["uuid"] for g in meta["gpus"]] == ["GPU-aaaa", "GPU-bbbb"] and meta["gpus"][0]["total"] == 141 * GiB
    assert "end_time" in meta


def test_without_nvml_host_memory_and_cgroup_are_still_recorded(tmp_path):
    run_dir = make_run(tmp_path)
    sampler = HostSampler(run_dir, interval_s=0.01, prefer=True).start()  # the real pynvml: absent here
    time.sleep(0.1)
    sampler.stop()
    run = mp.load(run_dir)
    host = run.host_samples
    assert len(host) >= 3 and run.gpu_samples.empty
    assert (host["host_available"] > 0).all() and (host["host_total"] >= host["host_available"]).all()
    cgroup = CgroupProbe()
    if cgroup.active:
        assert (host["cgroup_usage"] > 0).all()
    nvml = next(p for p in run.hosts[0]["probes"] if p["name"] == "nvml_host")
    assert not nvml["active"] and nvml["reason"]


def test_exactly_one_holder_and_another_takes_over_when_it_stops(tmp_path):
    run_dir = make_run(tmp_path)
    # flock is per open file: two samplers of one process contend like two processes would.
    first = HostSampler(run_dir, interval_s=0.01, prefer=True, backend=FakeNvml(), standby_s=0.05).start()
    second = HostSampler(run_dir, interval_s=0.01, prefer=True, backend=FakeNvml(), standby_s=0.05).start()
    time.sleep(0.2)
    assert first.active and not second.active
    first.stop()
    deadline = time.monotonic() + 5
    while not second.active and time.monotonic() < deadline:
        time.sleep(0.02)
    assert second.active
    second.stop()
    assert len(list(run_dir.glob("*.host.json"))) == 1  # both are this process: same stem, files appended


def test_a_process_that_is_not_preferred_waits_before_trying(tmp_path):
    run_dir = make_run(tmp_path)
    late = HostSampler(run_dir, interval_s=0.01, prefer=False, backend=FakeNvml(), standby_s=0.3).start()
    assert not late.active
    deadline = time.monotonic() + 5
    while not late.active and time.monotonic() < deadline:
        time.sleep(0.02)
    assert late.active  # nobody else: it takes the role after its standby
    late.stop()


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limit_is_the_tightest_on_the_path(tmp_path):
    root = tmp_path / "cg"
    write(root / "cgroup.controllers", "cpu memory\n")
    write(root / "pod" / "memory.max", str(8 * GiB))
    write(root / "pod" / "memory.current", str(GiB))
    write(root / "pod" / "ctr" / "memory.max", "max\n")
    write(root / "pod" / "ctr" / "memory.current", str(GiB // 2))
    write(tmp_path / "self_cgroup", "0::/pod/ctr\n")
    probe = CgroupProbe(root, tmp_path / "self_cgroup")
    assert probe.version == 2 and probe.read() == (GiB // 2, 8 * GiB)
    write(root / "pod" / "memory.max", "max\n")
    assert probe.read() == (GiB // 2, 8 * GiB)  # limits are re-read every LIMIT_REFRESH_S, not each sample
    probe._limit_due = 0.0  # as if LIMIT_REFRESH_S had passed
    assert probe.read() == (GiB // 2, None)  # unlimited: empty, never a made-up number


def test_cgroup_v1_uses_the_hierarchical_limit(tmp_path):
    root = tmp_path / "cg"
    write(root / "memory" / "job" / "memory.usage_in_bytes", str(3 * GiB))
    write(root / "memory" / "job" / "memory.limit_in_bytes", "9223372036854771712\n")
    write(root / "memory" / "job" / "memory.stat", f"cache 0\nhierarchical_memory_limit {16 * GiB}\n")
    write(tmp_path / "self_cgroup", "4:memory:/job\n0::/\n")
    probe = CgroupProbe(root, tmp_path / "self_cgroup")
    assert probe.version == 1 and probe.read() == (3 * GiB, 16 * GiB)


def test_no_cgroup_is_absent_with_a_reason(tmp_path):
    probe = CgroupProbe(tmp_path / "none", tmp_path / "none_cgroup")
    assert not probe.active and probe.read() == (None, None) and probe.describe()["reason"]


def test_identity_comes_from_torchrun_and_the_launcher(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv(identity.ROLE_ENV, "engine")
    monkeypatch.setenv(identity.HOST_ENV, "node3")
    assert identity.process_identity("in_process") == {"rank": 5, "local_rank": 1, "world_size": 8,
                                                       "role": "engine", "host": "node3"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", identity.ROLE_ENV, identity.HOST_ENV):
        monkeypatch.delenv(name)
    mine = identity.process_identity("in_process")
    assert (mine["rank"], mine["local_rank"], mine["world_size"], mine["role"]) == (0, 0, 1, "in_process")


def test_cuda_identity_touches_nothing_before_the_program_initialises_cuda():
    """In a fresh process (on a GPU machine too): asking creates no CUDA context."""
    program = ("import torch\nfrom miles_profile.identity import cuda_identity\n"
               "assert cuda_identity() is None\nassert not torch.cuda.is_initialized()\n")
    done = subprocess.run([sys.executable, "-c", program], env=python_env(), cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_recorder_meta_says_who_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv(identity.ROLE_ENV, "actor")
    monkeypatch.setenv(identity.HOST_ENV, "fakehost")
    monkeypatch.setenv(identity.RUN_ID_ENV, "job-17")
    with mp.Recorder(tmp_path, interval_ms=50) as rec:
        pass
    meta = json.loads(next(rec.run_dir.glob("fakehost-*.meta.json")).read_text())
    assert {k: meta[k] for k in ("rank", "local_rank", "world_size", "role", "host", "run_id")} == {
        "rank": 3, "local_rank": 0, "world_size": 4, "role": "actor", "host": "fakehost", "run_id": "job-17"}
    assert meta["host_sampler"] is True and meta["gpu_uuid"] is None  # local rank 0 took the role; no CUDA
    assert (rec.run_dir / "fakehost.host.lock").exists()
    assert mp.load(rec.run_dir).meta["run_id"] == "job-17"


@pytest.mark.gpu
def test_on_a_gpu_the_process_names_its_gpu_and_the_host_sampler_sees_its_bytes(tmp_path):
    """The real pynvml backend and torch: the UUID in meta is NVML's, and the host files list this
    process on that GPU with the bytes it holds. Run on the device machine."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import pynvml
    with mp.Recorder(tmp_path, interval_ms=20) as rec:
        with mp.phase("train"):
            block = torch.empty(512 * 1024 ** 2, dtype=torch.uint8, device="cuda")
            time.sleep(0.5)
        with mp.phase("offload_train"):
            del block
            torch.cuda.empty_cache()
    run = mp.load(rec.run_dir)
    meta = run.processes[0]
    pynvml.nvmlInit()
    try:
        index = torch.cuda.current_device()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        nvml_index = int(visible.split(",")[index]) if visible and visible.split(",")[index].isdigit() else index
        expected = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(nvml_index))
    finally:
        pynvml.nvmlShutdown()
    expected = expected.decode() if isinstance(expected, bytes) else expected
    assert meta["gpu_uuid"] == expected
    mine = run.gpu_procs[(run.gpu_procs["pid"] == os.getpid()) & (run.gpu_procs["gpu_uuid"] == expected)]
    assert mine["bytes"].max() >= 512 * 1024 ** 2
    used = run.gpu_samples[run.gpu_samples["gpu_uuid"] == expected]["used"]
    assert used.max() >= mine["bytes"].max()
    train = run.phase_summaries[(run.phase_summaries["name"] == "train")].set_index("series")
    assert train.loc["gpu0_alloc", "peak"] >= 512 * 1024 ** 2

