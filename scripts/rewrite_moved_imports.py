"""Rewrite references to modules that moved (docs/architecture-moves.tsv: old dotted path, tab, new) in
the Python and Markdown files of a checkout: for code written before a move, e.g. a branch merged after it.

    python scripts/rewrite_moved_imports.py [ROOT]      # prints each file it rewrote

Handles `from old.pkg.mod import x`, `import old.pkg.mod`, dotted strings (`"old.pkg.mod.attr"`), the file
paths (`old/pkg/mod.py`, `pkg/mod.py`) and `from old.pkg import mod, other` (split in two lines when only
some of the names moved). Idempotent: a second run changes nothing.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", ".venv", "node_modules", "__pycache__"}


def moves(root: Path) -> dict[str, str]:
    rows = (line.split("\t") for line in (root / "docs" / "architecture-moves.tsv").read_text().splitlines() if line)
    return {old.strip(): new.strip() for old, new in rows}


def rewrite(text: str, moved: dict[str, str]) -> str:
    for old, new in moved.items():
        text = re.sub(rf"\b{re.escape(old)}\b", new, text)
        old_path, new_path = old.replace(".", "/"), new.replace(".", "/")
        text = re.sub(rf"\b{re.escape(old_path)}\.py\b", f"{new_path}.py", text)
        short_old, short_new = old_path.split("/", 1)[1], new_path.split("/", 1)[1]  # report/x.py -> runmodel/x.py
        text = re.sub(rf"(?<![\w/]){re.escape(short_old)}\.py\b", f"{short_new}.py", text)
    by_package: dict[str, dict[str, str]] = {}
    for old, new in moved.items():
        package, _, name = old.rpartition(".")
        by_package.setdefault(package, {})[name] = new.rpartition(".")[0]
    lines = []
    for line in text.split("\n"):
        found = re.match(r"^(\s*)from ([\w.]+) import ([\w, ]+?)(\s*(#.*)?)$", line)
        if not found or found.group(2) not in by_package:
            lines.append(line)
            continue
        indent, package, names, tail = found.group(1), found.group(2), found.group(3), found.group(4)
        targets: dict[str, list[str]] = {}
        for item in (n.strip() for n in names.split(",")):
            target = by_package[package].get(item.split(" as ")[0].strip(), package)
            targets.setdefault(target, []).append(item)
        out = [f"{indent}from {target} import {', '.join(items)}" for target, items in targets.items()]
        out[-1] += tail
        lines.extend(out)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0]) if argv else ROOT
    moved = moves(ROOT)
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".py", ".md") or SKIP & set(path.parts) or not path.is_file():
            continue
        text = path.read_text()
        new = rewrite(text, moved)
        if new != text:
            path.write_text(new)
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
