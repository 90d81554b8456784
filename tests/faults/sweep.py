"""The damaged-input sweep (issue 33): every log kind the project reads, damaged as an attacker or a bad
disk would, through the real readers and `visualize`; each outcome counted.

    python -m tests.faults.sweep [--count N] [--seed S] [--jobs 2] [--kinds one,two,...] [--out FILE]

Kinds (templates recorded for real once per sweep, then copied and damaged per input):
    one        a one-process run of the integrated trainer (`record -- --preset tiny`, every offload,
               a calibration and a stacks snapshot added as `record --calibrate`/`--stacks` write them)
    two        a two-rank run (`record -- --nproc-per-node 2`): two actors, two engines, the outside parent
    miles      a Miles dashboard dump (tests/unit/test_miles_dashboard_import.py writes one)
    miles_csv  a Miles CPU profiler CSV
    cache      the calibration cache `record --calibrate` reads (calibrate.for_this_host)
    stacks     the stacks snapshot of a one-process run (`.stacks.pickle`, plain data of the wrong shape)

Damages: truncation, bit flips, wrong JSON types (null, string, list, object, bool), NaN/inf, negative
and huge numbers (1e308, 10**30), duplicated, reordered and garbage lines, empty and missing files,
FIFOs, links to /dev/zero, plus the round-3 catalogue (tests/faults/test_faults_readers_round3.py).

Outcomes, one per input (the report's `--json` against the intact template's):
    traceback      "Traceback" on the terminal
    hang           no answer within --timeout seconds
    internal       "could not report this log", "could not read it", or an exit code other than 0, 1, 2
    refused        exit 2 with one line naming the input (allowed: the input is unreadable)
    silent_pass    a PASS verdict with no warning, on damage that destroyed data a reader can see: a file
                   that is missing, empty, a FIFO, a directory or a link to /dev/zero, cut mid-line,
                   with a garbage line, or an impossible value in a byte column (bit flips, repeats,
                   reorders and JSON values of another type may be legal values: these count for
                   tracebacks, hangs, internal errors and false FAILs only)
    false_fail     a check that FAILs on the damaged input and did not on the intact one
    ok             anything else: a verdict with the damage said
Each report runs in a child forked from a parent that imported the project once (no interpreter start
per input), at most --jobs at a time (run the sweep under `nice -n 10` on a shared machine).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KINDS = ("one", "two", "miles", "miles_csv", "cache", "stacks")
SHARE = {"one": 0.40, "two": 0.15, "miles": 0.20, "miles_csv": 0.08, "cache": 0.07, "stacks": 0.10}
OUTCOMES = ("traceback", "hang", "internal", "false_fail", "silent_pass", "refused", "ok")
BAD_VALUES = [None, "x", [], {}, True, float("nan"), float("inf"), -1, -10 ** 12, 1e308, 10 ** 30, 1.5, "", [1, "a"]]
MiB = 1024 ** 2
TRAINER = ["--preset", "tiny", "--num-rollout", "3", "--offload-train", "--offload-rollout",
           "--colocate-memory-peak-device", "gpu", "--offload-rollout-level", "kv_cache", "weight"]


# -- templates ----------------------------------------------------------------------------------
def _record(log_dir: Path, trainer_args: list[str]) -> Path:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(log_dir), "--",
                           *trainer_args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"recording a template failed: {done.stderr[-2000:]}")
    (run,) = log_dir.glob("run-*")
    for lock in run.glob("*.lock"):
        lock.unlink()
    return run


def snapshot(entries: int = 3) -> dict:
    """A plain-data CUDA allocator snapshot (torch.cuda.memory._snapshot()'s shape)."""
    frames = [{"filename": "/home/u/train.py", "line": 77, "name": "train_step"}]
    trace = []
    for k in range(entries):
        trace.append({"action": "alloc", "addr": 4096 * (k + 1), "size": 64 * MiB, "stream": 0, "frames": frames})
    return {"segments": [{"device": 0, "address": 4096, "total_size": 64 * MiB, "blocks": [
        {"address": 4096, "size": 64 * MiB, "requested_size": 64 * MiB, "state": "active_allocated", "frames": []}]}],
        "device_traces": [trace]}


def _add_calibration_and_stacks(run: Path) -> None:
    """What `record --calibrate` and `record --stacks` (on CUDA) add to a run: a calibration in the run
    meta, a `stacks` event naming a snapshot of the last train phase, and the snapshot."""
    meta = json.loads((run / "meta.json").read_text())
    meta["calibration"] = {"version": 1, "host": "h", "measured_at": 1.0, "bytes": 256 * MiB, "repeats": 3,
                           "device": None, "disk_dir": "/tmp", "links": {"host_copy": 4e9, "disk_write": 1e9,
                                                                         "disk_read": 1.4e9}}
    (run / "meta.json").write_text(json.dumps(meta))
    events = next(p for p in run.glob("*.events.jsonl"))
    stem = events.name[: -len(".events.jsonl")]
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "end" and r["name"] == "train"][-1]
    path = run / f"{stem}.stacks.pickle"
    path.write_bytes(pickle.dumps(snapshot()))
    with open(events, "a") as f:
        f.write(json.dumps({"t": train["t"] + 1e-3, "kind": "stacks", "name": "stacks", "pid": train["pid"],
                            "host": train.get("host"), "attrs": {
                                "status": "written", "phase": "train", "phase_id": train["id"], "rule": "peak",
                                "file": path.name, "path": str(path), "max_entries": 100}}) + "\n")


