"""The house's shape: the layers of [tool.importlinter] hold, no import circle anywhere in rayflow/
(inside packages too), one package per engine, and no module left that only re-exports others."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from tests.harness import REPO


def test_lint_imports_keeps_every_contract():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "lint-imports (import-linter, the test extra) is not installed"
    done = subprocess.run(
        [lint, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_anywhere_in_rayflow():
    import grimp

    graph = grimp.build_graph("rayflow")
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    # a package's __init__ importing its own submodules is how a package offers them, not a circle
    for module, targets in imports.items():
        targets -= {t for t in targets if t.startswith(module + ".")}
    assert _cycles(imports) == []


def test_the_circle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_one_package_per_engine_and_no_prefixed_modules():
    backends = REPO / "rayflow" / "backends"
    for engine in ("spark", "vm", "kuberay"):
        assert (backends / engine / "__init__.py").is_file(), engine
        assert not (backends / f"{engine}.py").exists()
    assert sorted(p.name for p in backends.glob("*.py")) == [
        "__init__.py",
        "attach.py",
        "base.py",
        "handle.py",
        "keys.py",
        "local.py",
    ]


def _is_shim(path: Path) -> bool:
    """A module whose body, past its docstring, is only imports and an __all__ naming them."""
    body = ast.parse(path.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    imports = [
        n
        for n in body
        if isinstance(n, (ast.Import, ast.ImportFrom))
        and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
    ]
    rest = [
        n
        for n in body
        if n not in imports
        and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
        and not (
            isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
        )
    ]
    return bool(imports) and not rest


def test_no_shim_modules():
    # The package's face (rayflow/__init__.py) and the testing package's are the only re-exports.
    allowed = {
        REPO / "rayflow" / "__init__.py",
        REPO / "rayflow" / "testing" / "__init__.py",
        REPO / "rayflow" / "__main__.py",
    }
    shims = [
        str(p.relative_to(REPO))
        for p in (REPO / "rayflow").rglob("*.py")
        if p not in allowed and _is_shim(p)
    ]
    assert shims == []


def test_tests_never_import_conftest_as_a_module():
    offenders = [
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("*.py")
        if "tests.conftest" in p.read_text() and p.name != "test_layout.py"
    ]
    assert offenders == []
