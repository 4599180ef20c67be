"""The docs: the MkDocs site builds with --strict (no broken link, anchor or API reference), the
README stays short and links into it, and every page is in the nav."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]  # the repository root, without the test harness


def test_the_site_builds_strictly(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]  # mkdocs logs to stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    # mkdocstrings rendered each top-level name of the Python API (a re-export it could not resolve fails the build)
    for name in (
        "run",
        "compose",
        "dry_run",
        "RunResult",
        "ConfigError",
        "RunFailed",
        "RunInterrupted",
    ):
        assert f'id="rayflow.{name}"' in api, name


def test_the_readme_is_short_and_its_links_exist():
    text = (REPO / "README.md").read_text()
    assert len(text.encode()) <= 8192
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local and all((REPO / link).exists() for link in local), [
        l for l in local if not (REPO / l).exists()
    ]
    # the test command .ci/run runs
    assert "bash scripts/setup.sh --test && .venv/bin/python -m pytest" in text


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text().replace("!!python", "#"))
    nav = set(_nav_pages(config["nav"]))
    pages = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert nav == pages


def test_the_config_reference_is_generated_from_the_schema():
    """docs/reference/config.md is what `python -m rayflow.reference` prints now: a key
    added, renamed or described anew in the schema or the YAML shows up there, or this fails."""
    from rayflow.reference.config import markdown

    committed = (REPO / "docs" / "reference" / "config.md").read_text()
    assert committed == markdown(), (
        "regenerate: python -m rayflow.reference > docs/reference/config.md"
    )


def test_the_architecture_page_is_generated_from_the_code():
    """docs/architecture.md's generated blocks (the layer tables from pyproject.toml's
    import-linter contracts; ClusterBackend, ClusterHandle, Plan and Workload from their source)
    are what `python -m rayflow.reference architecture` makes of the code now."""
    from rayflow.reference.architecture import architecture_blocks, fill_blocks

    page = (REPO / "docs" / "architecture.md").read_text()
    assert fill_blocks(page, architecture_blocks()) == page, (
        "regenerate: python -m rayflow.reference architecture docs/architecture.md"
    )


def test_the_architecture_generator_fills_only_its_blocks():
    from rayflow.reference.architecture import fill_blocks

    page = "# A\n\n<!-- generated: one -->\nold\n<!-- end generated -->\n\ntext\n"
    assert fill_blocks(page, {"one": "new"}) == (
        "# A\n\n<!-- generated: one -->\n\nnew\n\n<!-- end generated -->\n\ntext\n"
    )
    with pytest.raises(ValueError, match="generated blocks"):
        fill_blocks(page, {"one": "new", "two": "more"})


def test_the_contracts_read_without_a_toml_library_as_with_one():
    """Python 3.10 has no tomllib: the generator's own reading of [tool.importlinter] gives what
    tomllib (or tomli) gives."""
    from rayflow.reference.layers import toml_subset

    toml = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    text = (REPO / "pyproject.toml").read_text()
    assert toml_subset(text)["tool"]["importlinter"] == toml.loads(text)["tool"]["importlinter"]
    assert toml_subset(
        '[a]\nx = 1\n[tool.importlinter]\nk = ["a # b", \n  "c",  # note\n]\nt = true\n'
    ) == {"tool": {"importlinter": {"k": ["a # b", "c"], "t": True}}}


# Names in the docs that look like code but are not modules of the package: Kubernetes labels
# (rayflow.io/run), files rayflow writes (rayflow.json, .rayflow.lock), the launcher's YAML,
# and the packages the wheel maps conf/ and backends/ to.
NOT_MODULES = {
    "rayflow.io",
    "rayflow.json",
    "rayflow.lock",
    "rayflow.manifest.json",  # an experiment's signed manifest
    "rayflow.yaml",
    "rayflow.conf",
    "rayflow.cluster_defs",
}


def _resolves(dotted: str) -> bool:
    """A module of rayflow, or a name in one (found without running a __main__)."""
    import importlib
    import importlib.util

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.util.find_spec(".".join(parts[:cut]))
        except ModuleNotFoundError:
            found = None
        if found is not None:
            break
    else:
        return False
    if cut == len(parts):
        return True
    node = importlib.import_module(".".join(parts[:cut]))
    for part in parts[cut:]:
        if not hasattr(node, part):
            return False
        node = getattr(node, part)
    return True


def _doc_texts() -> dict[str, str]:
    pages = {str(p.relative_to(REPO)): p.read_text() for p in (REPO / "docs").rglob("*.md")}
    return {**pages, "README.md": (REPO / "README.md").read_text()}


def test_every_module_and_file_the_docs_name_exists():
    """No page names a module, a name in one, or a file of the repository that moved or went:
    `rayflow.a.b` resolves, and `rayflow/...`, `tests/...`, `scripts/...`, `conf/...` paths exist
    (a glob matches something; placeholders such as `<name>` end the path)."""
    stale = []
    for page, text in _doc_texts().items():
        for dotted in set(re.findall(r"(?<![\w/.-])rayflow(?:\.[A-Za-z_]\w*)+", text)):
            if dotted not in NOT_MODULES and not _resolves(dotted):
                stale.append(f"{page}: {dotted}")
        pattern = r"(?<![\w/.~$-])(?:rayflow|tests|scripts|conf|hydra_plugins|examples)/[\w/.*-]*"
        for path in set(re.findall(pattern, text)):
            path = path.rstrip(".")
            if not path.endswith(".md") and not list(REPO.glob(path.rstrip("/") or ".")):
                stale.append(f"{page}: {path}")
    assert sorted(stale) == []


# How long the suite takes, as the docs state it for a user planning their time: one wording, one
# figure, wherever it is said (the README and getting started; testing.md has the measurements).
SUITE_TIME = re.compile(r"(?:test suite|the suite) \(?(?:takes )?about ([0-9][0-9\-–]*) minutes")


def test_the_suites_duration_is_stated_the_same_everywhere():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    stated = {p.relative_to(REPO).as_posix(): SUITE_TIME.findall(p.read_text()) for p in pages}
    figures = {figure for found in stated.values() for figure in found}
    assert len(figures) == 1, {page: found for page, found in stated.items() if found}
    assert stated["README.md"] and stated["docs/getting-started.md"]
