"""The house's shape: the layers of [tool.importlinter] hold, no import circle anywhere in rayflow/
(inside packages too), one package per engine, no module left that only re-exports others,
Ray's and Hydra's private modules used through their doors only, and no module global rebound by a
`global` statement."""

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


def _engines() -> tuple[set[str], set[str]]:
    """The backends' homes, read from the registry (the one list of backends): the engine
    packages (rayflow.backends.<engine>.<module>) and the single modules (rayflow.backends.<name>).
    rayflow's own backends only: plugins (entry points, rayflow.backends.backends()) live in
    their own packages, outside this tree."""
    from rayflow.backends import REGISTRY

    parts = [entry.backend.partition(":")[0].split(".") for entry in REGISTRY.values()]
    return {p[2] for p in parts if len(p) == 4}, {p[2] for p in parts if len(p) == 3}


def test_one_package_per_engine_and_no_prefixed_modules():
    backends = REPO / "rayflow" / "backends"
    engines, single = _engines()
    assert engines and single, (engines, single)
    for engine in engines:
        assert (backends / engine / "__init__.py").is_file(), engine
        assert not (backends / f"{engine}.py").exists()
    # the contract's modules (base, handle, kept, keys), the registry, and the one-module backends
    assert sorted(p.stem for p in backends.glob("*.py")) == sorted(
        {"__init__", "base", "handle", "kept", "keys", *single}
    )


def test_every_engine_is_independent_of_the_others():
    """pyproject's import-linter contract names the engines: a new one is in it, or it could
    import another engine unseen."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    [independence] = [c for c in contracts["contracts"] if c["type"] == "independence"]
    engines, _ = _engines()
    assert set(independence["modules"]) == {f"rayflow.backends.{e}" for e in engines}


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


# The doors to Ray's and Hydra's private modules (issue 47): every import of one (`ray._private`,
# `ray.autoscaler._private`, `ray._raylet`, `hydra._internal`, a `_name` of theirs) and every
# private attribute of theirs read (`cluster_init._active_ray_cluster`) is in one of these, so an
# upgrade of either is checked in one place.
PRIVATE_DOORS = {
    "rayflow/runtime/ray_internals.py",
    "rayflow/runtime/hydra_internals.py",
    "rayflow/backends/vm/internals.py",
}
ENGINES = ("ray", "hydra")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each private module or name of Ray or Hydra a module imports (a part of
    the module's path, or an imported name, starting with one underscore), and each private
    attribute read of a name it imported from them (`ray._private.worker`, `cluster_init._x`)."""
    found, bound = [], set()  # bound: the names Ray's and Hydra's imports bind, anywhere in it
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in ENGINES:
                    bound.add(alias.asname or parts[0])
                    if any(map(_private, parts)):
                        found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] in ENGINES:
                bound.update(alias.asname or alias.name for alias in node.names)
                names = [a.name for a in node.names]
                if any(map(_private, parts)) or any(map(_private, names)):
                    found.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_rays_and_hydras_private_parts_are_used_through_their_doors_only():
    used = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in sorted((REPO / "rayflow").rglob("*.py"))
        if path.relative_to(REPO).as_posix() not in PRIVATE_DOORS
        for line, what in _private_uses(ast.parse(path.read_text()))
    ]
    assert used == [], (
        "Ray's and Hydra's private modules and names go through their doors (a function there, "
        f"saying why no public API does it): {sorted(PRIVATE_DOORS)}"
    )


def test_the_private_use_finder_finds_them():
    code = """
import ray
import ray._private.services as services
from hydra._internal.utils import get_args_parser
from ray.autoscaler.sdk import _helper
from ray.util.spark import cluster_init, setup_ray_cluster
from rayflow.runtime import _ours
import ray.util


def f():
    return ray._private.worker, cluster_init._active_ray_cluster, ray.util.get_node_ip_address
"""
    assert [line for line, _ in _private_uses(ast.parse(code))] == [3, 4, 5, 12, 12]


def test_the_doors_import_their_engine_when_called_and_nothing_of_rayflow():
    """Importing rayflow imports no Ray and no Hydra through a door; and a door imports nothing of
    rayflow, so that any layer may call it (rayflow.security does: pyproject's ignore_imports)."""
    for door in sorted(PRIVATE_DOORS):
        tree = ast.parse((REPO / door).read_text())
        top = [
            alias.name if isinstance(node, ast.Import) else node.module
            for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        ]
        assert not [m for m in top if m and m.split(".")[0] in ENGINES], door
        every = [
            alias.name if isinstance(node, ast.Import) else node.module
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        ]
        assert not [m for m in every if m and m.split(".")[0] == "rayflow"], door


def _global_statements(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, the names) of each `global` statement in a module, at any depth."""
    return sorted(
        (node.lineno, ", ".join(node.names))
        for node in ast.walk(tree)
        if isinstance(node, ast.Global)
    )


def test_no_module_rebinds_a_global():
    """Mutable state lives in the object that owns it (issue 47): a run's on its session, cluster
    or handle; what is the process's in one instance of a small class whose docstring says why.
    Never in a module global that a function rebinds."""
    found = [
        f"{path.relative_to(REPO)}:{line}: global {names}"
        for path in sorted((REPO / "rayflow").rglob("*.py"))
        for line, names in _global_statements(ast.parse(path.read_text()))
    ]
    assert found == [], (
        "a `global` statement in rayflow/: move the state into the object that owns it "
        f"(a small class, one instance held by the module): {found}"
    )


def test_the_global_finder_finds_them():
    code = """
