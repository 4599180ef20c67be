"""The command line as a user meets it: --help, dry runs and bad input. Nothing here starts Ray."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from rayflow.testing.processes import ray_daemon_pids


def test_help_is_fast_and_loads_no_heavy_module():
    code = (
        "import sys, runpy; sys.argv = ['rayflow', '--help']\n"
        "try:\n    runpy.run_module('rayflow', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('ray', 'torch', 'mlflow', 'pyspark', 'kubernetes') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (
        "Configuration groups" in out.stdout
        and "backend: attach, kuberay, local, spark, vm" in out.stdout
    )
    assert "HEAVY []" in out.stdout
    # every subcommand is named, each on a line of its own, with how to ask for its options
    from rayflow.commands import COMMANDS

    listed = {line.split()[0] for line in out.stdout.splitlines() if line.startswith("  ")}
    assert set(COMMANDS) <= listed and "python -m rayflow COMMAND --help" in out.stdout


@pytest.mark.no_store
def test_dry_run_prints_the_spec_and_starts_nothing(rayflow):
    before = ray_daemon_pids()
    out = rayflow.run("dry_run=true", "backend.num_cpus=1")
    assert out.returncode == 0, out.stderr
    spec = yaml.safe_load(out.stdout)
    assert spec["backend"] == "local" and spec["ray.init"]["num_cpus"] == 1
    assert ray_daemon_pids() == before
    assert not rayflow.storage.exists() and not rayflow.db.exists()


def test_dry_run_shows_the_imports_ray_preloads_for_ppo(rayflow):
    """workload=ppo: Ray's idle workers import torch and RLlib as the local cluster starts, and
    as many as one trial has processes (the algorithm, its env runners) are kept for it."""

    def init(*overrides):
        out = rayflow.run("dry_run=true", *overrides)
        assert out.returncode == 0, out.stderr
        return yaml.safe_load(out.stdout)["ray.init"]

    system = init("workload=ppo", "workload.num_env_runners=3", "backend.num_cpus=4")[
        "_system_config"
    ]
    assert {"torch", "ray.rllib.algorithms.ppo"} <= set(system["preload_python_modules"])
    assert system["num_workers_soft_limit"] == 4
    assert "_system_config" not in init("workload=ppo", "backend.preload_worker_imports=false")
    assert "_system_config" not in init("workload=cifar")  # it preloads nothing


def test_missing_data_offline_fails_clearly_before_ray_starts(rayflow, tmp_path):
    before = ray_daemon_pids()
    out = rayflow.run(
        f"data.root={tmp_path / 'empty'}", "data.synthetic=false", "data.download=false", base=False
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("rayflow: error: data.root")
    assert ray_daemon_pids() == before
