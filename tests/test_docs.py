"""The docs: the MkDocs site builds with --strict (no broken link, anchor or API reference), the
README stays short and links into it, and every page is in the nav."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
    assert (
        "bash scripts/setup.sh --test && .venv/bin/python -m pytest" in text
    )  # the test command .ci/run runs


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
    from rayflow.reference import markdown

    committed = (REPO / "docs" / "reference" / "config.md").read_text()
    assert committed == markdown(), (
        "regenerate: python -m rayflow.reference > docs/reference/config.md"
    )
