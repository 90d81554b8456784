"""The layers' picture in docs/architecture.md, generated from the code: the import graph (grimp, what
import-linter reads) folded into one node per layer, as a Mermaid flowchart (GitHub draws it).

    PYTHONPATH=. python scripts/architecture_graph.py            # print the Mermaid block
    PYTHONPATH=. python scripts/architecture_graph.py --write    # replace the block in docs/architecture.md

An edge A --> B: some module of A imports one of B (no counts: the picture changes only when a layer
starts or stops depending on another). The shared vocabulary (names, sizes, errors, ...) is imported by
every layer: those edges are left out.
tests/unit/test_architecture.py fails when the committed picture is not the code's.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- architecture_graph.py: begin -->", "<!-- architecture_graph.py: end -->"

# (node id, label, module prefixes), checked in order; a module belongs to the first that matches.
LAYERS = [
    ("cli", "CLIs: visualize, record, pytest plugin", ["miles_profile.visualize", "miles_profile.record",
                                                       "miles_profile.pytest_plugin"]),
    ("dashboards", "dashboards/ (Dash app)", ["dashboards"]),
    ("report", "report/ (HTML, figures, exports)", ["miles_profile.report"]),
    ("metrics", "metrics/ (Prometheus exposition)", ["miles_profile.metrics"]),
    ("verdicts", "verdicts/ (every check, once)", ["miles_profile.verdicts"]),
    ("runmodel", "runmodel/ (pure computations of a run)", ["miles_profile.runmodel"]),
    ("importers", "importers/ (Miles' own logs)", ["miles_profile.importers"]),
    ("logdir", "logdir/ (the log format)", ["miles_profile.logdir"]),
    ("integrations", "integrations/ (HF, Lightning)", ["miles_profile.integrations"]),
    ("cluster", "Ray", ["miles_profile.ray", "miles_profile.cluster"]),
    ("recorder", "recorder (probes, samplers, phase API)", [
        "miles_profile.recorder", "miles_profile.sampler", "miles_profile.host_sampler", "miles_profile.probes",
        "miles_profile.phases", "miles_profile.oom", "miles_profile.stacks", "miles_profile.lifetime"]),
    ("trainer", "trainer/ (the RL loop)", ["trainer"]),
    ("api", "miles_profile (load, phase, Recorder)", []),  # the package itself, exactly
    # names, sizes, errors, identity, phase_select, phase_summary, command_exit, calibrate, process_exit:
    # imported from every layer, importing none of them; their edges are left out of the picture.
    ("shared", "shared vocabulary", ["miles_profile"]),
]


def layer_of(module: str) -> str:
    if module == "miles_profile":
        return "api"
    for node, _, prefixes in LAYERS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return node
    raise ValueError(module)


def edges() -> Counter:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("miles_profile", "trainer", "dashboards", cache_dir=None)
    found: Counter = Counter()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = layer_of(importer), layer_of(imported)
            if a != b and b != "shared":
                found[a, b] += 1
    return found


def mermaid() -> str:
    found = edges()
    present = {n for pair in found for n in pair}
    lines = ["```mermaid", "flowchart TD"]
    lines += [f'    {node}["{label}"]' for node, label, _ in LAYERS if node in present]
    order = {node: k for k, (node, _, _) in enumerate(LAYERS)}
    for a, b in sorted(found, key=lambda pair: (order[pair[0]], order[pair[1]])):
        lines.append(f"    {a} --> {b}")
    lines.append("```")
    return "\n".join(lines)


def block() -> str:
    return f"{BEGIN}\n{mermaid()}\n{END}"


def committed_block(text: str) -> str:
    return text[text.index(BEGIN):text.index(END) + len(END)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"replace the block in {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if not args.write:
        print(mermaid())
        return 0
    text = DOC.read_text()
    DOC.write_text(text.replace(committed_block(text), block()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
