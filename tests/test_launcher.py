"""hydra/launcher=rayflow on backend=local: Hydra's own launcher test suites (shipped in hydra-core)
unchanged, plugin discovery, a user's app swept with mixed per-job resources and a failing job,
and bad launcher config refused before anything starts.

LauncherTestSuite and a user's app on spark and vm: tests/test_spark.py and tests/test_vm.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite

from hydra_plugins.rayflow_launcher.rayflow_launcher import RayflowLauncher
from rayflow.testing.processes import ray_daemon_pids, wait_until
from tests.harness.hydra_app import HydraApp, KeptCluster

# Ray's dashboard is not what these tests are about: their local clusters start without it (about
# 4 s of CPU less a start, docs/testing.md's no_dashboard), as Hydra's integration suite already did.
NO_DASHBOARD = "hydra.launcher.include_dashboard=false"


def test_discovery() -> None:
    # Hydra finds the plugin in its namespace package, as it finds its own
    assert RayflowLauncher.__name__ in [x.__name__ for x in Plugins.instance().discover(Launcher)]


def test_the_launcher_yaml_and_its_schema_agree() -> None:
    from rayflow.launcher.keys import JobResources, Launcher
    from rayflow.launcher.node import own_keys
    from rayflow.schema import validate_section

    node = own_keys()
    assert node.pop("_target_") == "hydra_plugins.rayflow_launcher.rayflow_launcher.RayflowLauncher"
    assert set(node) == set(Launcher.model_fields) and set(node["resources"]) == set(
        JobResources.model_fields
    )
    # the defaults are valid
    validate_section("hydra.launcher", Launcher, {**node, "ray_auth_mode": "token"}, {})


def test_discovering_plugins_loads_no_ray() -> None:
    # Hydra imports every plugin of every installed package at start-up: ours stays light
    code = (
        "from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher; import sys\n"
        "assert 'RayflowLauncher' in [c.__name__ for c in Plugins.instance().discover(Launcher)]\n"
        "print(sorted(m for m in ('ray', 'torch', 'mlflow', 'pyspark', 'pydantic', 'rayflow.orchestrator.session') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


class TestRayflowLauncher(KeptCluster, LauncherTestSuite):
    """Hydra's LauncherTestSuite, unchanged, in this process, on one local Ray kept for the class."""

    @pytest.fixture
    def overrides(self) -> list[str]:
        return ["hydra.launcher.backend=local", NO_DASHBOARD]


# one CPU and no dashboard: each of the suite's eleven apps starts a Ray of its own for one job
@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [
        (
            {},
            [
                "-m",
                "hydra/launcher=rayflow",
                "hydra.launcher.backend=local",
                "hydra.launcher.num_cpus=1",
                NO_DASHBOARD,
            ],
        )
    ],
)
class TestRayflowLauncherIntegration(IntegrationTestSuite):
    """Hydra's IntegrationTestSuite, unchanged: apps in their own processes, each job printing from
    inside the launched job (its name, its working directory, hydra.utils' paths)."""


def test_mixed_resources_run_side_by_side_and_a_failing_job_is_its_own(tmp_path) -> None:
    before = ray_daemon_pids()
    app = HydraApp(tmp_path / "app")
    (app.folder / "conf" / "job" / "broken.yaml").write_text(
        "# @package _global_\nname: broken\nfail: true\n"
    )
    # 2 CPUs here: small jobs (1 CPU) run two at once, large ones (2 CPUs, from the job's own config)
    # alone. Each holds 5 s: two jobs started together may begin seconds apart on a loaded machine
    # (each waits for a Ray worker process), and at 2 s a CI run once saw them miss each other.
    out = app.sweep(
        "hydra.launcher.num_cpus=2", NO_DASHBOARD, "job=small,large,broken", "seed=1,2", "hold_s=5"
    )
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    failed = [line for line in out.stderr.splitlines() if line.startswith("[rayflow] job #")]
    assert sorted(failed) == [
        f"[rayflow] job #{n} (job=broken seed={s} hold_s=5) failed: ValueError: job broken was asked to fail"
        for n, s in ((4, 1), (5, 2))
    ], out.stderr[-3000:]
    # then Hydra raises the first failure
    assert "ValueError: job broken was asked to fail" in out.stderr
    # Ray's own INFO lines (its start) are not the app's output
    assert "Started a local Ray instance" not in out.stdout + out.stderr, out.stderr[-3000:]
    dirs = app.job_dirs()
    assert [d.name for d in dirs] == [str(n) for n in range(6)]
    for job_dir in dirs:
        app.assert_hydra_outputs(job_dir)
    metrics = app.metrics()
    assert sorted(metrics) == [0, 1, 2, 3]  # the failing jobs ran, wrote Hydra's files, and failed
    assert {n: m["name"] for n, m in metrics.items()} == {
        0: "small",
        1: "small",
        2: "large",
        3: "large",
    }
    # the app's own resolver, resolved in the job
    assert all(m["decay"] == 0.05 for m in metrics.values())

    def overlap(a: dict, b: dict) -> bool:
        return a["started"] < b["ended"] and b["started"] < a["ended"]

    assert overlap(metrics[0], metrics[1]), "the two 1-CPU jobs should have run at once"
    for large in (2, 3):
        others = [m for n, m in metrics.items() if n != large]
        assert not any(overlap(metrics[large], m) for m in others), (
            "a 2-CPU job shares a 2-CPU machine with no job"
        )
    assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=20), "Ray was left running"