def _kept_templates(base: Path, kinds: tuple[str, ...]) -> dict[str, Path] | None:
    """The templates an earlier sweep left in `base` (--templates), or None where one is missing."""
    found = {}
    for kind in kinds:
        if kind in ("one", "stacks", "two"):
            runs = sorted((base / ("one" if kind == "stacks" else kind)).glob("run-*"))
            found[kind] = runs[0] if runs else None
        elif kind == "miles":
            found[kind] = base / "miles" / "dump" if (base / "miles" / "dump").is_dir() else None
        else:
            found[kind] = base / kind if (base / kind).is_dir() else None
    return None if None in found.values() else found


def make_templates(base: Path, kinds: tuple[str, ...]) -> dict[str, Path]:
    sys.path.insert(0, str(REPO))
    kept = _kept_templates(base, kinds)
    if kept is not None:
        return kept
    found = {}
    if {"one", "stacks"} & set(kinds):
        found["one"] = _record(base / "one", TRAINER)
        _add_calibration_and_stacks(found["one"])
        found["stacks"] = found["one"]
    if "two" in kinds:
        found["two"] = _record(base / "two", ["--nproc-per-node", "2", *TRAINER])
    if "miles" in kinds:
        from tests.unit.test_miles_dashboard_import import write_miles_dashboard
        found["miles"] = write_miles_dashboard(base / "miles" / "dump" / "dashboard", iterations=2).parent
    if "miles_csv" in kinds:
        path = base / "miles_csv" / "cpu_memory.csv"
        path.parent.mkdir(parents=True)
        lines = ["time_s,used_gb,available_gb,percent,marker"]
        for k in range(60):
            step, at = divmod(k, 20)
            marker = {0: f"step_{step}/generate_start", 6: f"step_{step}/generate_end",
                      8: f"step_{step}/train_start", 16: f"step_{step}/train_end"}.get(at, "")
            lines.append(f"{k * 0.5:.3f},{10 + (at > 8) * 4 + k * 0.001:.3f},{50 - (at > 8) * 4:.3f},20.0,{marker}")
        path.write_text("\n".join(lines) + "\n")
        found["miles_csv"] = path.parent
    if "cache" in kinds:
        from miles_profile import calibrate
        (base / "cache").mkdir()
        found["cache"] = base / "cache"
        good = calibrate.for_this_host(base / "cache", cache_dir=base / "cache", nbytes=MiB)
        assert not good["cached"]
    return found


# -- damages ------------------------------------------------------------------------------------
class Damage:
    """One damage: a name, the file it hits (relative to the input), and whether a reader can see it."""

    def __init__(self, name: str, target: str, visible: bool, apply):
        self.name, self.target, self.visible, self.apply = name, target, visible, apply


def _replace_file(path: Path, how: str) -> None:
    path.unlink(missing_ok=True)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "dev-zero":
        path.symlink_to("/dev/zero")
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "dir":
        path.mkdir()


def _json_paths(value, prefix=()):
    """Every (path, value) in a JSON document, the document itself first."""
    yield prefix, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_paths(v, (*prefix, k))
    elif isinstance(value, list):
        for k, v in enumerate(value[:50]):
            yield from _json_paths(v, (*prefix, k))


def _set_path(doc, path, value):
    if not path:
        return value
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def _dumps(doc) -> str:
    return json.dumps(doc, allow_nan=True, default=str)