_a = None


def f():
    global _a
    _a = 1


class C:
    def g(self):
        global _a, _b
"""
    assert _global_statements(ast.parse(code)) == [(6, "_a"), (12, "_a, _b")]


def test_tests_never_import_conftest_as_a_module():
    offenders = [
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("*.py")
        if "tests.conftest" in p.read_text() and p.name != "test_layout.py"
    ]
    assert offenders == []


# docs/architecture.md, "Layout": a code block of the tree. An entry is a line with its name
# before LAYOUT_COLUMN (two spaces of indent per level, a folder's name ending in "/"), its
# description from LAYOUT_COLUMN on; a line blank up to LAYOUT_COLUMN goes on with the entry above.
LAYOUT_COLUMN = 28


def _layout_lines() -> list[str]:
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```\n")[1].splitlines()  # the section's first code block


def _layout_paths(lines: list[str]) -> list[str]:
    """The paths (relative to the repository, a folder's ending in "/") the layout's entries name."""
    folders: list[str] = []  # the folder of each level above the current entry
    paths = []
    for line in lines:
        head = line[:LAYOUT_COLUMN]
        if not head.strip():
            assert line[LAYOUT_COLUMN:][:1] not in ("", " "), (
                f"a description starts at column {LAYOUT_COLUMN + 1}: {line!r}"
            )
            continue
        indent = len(head) - len(head.lstrip())
        assert indent % 2 == 0 and indent // 2 <= len(folders), (
            f"two spaces a level, under a folder: {line!r}"
        )
        assert len(head.split()) == 1 and head.endswith(" "), (
            f"one name, ending before column {LAYOUT_COLUMN}: {line!r}"
        )
        assert line[LAYOUT_COLUMN:][:1] != " ", (
            f"a description starts at column {LAYOUT_COLUMN + 1}: {line!r}"
        )
        folders = folders[: indent // 2]
        name = head.strip()
        paths.append("".join(folders) + name)
        if name.endswith("/"):
            folders.append(name)
    return paths


def test_the_layout_reader_reads_a_tree():
    lines = [
        "rayflow/                    the package",
        "  api.py                    rayflow.run,",
        "                            continued",
        "  schema/                   every key",
        "    kinds.py                kinds",
        "  cli.py                    the command line",
        "docs/                       this site",
    ]
    assert _layout_paths(lines) == [
        "rayflow/",
        "rayflow/api.py",
        "rayflow/schema/",
        "rayflow/schema/kinds.py",
        "rayflow/cli.py",
        "docs/",
    ]


def test_the_layout_names_every_package_and_module_and_nothing_else():
    """docs/architecture.md's layout names every package of rayflow/ and every module in each
    (an __init__.py where it says something), and nothing that is not there."""
    named = _layout_paths(_layout_lines())
    assert len(named) == len(set(named)), [p for p in named if named.count(p) > 1]
    wrong = [p for p in named if (REPO / p).is_dir() != p.endswith("/") or not (REPO / p).exists()]
    assert wrong == [], f"the layout names what is not there (or a file as a folder): {wrong}"
    packages = [REPO / "rayflow", *(p.parent for p in (REPO / "rayflow").rglob("__init__.py"))]
    required = set()
    for package in packages:
        folder = package.relative_to(REPO).as_posix() + "/"
        required.add(folder)
        required.update(folder + m.name for m in package.glob("*.py") if m.name != "__init__.py")
    assert sorted(required - set(named)) == [], "name these in docs/architecture.md's layout"


def test_the_wheel_lists_every_package_of_the_tree():
    """pyproject.toml names its packages (conf/ and backends/ ship under other names, which
    setuptools' finder cannot map): a package folder left out of the list would be missing from
    the wheel, with nothing failing until a user imports it."""
    import tomllib

    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in ("rayflow", "hydra_plugins")
        for init in (REPO / top).rglob("__init__.py")
    }
    assert found - listed == set(), "packages missing from pyproject.toml's list"
    assert {p for p in listed if p.startswith(("rayflow.", "hydra_plugins."))} - found <= {
        name for name in listed if name.startswith(("rayflow.conf", "rayflow.cluster_defs"))
    }, "listed packages that are not in the tree"


def test_each_engine_packages_docstring_names_its_modules():
    """An engine package's docstring is its map: every module in it is named there (`name`)."""
    import importlib

    engines, _ = _engines()
    unnamed = []
    for engine in sorted(engines):
        doc = importlib.import_module(f"rayflow.backends.{engine}").__doc__ or ""
        for module in sorted((REPO / "rayflow" / "backends" / engine).glob("*.py")):
            if module.stem != "__init__" and f"`{module.stem}`" not in doc:
                unnamed.append(f"{engine}/{module.name}")
    assert unnamed == []
