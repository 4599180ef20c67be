"""The code is linted, formatted and type-checked as pyproject.toml configures it: ruff (lint and
format, 100 columns) over the package, its tests, scripts and examples; mypy over the package,
strict where the contracts are (the orchestrator, the backends' contract, the schema). And every
function of the package reads at once: none is over 60 lines."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.harness import REPO

LINTED = ["rayflow", "hydra_plugins", "tests", "scripts", "examples"]
LONGEST_FUNCTION = 60  # lines, from `def` to its last line (nested functions count in their parent)


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{name} is not installed (the test extra: bash scripts/setup.sh --test)"
    return str(path)


def test_ruff_finds_nothing():
    done = subprocess.run(
        [_tool("ruff"), "check", "--output-format", "concise", *LINTED],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_code_is_formatted():
    # the whole tree, as `ruff format --check .` reads it: the docs' Python blocks too
    done = subprocess.run(
        [_tool("ruff"), "format", "--check", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_mypy_finds_nothing():
    done = subprocess.run([_tool("mypy")], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_function_of_the_package_is_over_sixty_lines():
    long = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted((REPO / "rayflow").rglob("*.py"))
        for node in _functions(path)
        if node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION
    ]
    assert long == []


LONGEST_MODULE = 500  # lines: past it a module holds more than one purpose; split it by purpose


def test_no_module_of_the_package_is_over_five_hundred_lines():
    long = [
        f"{path.relative_to(REPO)} ({n} lines)"
        for path in sorted((REPO / "rayflow").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > LONGEST_MODULE
    ]
    assert long == []


def test_at_most_twelve_modules_sit_directly_under_rayflow():
    modules = sorted(p.name for p in (REPO / "rayflow").glob("*.py"))
    assert len(modules) <= 12, modules