def _retype_json_line(line: str, rng: random.Random) -> str:
    try:
        doc = json.loads(line)
    except ValueError:
        return line + "x"
    paths = list(_json_paths(doc))
    path, old = rng.choice(paths[1:] or paths)
    bad = rng.choice([v for v in BAD_VALUES if v != old or type(v) is not type(old)])
    return _dumps(_set_path(doc, path, bad))


def _csv_cell(lines: list[str], rng: random.Random) -> tuple[list[str], bool]:
    """One data cell of a CSV replaced with NaN, inf, a negative, a huge or a non-number."""
    if len(lines) < 2:
        return lines, False
    k = rng.randrange(1, len(lines))
    cells = lines[k].split(",")
    c = rng.randrange(len(cells))
    header = lines[0].split(",")
    value = rng.choice(["nan", "inf", "-inf", "-930970000000", "1e308", "99999999999999999999999", "x", "-1",
                        "1e30", "0x10"])
    cells[c] = value
    lines[k] = ",".join(cells)
    # a byte column's impossible value must be said; a time or a label of another shape may be a value
    column = header[c] if c < len(header) else ""
    return lines, column not in ("t", "phase", "marker", "time_s", "gpu_uuid", "host", "pid")


def damage_text(path: Path, rng: random.Random, how: str) -> bool:
    """Damage a text file in place; False when the change can't be seen by a reader."""
    data = path.read_bytes()
    text = data.decode("utf-8", "replace")
    lines = text.splitlines()
    visible = True
    if how == "truncate":
        cut = rng.randrange(0, max(1, len(data)))
        visible = cut == 0 or data[cut - 1:cut] != b"\n"
        path.write_bytes(data[:cut])
        return visible
    if how == "bitflip":  # may change a digit or a letter into another: never counted as visible
        if not data:
            return False
        at = rng.randrange(len(data))
        flipped = data[at] ^ (1 << rng.randrange(8))
        path.write_bytes(data[:at] + bytes([flipped]) + data[at + 1:])
        return False
    if how == "duplicate-all":  # a repeat loses nothing: it must not crash or FAIL, a PASS may stay silent
        path.write_bytes(data + data)
        return False
    if how == "duplicate-line" and lines:
        k = rng.randrange(len(lines))
        lines.insert(k, lines[k])
        visible = False
    elif how == "reorder" and len(lines) > 2:
        body = lines[1:] if path.suffix == ".csv" else lines
        rng.shuffle(body)
        lines = [lines[0], *body] if path.suffix == ".csv" else body
        visible = False
    elif how == "garbage-line":
        lines.insert(rng.randrange(1 if path.suffix == ".csv" else 0, len(lines) + 1),
                     "".join(rng.choice("{}[],\":x1é\x00") for _ in range(40)))
    elif how == "retype":
        if path.suffix == ".csv":
            lines, visible = _csv_cell(lines, rng)
        elif path.suffix == ".jsonl" and lines:  # whether the key is one a reader uses is not known here
            k = rng.randrange(len(lines))
            lines[k] = _retype_json_line(lines[k], rng)
            visible = False
        else:
            lines = [_retype_json_line(text, rng)]
            visible = False
    else:
        return False
    path.write_text("\n".join(lines) + "\n")
    return visible


TEXT_DAMAGES = ("truncate", "bitflip", "duplicate-all", "duplicate-line", "reorder", "garbage-line", "retype",
                "retype", "retype")
FILE_DAMAGES = ("fifo", "dev-zero", "empty", "missing", "dir")


def damage_input(root: Path, rng: random.Random, files: list[Path]) -> tuple[str, bool]:
    """Damage one file under `root`: a name for the damage, and whether a reader can see it."""
    target = rng.choice(files)
    rel = target.relative_to(root)
    # a file that held no data (a header only: gpu_procs.csv without NVML) or only a copy of the meta's end
    # and losses (status.json, read only where the meta lacks them) loses nothing a report shows
    holds_data = not target.name.endswith(".status.json") and (
        target.suffix == ".pickle" or target.read_bytes().count(b"\n") > (1 if target.suffix == ".csv" else 0))
    if rng.random() < 0.2:
        how = rng.choice(FILE_DAMAGES)
        if how == "missing":
            target.unlink()
        else:
            _replace_file(target, how)
        return f"{rel}:{how}", holds_data
    how = rng.choice(TEXT_DAMAGES)
    if target.suffix == ".pickle":
        how = rng.choice(("truncate", "bitflip"))
    return f"{rel}:{how}", damage_text(target, rng, how) and holds_data


