"""Issue 19 item 13: the Miles importer's topology stream (engines registering one at a time) is decoded
once from its appended tail, fast and small, and through the guarded open. Split from
test_faults_readers_round3.py (one file per reader)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.faults.test_faults_files import child
from tests.faults.test_faults_readers_round3 import miles_dump

def test_engines_registering_one_at_a_time_are_built_once_not_per_snapshot(tmp_path):
    from miles_profile.importers.miles_dashboard import load_miles_dashboard
    from miles_profile.importers.miles_topology import topology
    root = miles_dump(tmp_path)
    start = 1_767_225_540.0
    engines = [{"addr": f"http://n{e // 8}:{30000 + e}", "engine_rank": e, "gpus": [[f"n{e // 8}", e % 8]],
                "gpu_uuids": [None]} for e in range(300)]
    lines = [json.dumps({"ts": start + 2 + k * 1e-3, "engines": engines[: k + 1]}) for k in range(300)]
    lines.insert(5, json.dumps({"ts": start + 2.0041, "engines": engines[:4] + [{"addr": "x", "gpus": [7]}]}))
    (root / "topology.jsonl").write_text("\n".join(lines) + "\n")  # one damaged snapshot among them
    warnings: list[str] = []
    snapshots = topology(root, warnings)
    assert len(snapshots) == 300 and warnings == ["topology: skipped 1 malformed snapshot"]
    assert len({id(w) for s in snapshots for w in s["workers"]}) == 300  # 45,150 listings, 300 dicts
    run = load_miles_dashboard(root)
    assert sum(p["role"] == "engine" for p in run.processes) == 300


def _topology_by_decoding_every_line(text: str) -> list[tuple]:
    """What the topology stream holds, by json.loads of every line (the reader before issue 19 item 13)."""
    from miles_profile.importers.miles_topology import _engine_workers
    snapshots, seen = [], set()
    for line in text.splitlines():
        try:
            row = json.loads(line)
            workers, new, keys = [], [], []
            for engine in row.get("engines") or []:
                key = (engine["addr"], engine.get("engine_rank"), json.dumps(engine.get("gpus")),
                       json.dumps(engine.get("gpu_uuids")))
                found = [tuple(w.values()) for w in _engine_workers(engine)]
                if key not in seen:  # listed twice in its first snapshot: new twice, as before
                    new += found
                keys.append(key)
                workers += found
            snapshots.append((float(row["ts"]), workers, new))
            seen.update(keys)
        except (AttributeError, KeyError, TypeError, ValueError, RecursionError):
            pass
    return sorted(snapshots, key=lambda s: s[0])


def _engine(e: int) -> dict:
    return {"addr": f"http://n{e // 8}:{30000 + e % 8}", "worker_type": "regular", "engine_rank": e,
            "gpus": [[f"n{e // 8}", e % 8]], "gpu_uuids": [None if e % 3 else f"GPU-{e:04d}"]}


@pytest.mark.parametrize("seed", range(6))
def test_topology_decoded_by_its_appended_tail_equals_every_line_decoded(tmp_path, seed):
    """Engines registering, re-listed, gone, reordered, re-spaced, keys in another order, damaged lines:
    the reader that decodes only what a line appends to the previous one reads what full decoding reads."""
    import random
    from miles_profile.importers.miles_topology import topology
    rng, listed, lines, ts = random.Random(seed), [], [], 1000.0
    for step in range(300):
        ts += rng.choice([0.001, 0.5, -0.2])  # out of file order now and then
        what = rng.random()
        if what < 0.6 or not listed:
            listed.append(_engine(len(listed) + 1000 * seed))
        elif what < 0.65:
            listed.pop(rng.randrange(len(listed)))
        elif what < 0.7:
            k = rng.randrange(len(listed))
            listed[k], listed[-1] = listed[-1], listed[k]
        elif what < 0.73:
            listed.append(dict(listed[0]))  # the same engine twice in one snapshot
        line = {"ts": ts, "engines": listed}
        shape = rng.random()
        if shape < 0.05:
            text = json.dumps(line)  # Python's default spacing
        elif shape < 0.08:
            text = json.dumps({"engines": listed, "ts": ts}, separators=(",", ":"))
        elif shape < 0.10:
            text = json.dumps({**line, "extra": [1]}, separators=(",", ":"))
        elif shape < 0.14:  # a damaged engine appended: the whole line is skipped
            text = json.dumps({"ts": ts, "engines": [*listed, {"addr": "x", "gpus": [7]}]}, separators=(",", ":"))
        elif shape < 0.16:
            text = json.dumps(line, separators=(",", ":"))[:-40]  # cut short
        elif shape < 0.17:
            text = "[" * 5000 + "]" * 5000
        else:
            text = json.dumps(line, separators=(",", ":"))
        lines.append(text)
    text = "\n".join(lines) + "\n" + json.dumps({"ts": ts, "engines": listed})[:-3]  # a writer mid-append
    (tmp_path / "topology.jsonl").write_text(text)
    warnings: list[str] = []
    got = [(s["t0"], [tuple(w.values()) for w in s["workers"]], [tuple(w.values()) for w in s["new"]])
           for s in topology(tmp_path, warnings)]
    assert got == _topology_by_decoding_every_line(text.rsplit("\n", 1)[0])
    assert "topology/topology.jsonl: dropped a truncated last line" in warnings
    assert sum(w.startswith("topology: skipped ") for w in warnings) == 1, warnings


def test_a_thousand_engines_registering_one_at_a_time_read_in_little_time_and_memory(tmp_path):
    """Issue 19 item 13: 3,000 engines took 84-109 s to import, 70 s of it json.loads of N snapshots of
    1..N engines. At 1,000 engines (79 MB) the reader before took 4.1 CPU s and 150 MiB of Python memory
    here; decoding only the appended tail of each line, in the mapped file, takes 0.07 s and 5.5 MiB."""
    import time
    import tracemalloc
    from miles_profile.importers.miles_topology import topology
    with open(tmp_path / "topology.jsonl", "w") as f:
        body = ""
        for e in range(1000):
            text = json.dumps(_engine(e), separators=(",", ":"))
            body = f"{body},{text}" if body else text
            f.write(f'{{"ts":{1000 + e * 1e-3:.3f},"engines":[{body}]}}\n')
    started = time.process_time()
    snapshots = topology(tmp_path, [])
    cpu = time.process_time() - started
    tracemalloc.start()
    try:
        topology(tmp_path, [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [len(s["workers"]) for s in snapshots] == list(range(1, 1001))
    assert sum(len(s["new"]) for s in snapshots) == 1000
    assert cpu < 1.0 and peak < 32 * 2 ** 20, (cpu, peak)


def test_the_mapped_topology_keeps_the_guarded_open(tmp_path):
    """The topology stream is mapped, not read, and still goes through the guarded open: a FIFO is
    skipped with a warning (never opened blocking), a 2 GiB hole is never read, a line cut by the hole
    is a malformed line."""
    fifo, sparse = tmp_path / "fifo", tmp_path / "sparse"
    fifo.mkdir()
    os.mkfifo(fifo / "topology.jsonl")
    sparse.mkdir()
    line = json.dumps({"ts": 1.0, "engines": [_engine(0)]}, separators=(",", ":"))
    with open(sparse / "topology.jsonl", "w") as f:
        f.write(line + "\n" + line[:30])
    os.truncate(sparse / "topology.jsonl", 2 * 1024 ** 3)
    with open(sparse / "topology.jsonl", "a") as f:
        f.write(line[30:].replace('"ts":1.0', '"ts":2.0') + "\n" + line.replace('"ts":1.0', '"ts":3.0') + "\n")
    result = child(f"""
        from pathlib import Path
        from miles_profile.importers.miles_topology import topology
        result = {{}}
        for name in ("fifo", "sparse"):
            warnings = []
            snapshots = topology(Path({str(tmp_path)!r}) / name, warnings)
            result[name] = [[s["t0"] for s in snapshots], warnings]
    """, timeout=60)
    assert result["fifo"][0] == [] and "a FIFO" in result["fifo"][1][0], result["fifo"]
    assert result["sparse"] == [[1.0, 3.0], ["topology: skipped 2 malformed snapshots"]]
    assert result["maxrss"] < 600 * 1024 ** 2
