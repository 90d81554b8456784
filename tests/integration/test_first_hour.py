"""A new user's first hour (issue 35): the mistakes the README's quick start invites get one line that
says what to do."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, python_env


def test_record_without_exec_says_add_exec_and_makes_no_run(tmp_path):
    logs = tmp_path / "logs"
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(logs), "--",
                           "my_script.py", "--lr", "1e-4"],
                          cwd=tmp_path, env=python_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "add --exec" in lines[0], done.stderr
    assert "record --exec -- python my_script.py --lr 1e-4" in lines[0]
    assert "Traceback" not in done.stderr and "unrecognized arguments" not in done.stderr
    assert not logs.exists() or not any(logs.iterdir())


def test_record_where_torch_cannot_import_says_use_exec_and_makes_no_run(tmp_path):
    """A machine without torch (the recorder needs none): trainer flags get one line naming --exec."""
    no_torch = tmp_path / "no_torch"
    no_torch.mkdir()
    (no_torch / "sitecustomize.py").write_text('import sys\nsys.modules["torch"] = None  # `import torch` fails\n')
    env = python_env()
    env["PYTHONPATH"] = os.pathsep.join([str(no_torch), env["PYTHONPATH"]])
    logs = tmp_path / "logs"
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(logs), "--",
                           "--num-rollout", "1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "the integrated trainer is not available" in lines[0], done.stderr
    assert lines[0].endswith("use --exec") and "torch" in lines[0]
    assert not logs.exists() or not any(logs.iterdir())


def _with_cgroup_limit(tmp_path, limit: int):
    """sample_logs/cpu as if recorded in a container: the host sampler read a cgroup limit of `limit`."""
    run = tmp_path / "cpu"
    shutil.copytree(REPO / "sample_logs" / "cpu", run)
    (host_csv,) = run.glob("*.host.csv")
    header, *rows = host_csv.read_text().splitlines()
    assert header.endswith(",cgroup_limit") and all(row.endswith(",") for row in rows)
    host_csv.write_text("\n".join([header, *(row + str(limit) for row in rows)]) + "\n")
    return run


def test_a_host_peak_is_compared_with_the_cgroup_limit_that_applied(tmp_path):
    from miles_profile.logdir.reader import load_run
    from miles_profile.runmodel.peak import highest_peak
    peak = highest_peak(load_run(_with_cgroup_limit(tmp_path, 1 << 30)))
    assert peak.total == 1 << 30 and peak.limit == "cgroup limit"
    assert f"of 1.0 GiB cgroup limit ({peak.bytes / (1 << 30):.0%})" in peak.text()
    # without a limit (or one above the machine's memory) the host's memory, named as such
    unlimited = highest_peak(load_run(REPO / "sample_logs" / "cpu"))
    assert unlimited.limit == "host memory" and "GiB host memory (" in unlimited.text()


@pytest.mark.slow  # two visualize processes: about 4 s idle, 13 s on the shared machine
def test_threshold_sizes_take_units_and_shares_a_percent(tmp_path):
    """`--threshold leak_abs_bytes=1GiB` as every other size flag; a wrong one is one line naming it."""
    def visualize(*threshold):
        args = [sys.executable, "-m", "miles_profile.visualize", str(REPO / "sample_logs" / "cpu"),
                "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json")]
        for t in threshold:
            args += ["--threshold", t]
        return subprocess.run(args, env=python_env(), capture_output=True, text=True, timeout=120, check=False)
    done = visualize("transition_abs_bytes=3GiB", "transition_tolerance_share=50%")
    assert done.returncode in (0, 1), done.stderr
    checks = json.loads((tmp_path / "r.json").read_text())["runs"][0]["checks"]
    (spikes,) = [c for c in checks if c["name"] == "transition_spikes"]
    assert "50% of it plus 3.000 GiB" in spikes["explanation"], spikes["explanation"]
    bad = visualize("leak_abs_bytes=lots")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "miles_profile.visualize: error: threshold leak_abs_bytes: not a size: 'lots' (e.g. 20 GiB, 512 MiB, 1048576)"]


def test_a_cpu_runs_report_speaks_of_host_memory_and_no_zero_rates():
    from miles_profile.logdir.reader import load_run
    from miles_profile.runmodel.ledger import ledger
    from miles_profile.runmodel.transitions import meter_of
    from miles_profile.report.transitions_html import meter_rows
    from miles_profile.report.whatif_html import whatif_html
    run = load_run(REPO / "sample_logs" / "cpu")
    frame = ledger(run)
    html = whatif_html(run, frame)
    assert "What you could keep in host memory" in html and "on the GPU" not in html
    rates = [r["rate"] for r in meter_rows(meter_of(run, frame))]
    assert rates and not [r for r in rates if r.strip("0.") == ""], rates


def test_the_timeline_names_the_peaks_iteration_as_the_summary_does():
    """sample_logs/h200/9-dist-engine-server: the engine server records a phase per weight bucket, so
    it had the most phases and was taken as the main process; the timeline then counted its phases
    into "iteration 65" where the summary says 2, and the comparison's train cells were empty."""
    from miles_profile.logdir.reader import load_run
    from miles_profile.runmodel.peak import highest_peak
    from miles_profile.runmodel.series import main_pid
    from miles_profile.runmodel.timeline_marks import phase_at
    run = load_run(REPO / "sample_logs" / "h200" / "9-dist-engine-server")
    actor = next(p["pid"] for p in run.processes if p.get("role") == "actor")
    assert main_pid(run) == actor
    peak = highest_peak(run)
    assert phase_at(run, peak.t) == (peak.phase, peak.iteration) == ("generate", 2)


