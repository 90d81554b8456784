"""The what-if of a program that names its phases otherwise (`release` / `resume`, Miles-style, no tags):
recorded for real with record --exec on this machine, the bytes it declared away come back in the first
phase that gives them back, and every phase in between would have held them."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from miles_profile.logdir.reader import load_run
from miles_profile.runmodel.transitions import transitions
from miles_profile.runmodel.whatif import FITS, whatif
from tests.conftest import REPO, python_env

MiB = 1024 ** 2
PROGRAM = textwrap.dedent("""
    import time
    import miles_profile as mp
    n = 96 * 1024 * 1024
    cache = bytearray(n)
    mp.account("kv_cache", n)
    with mp.phase("generate"):
        cache[::4096] = b"x" * len(cache[::4096])
        time.sleep(0.1)
    with mp.phase("release", expected_bytes=n):
        del cache
        mp.account("kv_cache", 0)
    with mp.phase("train"):
        work = bytearray(32 * 1024 * 1024)
        work[::4096] = b"y" * len(work[::4096])
        time.sleep(0.1)
        del work
    with mp.phase("resume", expected_bytes=n):
        cache = bytearray(n)
        mp.account("kv_cache", n)
    with mp.phase("generate"):
        time.sleep(0.1)
""")


def test_whatif_of_a_release_named_otherwise_follows_the_bytes(tmp_path):
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path), "--exec", "--",
                           sys.executable, "-c", PROGRAM], cwd=REPO, env=python_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    run = load_run(next(tmp_path.glob("run-*")))
    result = whatif(run)
    (row,) = result.table.to_dict("records")
    assert (row["offload"], row["category"], row["onload"]) == ("release", "kv_cache", "resume")
    assert row["freed"] == 96 * MiB and row["peak_phase"] == "train" and row["fits"] == FITS
    assert row["whatif_peak"] == row["measured_peak"] + 96 * MiB
    assert result.series == "RSS, true peak"
    meter = transitions(run).table.set_index("phase")
    assert meter.loc["release", "measured"] == 96 * MiB and meter.loc["release", "link"] == "released (no copy)"
