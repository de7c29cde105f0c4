"""The layers hold: the import contracts bite, and no import hides inside a function.

docs/architecture.md and .importlinter say what may import what; `make lint` runs
`lint-imports`. These tests show that the check fails when the core imports the reconciler
(a contract that never fails guards nothing), and that no function-level import of the
product's own modules is left to dodge a cycle.
"""

from __future__ import annotations

import ast
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ledger", "reconciler", "emulator")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
RECONCILER_CONTRACT = "Only the application shell imports the reconciler: the core never does"


def lint_imports(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The copy first on the path, and its own folder as cwd: grimp must read the copy, not
    # this tree (the editable install's finder comes after sys.path).
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "400"}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo", *args], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def product_copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tree / ".importlinter")
    return tree


def test_lint_imports_fails_when_the_core_imports_the_reconciler(product_copy: Path):
    where = subprocess.run([sys.executable, "-c", "import ledger; print(ledger.__file__)"], cwd=product_copy,
                           env={**os.environ, "PYTHONPATH": str(product_copy)}, capture_output=True, text=True)
    assert where.stdout.strip() == str(product_copy / "ledger" / "__init__.py")  # the copy is what is read

    kept = lint_imports(product_copy, "--contract", "reconciler")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert RECONCILER_CONTRACT in kept.stdout and "KEPT" in kept.stdout

    fold = product_copy / "ledger" / "fold.py"
    fold.write_text(fold.read_text() + "\nimport reconciler.plan  # noqa: E402,F401\n")
    broken = lint_imports(product_copy)  # every contract, as `make lint` runs it
    assert broken.returncode != 0, broken.stdout
    section = broken.stdout.split("Broken contracts", 1)[-1]
    assert RECONCILER_CONTRACT in section and "ledger.fold -> reconciler.plan" in section, broken.stdout


# ------------------------------------------------------------------ function-level imports
# Lazy imports of the product's own modules that have a reason other than a cycle:
# (file, function, imported module) -> why.
ALLOWED = {
    ("ledger/store/__init__.py", "_backend", "ledger.store.postgres"):
        "only a postgresql:// URL loads the PostgreSQL backend: SQLite users never import psycopg",
}


def _absolute(module: str | None, level: int, rel: str) -> str:
    if not level:
        return module or ""
    package = list(Path(rel).with_suffix("").parts)[:-level]  # the module's package, and up
    return ".".join(package + ([module] if module else []))


def _is_module(root: Path, dotted: str) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@functools.cache
def function_level_imports(root: Path = ROOT) -> frozenset[tuple[str, str, str]]:
    """(file, function, module) for every import of a first-party module inside a function."""
    found: set[tuple[str, str, str]] = set()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), rel)

            def visit(node: ast.AST, function: str | None, rel: str = rel) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                        visit(child, function or getattr(child, "name", "<lambda>"))
                        continue
                    if function is not None and isinstance(child, ast.Import):
                        modules = [alias.name for alias in child.names]
                    elif function is not None and isinstance(child, ast.ImportFrom):
                        base = _absolute(child.module, child.level, rel)
                        # `from package import module` names the module it loads
                        modules = [f"{base}.{a.name}" if _is_module(root, f"{base}.{a.name}") else base
                                   for a in child.names]
                    else:
                        modules = []
                    for module in modules:
                        if module.split(".")[0] in PACKAGES:
                            found.add((rel, function, module))
                    visit(child, function)

            visit(tree, None)
    return frozenset(found)


def test_no_function_level_import_of_the_product_dodges_a_cycle():
    hidden = function_level_imports() - ALLOWED.keys()
    assert not hidden, (
        "imports of the product's own modules inside functions (move them to the top of the "
        "module and break the cycle, or add them to ALLOWED with the reason): "
        + "; ".join(f"{f}:{fn}() imports {m}" for f, fn, m in sorted(hidden)))


def test_the_allow_lists_have_no_stale_entries():
    found = function_level_imports()
    stale = ALLOWED.keys() - found
    assert not stale, f"no longer imported inside a function: delete from the allow-list: {sorted(stale)}"


def test_the_scan_sees_nested_relative_and_method_imports(tmp_path: Path):
    """The scanner would notice an offender: functions, methods, nested functions, relative imports."""
    pkg = tmp_path / "ledger" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "reconciler").mkdir()
    (tmp_path / "emulator").mkdir()
    (pkg / "mod.py").write_text(
        "import json\n"
        "from ledger import fold\n"  # module level: fine
        "def f():\n    import ledger.events\n"
        "class C:\n    def m(self):\n        def inner():\n            from . import other\n"
        "def g():\n    import grpc  # third party: fine\n    from ..store import base\n"
    )
    assert function_level_imports(tmp_path) == {
        ("ledger/sub/mod.py", "f", "ledger.events"),
        ("ledger/sub/mod.py", "m", "ledger.sub"),
        ("ledger/sub/mod.py", "g", "ledger.store"),
    }