def test_mark_labels_stay_inside_the_plot_below_its_title(tmp_path):
    """A mark per step was labelled above the plot, over the subplot's title; now inside, along its line."""
    from miles_profile.logdir.reader import load_run
    from miles_profile.report.figures import timeline_figure
    run_dir = tmp_path / "cpu"
    shutil.copytree(REPO / "sample_logs" / "cpu", run_dir)
    (events,) = run_dir.glob("*.events.jsonl")
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    t0, t1 = rows[0]["t"], rows[-1]["t"]
    rows += [{"t": t0 + 1 + k * (t1 - t0 - 2) / 11, "kind": "mark", "name": f"step {k}", "pid": rows[0]["pid"],
              "host": rows[0]["host"], "attrs": {}} for k in range(12)]
    events.write_text("".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["t"])))
    notes = [a for a in timeline_figure(load_run(run_dir)).layout.annotations if str(a.text).startswith("step ")]
    assert len(notes) == 12
    assert all(a.y == 1.0 and a.yanchor == "top" and a.textangle == -90 for a in notes)


@pytest.mark.slow  # records the README's loop: about 10 CPU-seconds
def test_the_readmes_quick_start_runs_as_written(tmp_path):
    """The quick start's program and its two commands, as the README shows them (`python` is this
    interpreter): a report of the loop, its leak judged over the iterations, the RL checks on one line."""
    import re
    readme = (REPO / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## Two commands")]
    (tmp_path / "my_train.py").write_text(re.findall(r"```python\n(.*?)```", quick, re.S)[0])
    commands = [line.split("#")[0].split() for line in re.findall(r"```bash\n(.*?)```", quick, re.S)[1].splitlines()]
    outputs = []
    for argv in commands:
        argv = [sys.executable if word == "python" else str(tmp_path / "memory_logs") if word == "/tmp/memory_logs"
                else word for word in argv]
        done = subprocess.run(argv, cwd=tmp_path, env=python_env(), capture_output=True, text=True, timeout=600,
                              check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "judged by time" not in done.stderr  # the loop opens its own phases: no integration needed
        outputs.append(done.stdout)
    assert (tmp_path / "memory_logs" / "report.html").is_file()
    lines = outputs[-1].splitlines()
    assert any(line.startswith("  PASS  leak") for line in lines), outputs[-1]
    assert any(line.startswith("  N/A   offload_drop, serialized_peaks") for line in lines), outputs[-1]