def stacks_damage(run: Path, rng: random.Random) -> tuple[str, bool]:
    """A snapshot of the wrong shape (plain data: the reader unpickles no code), or a long one."""
    (path,) = run.glob("*.stacks.pickle")
    snap = snapshot(rng.choice((3, 1000)))
    paths = [p for p, _ in _json_paths(snap) if p]
    where = rng.choice(paths)
    bad = rng.choice(BAD_VALUES + [12, "segments", [[1, 2]], {"a": 1}])
    how = rng.choice(("retype", "retype", "retype", "top-level", "truncate"))
    if how == "top-level":
        snap = rng.choice([[], 7, "x", None, {"segments": 5}, {"device_traces": [[5, 6]]}, {"segments": [1, 2]}])
        where = ("<top>",)
    elif how == "retype":
        snap = _set_path(snap, where, bad)
    data = pickle.dumps(snap)
    if how == "truncate":
        data = data[: rng.randrange(1, len(data))]
    path.write_bytes(data)
    # a retyped entry may hold a legal value of another field's kind (a stream "x", a frame's name None):
    # counted for tracebacks, hangs, internal errors and false FAILs, not as a silent PASS
    return f"{path.name}:{how}:{'.'.join(map(str, where))}", how != "retype"


# -- one input ----------------------------------------------------------------------------------
def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith((".html", ".json.out", ".lock"))
                  and p.suffix != ".arrow")


def prepare(kind: str, template: Path, work: Path, rng: random.Random) -> tuple[list[str], str, bool]:
    """Copy the template into `work` and damage it: (visualize's path arguments, damage, visible)."""
    root = Path(shutil.copytree(template, work / "input", symlinks=True,
                                ignore=shutil.ignore_patterns("*.arrow", "*.lock", "report.html")))
    if kind == "stacks":
        name, visible = stacks_damage(root, rng)
        return [str(root)], name, visible
    if kind == "cache":  # the cache names the disk directory it was measured for: this copy
        (cache,) = root.glob("calibration-*.json")
        cache.write_text(json.dumps({**json.loads(cache.read_text()), "disk_dir": str(root.resolve())}))
    if kind == "miles_csv":
        name, visible = damage_input(root, rng, _files(root))
        return [str(root / "cpu_memory.csv")], name, visible
    if kind == "one" and rng.random() < 0.1:  # the round-3 catalogue, on our recorded run
        from tests.faults.test_faults_readers_round3 import SINGLE
        name = rng.choice(sorted(SINGLE))
        stem = next(p.name[:-len(".meta.json")] for p in root.glob("*.meta.json") if p.name != "meta.json")
        try:
            _apply_round3(root, stem, name, SINGLE)
        except (OSError, KeyError, StopIteration):
            pass
        return [str(root)], f"round3:{name}", True
    name, visible = damage_input(root, rng, _files(root))
    return [str(root)], name, visible


def _apply_round3(root: Path, stem: str, name: str, catalogue: dict) -> None:
    """The round-3 damages name the process `h-7`: renamed to our template's process for the call."""
    renamed = {}
    for path in list(root.glob(f"{stem}.*")):
        new = root / ("h-7" + path.name[len(stem):])
        path.rename(new)
        renamed[new] = path
    try:
        catalogue[name](root)
    finally:
        for new, old in renamed.items():
            if os.path.lexists(new):
                new.rename(old)


def _report_argv(paths: list[str], out: Path) -> list[str]:
    return [*paths, "-o", str(out / "r.html"), "--json", str(out / "v.json")]


def run_report(paths: list[str], out: Path, full: bool = True) -> int:
    """visualize in this (forked) process: its exit code. Not `full`: the timeline figure and the HTML
    page (plotly: two thirds of a report's time) are left out; the readers, the run model, every
    check, the ledger, transitions, what-if and stacks (all in --json) run as in a full report."""
    from miles_profile.visualize import main
    if not full:
        import miles_profile.report.build as build
        import miles_profile.report.html as html
        html.timeline_figure = lambda run, max_points=None: None
        # build imports write_html by name (since the lazy imports moved to the top): both are replaced
        def left_out(path, reports, **kw):
            return Path(path).write_text("(left out by the sweep)")
        html.write_html = build.write_html = left_out
    return main(_report_argv(paths, out))


