"""`pip install .` (not editable) gives a working rayflow in any directory: conf/ and backends/ ship inside,
and Hydra finds the launcher plugin (hydra_plugins/rayflow_launcher)."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig

import pytest

from tests.harness import REPO


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs_from_elsewhere(tmp_path, data_root):
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = tmp_path / "source"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            "venv",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            "outputs",
            "multirun",
            "mlruns",
            "mlflow.db",
        ),
    )
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        check=True,
        timeout=600,
    )
    wheel = next(dist.glob("rayflow-*.whl"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The fresh venv borrows this one's dependencies (ray, torch, ...) so the test needs no
    # download; rayflow itself comes only from the wheel (an editable install's finder is
    # not loaded through a borrowed path).
    target = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    borrowed = [
        p for p in [sysconfig.get_paths()["purelib"], *site.getsitepackages()] if os.path.isdir(p)
    ]
    with open(os.path.join(target, "_borrowed_deps.pth"), "w") as f:
        f.write("\n".join(dict.fromkeys(borrowed)) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        check=True,
        timeout=300,
        # a PYTHONPATH holding the checkout (its rayflow.egg-info, left by the build) made pip
        # take rayflow as installed already and install nothing
        env=env,
    )

    work = tmp_path / "elsewhere"
    work.mkdir()

    def in_venv(code: str) -> list[str]:  # what `python -c code` prints there, run from elsewhere
        done = subprocess.run(
            [str(python), "-c", code], cwd=work, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]  # why the installed package failed
        return done.stdout.splitlines()

    where = in_venv(
        "import rayflow, importlib.resources as r; print(rayflow.__file__); "
        "print(sorted(p.name for p in r.files('rayflow.conf').iterdir())); "
        "print(r.files('rayflow.cluster_defs').joinpath('README.md').is_file())"
    )
    assert where[0].startswith(str(venv)), where
    assert "config.yaml" in where[1] and "backend" in where[1] and where[2] == "True"
    # hydra/launcher=rayflow: Hydra finds the plugin the wheel put in the hydra_plugins namespace package
    plugin = in_venv(
        "from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher; "
        "import hydra_plugins.rayflow_launcher.rayflow_launcher as m; print(m.__file__); "
        "print([c.__name__ for c in Plugins.instance().discover(Launcher)])"
    )
    assert plugin[0].startswith(str(venv)) and "RayflowLauncher" in plugin[1], plugin

    out = subprocess.run(
        [
            str(venv / "bin" / "rayflow"),
            "data.synthetic=true",
            f"data.root={data_root}",
            "data.synthetic_train_size=1000",
            "data.synthetic_test_size=100",
            "workload.num_samples=1",
            "workload.max_epochs=1",
            f"storage_path={tmp_path / 'ray_results'}",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "== rayflow results ==" in out.stdout
    assert (work / "mlflow.db").is_file()
