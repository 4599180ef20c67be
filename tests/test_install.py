"""The install as scripts/setup.sh makes it: Hydra lists the launcher; the first README command
sets up what running needs, `--test` adds what only the tests need; pip's per-package noise is
filtered and a failing pip still fails setup."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO

NOISE = "WARNING: Location 'file:///opt/pypi/simple/torch/' is ignored: it is neither a file nor a directory."


def _installed() -> bool:
    try:
        importlib.metadata.distribution("rayflow")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(
    not _installed(),
    reason="rayflow is not installed in this environment (scripts/setup.sh installs it)",
)
def test_hydra_lists_the_launcher_from_outside_the_checkout(tmp_path):
    # hydra/launcher=rayflow: Hydra lists the hydra_plugins folders on the path, which setup provides
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher; "
        "print([c.__name__ for c in Plugins.instance().discover(Launcher)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "RayflowLauncher" in out.stdout, out.stderr[-2000:]


def test_rayflow_runs_from_the_folder_that_holds_its_clone(tmp_path):
    """`cd ~ && python -m rayflow` with the clone in ~/rayflow: the clone's folder is no namespace
    package shadowing the real one (ImportError: cannot import name 'ClusterBackend' before)."""
    # a clone named as users name it
    (tmp_path / "rayflow").symlink_to(REPO, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for args in (["--help"], ["dry_run=true", "data.synthetic=true"]):
        out = subprocess.run(
            [sys.executable, "-m", "rayflow", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stdout.startswith("backend: local"), out.stdout[:500]  # the dry run's document


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Two commands\n.*?```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_ci_runs_the_readmes_test_command_and_users_get_no_test_setup():
    first, second = _readme_commands()
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert second == "bash scripts/setup.sh --test && .venv/bin/python -m pytest" and second in ci
    assert first.startswith("bash scripts/setup.sh && ")


def _fake_checkout(tmp_path: Path) -> tuple[Path, dict]:
    """scripts/setup.sh in a folder whose .venv/bin/python and apt-get only log what they are asked."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    bin_dir, stubs = root / ".venv" / "bin", tmp_path / "stubs"
    bin_dir.mkdir(parents=True)
    stubs.mkdir()
    (tmp_path / "site").mkdir()  # the venv's site-packages, as the stub names it
    log = tmp_path / "calls.log"
    (bin_dir / "python").write_text(f"""#!/usr/bin/env bash
echo "python $*" >> {log}
case "$*" in
  *"-m pip install"*) echo "{NOISE}" >&2; echo "{NOISE}"; echo "ERROR: a real pip error" >&2; exit "${{FAKE_PIP_RC:-0}}" ;;
  *sysconfig*) echo {tmp_path / "site"} ;;
  *"import torch, ray"*) echo "rayflow setup: torch 2.13.0 | cuda False | ray 2.60.0" ;;
esac
""")
    (stubs / "apt-get").write_text(f'#!/usr/bin/env bash\necho "apt-get $*" >> {log}\n')
    for stub in (bin_dir / "python", stubs / "apt-get"):
        stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}")
    return root, env


def _setup(tmp_path: Path, *args: str, pip_rc: int = 0):
    root, env = _fake_checkout(tmp_path)
    out = subprocess.run(
        ["bash", str(root / "scripts" / "setup.sh"), *args],
        env=dict(env, FAKE_PIP_RC=str(pip_rc)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    log = tmp_path / "calls.log"
    return out, log.read_text() if log.exists() else ""


def test_user_setup_installs_what_running_needs_and_no_test_packages(tmp_path):
    out, calls = _setup(tmp_path)
    assert out.returncode == 0, out.stderr
    install = [line for line in calls.splitlines() if "pip install" in line and " -e " in line]
    assert install == [
        "python -m pip install --quiet --disable-pip-version-check -e .[spark,rllib,kuberay]"
    ], calls
    assert not re.search(r"openssh-server|rsync|tini", calls + out.stderr)
    # pip's per-package location warnings are gone, its real errors kept, the summary line last
    assert "is ignored" not in out.stdout + out.stderr and "ERROR: a real pip error" in out.stderr
    summary, *how = out.stdout.splitlines()
    assert summary == "rayflow setup: torch 2.13.0 | cuda False | ray 2.60.0"
    # the last lines say how to run what was installed: rayflow is on PATH only in the venv
    assert "source .venv/bin/activate" in how[-1] and ".venv/bin/rayflow" in " ".join(how)


def test_test_setup_adds_the_test_extra(tmp_path):
    out, calls = _setup(tmp_path, "--test")
    assert out.returncode == 0, out.stderr
    assert "-e .[test]" in calls


def test_a_failing_pip_fails_setup_and_a_wrong_flag_is_refused(tmp_path):
    out, calls = _setup(tmp_path, pip_rc=1)
    assert (
        out.returncode == 1
        and "rayflow setup:" not in out.stdout
        and "ERROR: a real pip error" in out.stderr
    )
    out, calls = _setup(tmp_path / "again", "--tests")
    assert (
        out.returncode == 2
        and out.stderr.strip() == "usage: bash scripts/setup.sh [--test]"
        and not calls
    )