def run_cache(root: Path) -> int:
    from miles_profile import calibrate
    lines: list[str] = []
    found = calibrate.for_this_host(root, cache_dir=root, nbytes=MiB, warn=lines.append)
    for line in lines:
        print(f"warning: {line}")
    links = found.get("links")
    if not isinstance(links, dict) or not links or calibrate.cached_problem(found, str(root.resolve())):
        print(f"used a damaged calibration: {str(found)[:300]}")
        return 4  # what `record` would store in the run meta as this host's ceilings
    return 0


def child_main(kind: str, template: Path, work: Path, seed: int, timeout: float, full: bool = True) -> None:
    """In the forked child: damage a copy, run its reader, exit with the reader's code."""
    out_fd = os.open(work / "stdout", os.O_WRONLY | os.O_CREAT, 0o644)
    err_fd = os.open(work / "stderr", os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    rc = 98
    try:
        rng = random.Random(seed)
        paths, name, visible = prepare(kind, template, work, rng)
        (work / "damage.json").write_text(json.dumps({"damage": name, "visible": visible}))
        out = work / "out"
        out.mkdir()
        if kind == "cache":
            rc = run_cache(Path(paths[0]))
        else:
            rc = run_report(paths, out, full)
    except BaseException:  # noqa: BLE001 - a traceback is what the sweep counts
        traceback.print_exc()
        rc = 99
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc if isinstance(rc, int) else 97)


def classify(work: Path, rc: int | None, baseline: dict | None) -> str:
    err = (work / "stderr").read_text(errors="replace") if (work / "stderr").exists() else ""
    out = (work / "stdout").read_text(errors="replace") if (work / "stdout").exists() else ""
    if rc is None:
        return "hang"
    if "Traceback" in err or "Traceback" in out:
        return "traceback"
    if "could not report this log" in err or "could not read it (" in out + err or rc not in (0, 1, 2, 4):
        return "internal"
    if rc == 2:
        lines = [line for line in err.strip().splitlines() if line]
        return "refused" if len(lines) == 1 and "input" in lines[0] else "internal"
    info = json.loads((work / "damage.json").read_text())
    if baseline is None:  # the cache: a damaged ceiling used is a silent pass; a warned one or none is ok
        return "silent_pass" if rc == 4 else "ok" if rc == 0 else "internal"
    try:
        report = json.loads((work / "out" / "v.json").read_text())
    except (OSError, ValueError):
        return "internal"
    run = report["runs"][0]
    before = {c["name"]: c["status"] for c in baseline["runs"][0]["checks"]}
    if any(c["status"] == "fail" and before.get(c["name"]) != "fail" for c in run["checks"]):
        return "false_fail"
    # a stacks snapshot that can't be read is said in its own section (status and reason, HTML and --json)
    unreadable_stacks = any(st.get("status") in ("unreadable", "missing") for st in run.get("stacks") or ())
    warned = bool(run.get("warnings")) or bool(run.get("notes")) or "warning:" in out or unreadable_stacks
    if report["status"] == "pass" and info["visible"] and not warned:
        return "silent_pass"
    return "ok"


