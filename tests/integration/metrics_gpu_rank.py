"""A recorded "GPU rank" for tests/integration/test_prometheus.py on a machine without CUDA.

It records itself with the real Recorder into the run given on the command line, as rank 2, with a
stand-in torch allocator (the three columns the allocator probe writes) on the fake GPU of
metrics_fakes/pynvml.py, and loops generate -> train -> offload_train -> onload_train with
rollout_id. When the file `<spike>` appears it makes one real host-memory spike of `SPIKE_BYTES`
(touched, then freed: a few ms) and writes what it did to `<spike>.json`. It stops when `<stop>`
appears. With a port as fourth argument it also serves the host's metrics there through
`miles_profile.metrics.serve`, the call a per-node sampler outside `record` (Ray's) makes.
"""
import json
import mmap
import os
import sys
import time

os.environ.update(RANK="2", LOCAL_RANK="1", WORLD_SIZE="3", MILES_PROFILE_ROLE="actor")

import miles_profile as mp  # noqa: E402
from miles_profile import recorder as recorder_module  # noqa: E402

UUID = "GPU-0e4b1a2c-fake-4d6e-9b1a-000000000001"
MiB = 1024**2
BASE, TRAIN, STATE = 300 * MiB, 200 * MiB, 120 * MiB  # allocator bytes: weights, activations, offloaded state
SPIKE_BYTES = 16 * MiB
level = {"alloc": BASE + STATE, "peak": BASE + STATE}


class StandInAllocator:
    name = "torch_allocator"
    columns = ("gpu0_alloc", "gpu0_alloc_peak", "gpu0_reserved")

    def read(self):
        alloc, peak = level["alloc"], level["peak"]
        level["peak"] = alloc  # reset at each read, as reset_peak_memory_stats
        return [alloc, max(peak, alloc), alloc + 20 * MiB]

    def close(self):
        pass


def allocate(nbytes: int) -> None:
    level["alloc"] += nbytes
    level["peak"] = max(level["peak"], level["alloc"])


recorder_module.open_torch_allocator = lambda: (StandInAllocator(), {"name": "torch_allocator", "active": True})
recorder_module.cuda_identity = lambda: {"gpu_uuid": UUID, "cuda_devices": [
    {"index": 0, "uuid": UUID, "name": "Fake GPU 80GB", "total": 80 * 1024**3}]}


def spike(path: str) -> None:
    # An anonymous mapping of its own, each page touched (resident), then unmapped (it leaves RSS at once).
    # Not numpy: its arrays of 4 MiB or more ask for huge pages, and on a loaded machine the kernel's
    # compaction for them held a 16 MiB array 0.55 s (the suite of 2026-12-06 11:00 UTC).
    before = time.perf_counter()
    block = mmap.mmap(-1, SPIKE_BYTES)
    for offset in range(0, SPIKE_BYTES, mmap.PAGESIZE):
        block[offset] = 1
    block.close()
    held = time.perf_counter() - before
    with open(path + ".json", "w") as f:
        json.dump({"t": time.time(), "start": time.time() - held, "bytes": SPIKE_BYTES, "held_s": held}, f)


def main(run_dir: str, spike_path: str, stop_path: str, port: str = "") -> None:
    from miles_profile.metrics import serve
    server = serve(run_dir, int(port), "127.0.0.1") if port else None
    # Rows only at phase boundaries (the periodic row once a minute): every row is taken by this thread,
    # so none can fall inside the spike, however long the loaded machine makes it.
    with mp.Recorder(run_dir=run_dir, interval_ms=60_000):
        i = 0
        while not os.path.exists(stop_path):
            with mp.phase("generate", rollout_id=i):
                time.sleep(0.05)
            with mp.phase("train", rollout_id=i):
                allocate(TRAIN)
                time.sleep(0.05)
                allocate(-TRAIN)
            with mp.phase("offload_train", rollout_id=i, target="cpu", expected_bytes=STATE):
                allocate(-STATE)
            with mp.phase("onload_train", rollout_id=i):
                allocate(STATE)
            if os.path.exists(spike_path) and not os.path.exists(spike_path + ".json"):
                spike(spike_path)
            i += 1
            time.sleep(0.1)
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
