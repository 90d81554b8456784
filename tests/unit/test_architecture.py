"""The layers hold (docs/architecture.md): import-linter's contracts in pyproject.toml, no private name
imported across packages, and the doc's picture is the code's. A change that runs an import back up fails
here, in `make test` and in CI."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("miles_profile", "trainer", "dashboards")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    # --no-cache: nothing written into the checkout; cwd: import-linter finds the packages and pyproject there
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=120)


def test_import_contracts_are_kept():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory) -> Path:
    """The packages and pyproject.toml copied, to break a contract in without touching the checkout."""
    root = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize("module, line, broken", [
    ("miles_profile/runmodel/series.py", "from miles_profile.report import figures", "is not allowed to import"),
    ("miles_profile/verdicts/types.py", "import dashboards.app", "is not allowed to import"),
    ("miles_profile/probes/host.py", "import plotly.graph_objects", "is not allowed to import plotly"),
    ("trainer/offload.py", "from miles_profile.verdicts import engine", "is not allowed to import"),
])
def test_an_import_back_up_breaks_a_contract(tree_copy, module, line, broken):
    path = tree_copy / module
    kept = path.read_text()
    path.write_text(kept + f"\n{line}  # the violation under test\n")
    try:
        result = lint_imports(tree_copy)
    finally:
        path.write_text(kept)
    assert result.returncode != 0
    assert broken in result.stdout, result.stdout[-3000:]


def _package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def private_imports_across_packages() -> list[str]:
    """`from a.b import _x` (and `b._x` on a module imported from elsewhere) where b's package is not the
    importer's: a private name is its package's business; another package needs it public."""
    modules = _modules()
    found = []
    for module, path in sorted(modules.items()):
        is_package = path.name == "__init__.py"
        own = _package_of(module, is_package)
        tree = ast.parse(path.read_text(), str(path))
        aliases: dict[str, str] = {}  # local name -> a module of ours it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".") if is_package else module.split(".")[:-1]
                    base = ".".join(anchor[:len(anchor) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in modules:  # a module: its attributes are checked below
                        aliases[alias.asname or alias.name] = target
                    elif (alias.name.startswith("_") and not alias.name.startswith("__") and base in modules
                          and _package_of(base, modules[base].name == "__init__.py") != own):
                        found.append(f"{module}:{node.lineno} imports {base}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                target = aliases[node.value.id]
                if _package_of(target, modules[target].name == "__init__.py") != own:
                    found.append(f"{module}:{node.lineno} uses {target}.{node.attr}")
    return found


def test_no_private_name_is_imported_across_packages():
    assert private_imports_across_packages() == []


def test_the_private_name_scan_finds_one(tmp_path, monkeypatch):
    """The scan itself: a module of another package that imports a private name is named."""
    fake = tmp_path / "repo"
    for package in PACKAGES:
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text("")
    (fake / "miles_profile" / "verdicts").mkdir()
    (fake / "miles_profile" / "verdicts" / "__init__.py").write_text("")
    (fake / "miles_profile" / "verdicts" / "headroom.py").write_text("def _host_total(run):\n    return 0\n")
    (fake / "miles_profile" / "runmodel").mkdir()
    (fake / "miles_profile" / "runmodel" / "__init__.py").write_text("")
    (fake / "miles_profile" / "runmodel" / "whatif.py").write_text(
        "from miles_profile.verdicts.headroom import _host_total\n"
        "from miles_profile.verdicts import headroom\n"
        "total = headroom._host_total\n")
    (fake / "miles_profile" / "verdicts" / "gate.py").write_text(
        "from miles_profile.verdicts.headroom import _host_total  # same package: allowed\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    assert private_imports_across_packages() == [
        "miles_profile.runmodel.whatif:1 imports miles_profile.verdicts.headroom._host_total",
        "miles_profile.runmodel.whatif:3 uses miles_profile.verdicts.headroom._host_total",
    ]


def test_the_layers_picture_in_the_docs_is_the_codes():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import architecture_graph
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    committed = architecture_graph.committed_block(architecture_graph.DOC.read_text())
    assert committed == architecture_graph.block(), (
        "docs/architecture.md's picture is stale: PYTHONPATH=. python scripts/architecture_graph.py --write")