def baseline_of(kind: str, template: Path, base: Path) -> dict | None:
    if kind == "cache":
        return None
    out = base / f"baseline-{kind}"
    if (out / "v.json").exists():  # kept from an earlier sweep over the same templates (--templates)
        return json.loads((out / "v.json").read_text())
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    paths = [str(template)]
    done = subprocess.run([sys.executable, "-m", "miles_profile.visualize", *_report_argv(paths, out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"the intact {kind} template does not report: {done.stderr[-2000:]}")
    for left in (template.glob("*.arrow") if template.is_dir() else []):
        left.unlink()
    return json.loads((out / "v.json").read_text())


def plan(count: int, kinds: tuple[str, ...], seed: int) -> list[tuple[str, int]]:
    share = {k: SHARE[k] for k in kinds}
    total = sum(share.values())
    jobs = []
    for k in kinds:
        n = max(1, round(count * share[k] / total))
        jobs += [(k, seed * 100_003 + i * 7 + KINDS.index(k)) for i in range(n)]
    random.Random(seed).shuffle(jobs)  # kinds interleaved: a sweep stopped early still covers each
    return jobs


def sweep(count: int, kinds: tuple[str, ...], seed: int, jobs: int, timeout: float, base: Path,
          log=print, full_every: int = 1, partial=None) -> dict:
    """Run the sweep in `base`; returns {"counts": {kind: {outcome: n}}, "examples": [...], "inputs": n}."""
    templates = make_templates(base, kinds)
    baselines = {k: baseline_of(k, templates[k], base) for k in kinds}
    # the project imported once here, so each forked child starts warm (no thread is started by imports)
    import miles_profile.report.build  # noqa: F401
    import miles_profile.report.html  # noqa: F401
    import miles_profile.visualize  # noqa: F401
    counts = {k: collections.Counter() for k in kinds}
    examples = []
    running: dict[int, tuple] = {}
    queue = plan(count, kinds, seed)
    started = time.monotonic()
    done_n = started_n = 0
    full_n = 0
    while queue or running:
        while queue and len(running) < jobs:
            kind, s = queue.pop(0)
            work = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=base))
            full = started_n % full_every == 0
            started_n += 1
            full_n += full
            pid = os.fork()
            if pid == 0:
                child_main(kind, templates[kind], work, s, timeout, full)
            running[pid] = (kind, s, work, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for p, (kind, s, work, t0) in list(running.items()):
                if time.monotonic() - t0 > timeout:
                    os.kill(p, signal.SIGKILL)
                    os.waitpid(p, 0)
                    del running[p]
                    done_n += 1
                    _record_outcome(kind, s, work, None, baselines, counts, examples)
            time.sleep(0.02)
            continue
        if pid not in running:
            continue
        kind, s, work, _ = running.pop(pid)
        done_n += 1
        _record_outcome(kind, s, work, os.waitstatus_to_exitcode(status), baselines, counts, examples)
        if done_n % 25 == 0:
            log(f"{done_n} inputs, {time.monotonic() - started:.0f} s: "
                f"{ {k: dict(v) for k, v in counts.items()} }")
            if partial is not None:  # what is counted so far, should the sweep be stopped
                partial({"counts": {k: dict(v) for k, v in counts.items()}, "examples": examples, "partial": True,
                         "full_reports": full_n, "inputs": done_n, "seconds": time.monotonic() - started})
    return {"counts": {k: dict(v) for k, v in counts.items()}, "examples": examples, "full_reports": full_n,
            "inputs": sum(sum(v.values()) for v in counts.values()), "seconds": time.monotonic() - started}


def _record_outcome(kind, seed, work, rc, baselines, counts, examples) -> None:
    outcome = classify(work, rc, baselines[kind])
    counts[kind][outcome] += 1
    if outcome != "ok":
        info = json.loads((work / "damage.json").read_text()) if (work / "damage.json").exists() else {}
        err = (work / "stderr").read_text(errors="replace")[-600:] if (work / "stderr").exists() else ""
        examples.append({"kind": kind, "seed": seed, "outcome": outcome, "damage": info.get("damage"),
                         "stderr": err})
    shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1050)
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--full-every", type=int, default=1, metavar="N",
                        help="every Nth input gets the whole report (timeline figure and HTML page); the others "
                             "the readers, checks and --json only (default: %(default)s, every input)")
    parser.add_argument("--templates", default=None, metavar="DIR",
                        help="keep the recorded templates (and their intact reports) in DIR and reuse those found "
                             "there (default: a temporary directory, removed at the end)")
    parser.add_argument("--out", default=None, help="write the counts and the non-ok examples here (JSON)")
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if not set(kinds) <= set(KINDS):
        parser.error(f"--kinds: one or more of {', '.join(KINDS)}")
    with tempfile.TemporaryDirectory(prefix="miles-sweep-") as scratch:
        base = Path(args.templates) if args.templates else Path(scratch)
        base.mkdir(parents=True, exist_ok=True)
        result = sweep(args.count, kinds, args.seed, args.jobs, args.timeout, base,
                       log=lambda line: print(line, file=sys.stderr, flush=True), full_every=max(1, args.full_every),
                       partial=(lambda r: Path(args.out).write_text(json.dumps(r, indent=1))) if args.out else None)
    total = collections.Counter()
    for kind, c in result["counts"].items():
        total.update(c)
        print(f"{kind:10} {sum(c.values()):5} inputs  " + "  ".join(f"{o} {c.get(o, 0)}" for o in OUTCOMES))
    print(f"{'all':10} {sum(total.values()):5} inputs  " + "  ".join(f"{o} {total.get(o, 0)}" for o in OUTCOMES)
          + f"  ({result['seconds']:.0f} s; {result['full_reports']} with the whole HTML report)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    bad = sum(total.get(o, 0) for o in ("traceback", "hang", "internal", "false_fail", "silent_pass"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