BAD_CONFIG = [
    (
        "hydra.launcher.backend=nope",
        "hydra.launcher.backend",
        "must be one of local, attach, spark, vm, kuberay",
    ),
    # the app's own config says cpu: 1 for every job (launcher_resources); memory is the launcher's
    (
        "launcher_resources.cpu=64",
        "launcher_resources.cpu",
        "asks for 64 CPU but the biggest node of backend=local offers",
    ),
    (
        "hydra.launcher.resources.memory=10000000000000",
        "hydra.launcher.resources.memory",
        "asks for 9313.2 GiB memory but the biggest node of backend=local offers",
    ),
    (
        "hydra.launcher.max_concurrent=-1",
        "hydra.launcher.max_concurrent",
        "must be an integer >= 1, got -1",
    ),
    (
        "hydra.launcher.app_name=mine",
        "hydra.launcher.app_name",
        "not a key of backend=local (it is one of spark)",
    ),
    ("+launcher_resources.cpus=2", "launcher_resources.cpus", "not a resource key"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict:
    """Each bad launcher config's sweep, three at a time (none starts anything): {row: (app, output, Ray before)}."""
    from concurrent.futures import ThreadPoolExecutor

    before = ray_daemon_pids()

    # made here, one after the other: pytest's mktemp numbers its folders without a lock, and
    # three threads asking at once were seen to collide
    folders = [tmp_path_factory.mktemp(f"bad-launcher-{i}") for i in range(len(BAD_CONFIG))]

    def refuse(index: int):
        app = HydraApp(folders[index] / "app")
        return index, (app, app.sweep(BAD_CONFIG[index][0], "seed=1,2", timeout=60))

    with ThreadPoolExecutor(3) as pool:
        done = dict(pool.map(refuse, range(len(BAD_CONFIG))))
    return {i: (*done[i], before) for i in done}


@pytest.mark.parametrize("row", range(len(BAD_CONFIG)), ids=[row[0] for row in BAD_CONFIG])
def test_bad_launcher_config_is_one_line_before_anything_starts(refusals, row) -> None:
    _, key, words = BAD_CONFIG[row]
    app, out, before = refusals[row]
    assert out.returncode != 0
    first = out.stderr.strip().splitlines()[0]
    assert first.startswith(f"rayflow: error: {key}: ") and words in first, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert not [p for p in app.sweep_dir.glob("*") if p.is_dir()], "no job may have run"
    assert not (ray_daemon_pids() - before)


def test_one_at_a_time_and_a_failure_stops_the_jobs_not_started(tmp_path) -> None:
    app = HydraApp(tmp_path / "app")
    (app.folder / "conf" / "job" / "broken.yaml").write_text(
        "# @package _global_\nname: broken\nfail: true\n"
    )
    out = app.sweep(
        NO_DASHBOARD,
        "hydra.launcher.max_concurrent=1",
        "hydra.launcher.on_failure=stop",
        "job=small,broken,large",
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert (
        "[rayflow] job #1 (job=broken) failed: ValueError: job broken was asked to fail"
        in out.stderr
    )
    assert [d.name for d in app.job_dirs()] == ["0", "1"]  # job #2 was never started
    assert sorted(app.metrics()) == [0]
