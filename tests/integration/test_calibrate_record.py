"""record --calibrate: the link ceilings measured for real on this machine (memcpy, a temp file on
disk; CUDA links only where there is a GPU), cached per host, and stored in the run meta."""
from __future__ import annotations

import json
import subprocess
import sys

from miles_profile import calibrate
from tests.conftest import REPO, python_env

SMALL = 4 * 1024**2


def test_calibration_measures_host_and_disk_here_and_is_cached_per_host(tmp_path):
    cache = tmp_path / "cache"
    first = calibrate.for_this_host(tmp_path, cache_dir=cache, nbytes=SMALL)
    links = first["links"]
    assert {"host_copy", "disk_write", "disk_read"} <= set(links) and all(v > 0 for v in links.values())
    assert "pinned_h2d" not in links  # no CUDA on this machine: absent, never zero
    assert first["cached"] is False and not list(tmp_path.glob(".miles_calibrate_*"))  # its temp file is gone
    again = calibrate.for_this_host(tmp_path, cache_dir=cache, nbytes=SMALL)
    assert again["cached"] is True and again["links"] == links
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()  # another disk directory is another disk link: measured again
    assert calibrate.for_this_host(elsewhere, cache_dir=cache, nbytes=SMALL)["cached"] is False


def test_record_calibrate_stores_this_hosts_ceilings_in_the_run_meta(tmp_path):
    logs, cache = tmp_path / "logs", tmp_path / "cache"
    logs.mkdir()
    cached = calibrate.for_this_host(logs, cache_dir=cache, nbytes=SMALL)  # what record finds for this host
    env = dict(python_env(), **{calibrate.CACHE_ENV: str(cache)})
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--calibrate", "--log-dir", str(logs),
                           "--exec", "--", sys.executable, "-c", "pass"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "link ceilings (cached): host_copy" in done.stderr
    (meta,) = logs.glob("*/meta.json")
    stored = json.loads(meta.read_text())[calibrate.CALIBRATION_KEY]
    assert stored["links"] == cached["links"] and stored["host"] == cached["host"]
    assert calibrate.ceilings_of(json.loads(meta.read_text())) == cached["links"]


def test_record_without_calibrate_stores_none(tmp_path):
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path),
                           "--exec", "--", sys.executable, "-c", "pass"],
                          cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (meta,) = tmp_path.glob("*/meta.json")
    assert calibrate.CALIBRATION_KEY not in json.loads(meta.read_text())


def test_a_calibration_that_cannot_run_is_one_warning_and_the_job_runs(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # the disk directory lies under a file: no temp file there, no calibration
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--calibrate", "--log-dir", str(tmp_path / "logs"),
                           "--watch-dir", str(blocker / "offload"), "--exec", "--", sys.executable, "-c",
                           "print('job ran')"],
                          cwd=REPO, env=dict(python_env(), **{calibrate.CACHE_ENV: str(tmp_path / "cache")}),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "job ran" in done.stdout, done.stderr
    assert "warning: not calibrated" in done.stderr and "Traceback" not in done.stderr
    (meta,) = (tmp_path / "logs").glob("*/meta.json")
    assert calibrate.CALIBRATION_KEY not in json.loads(meta.read_text())
