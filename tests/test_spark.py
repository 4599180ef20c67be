"""backend=spark on real Spark (local-cluster master: standalone worker JVMs) and real Ray on Spark.

Slow: each cluster takes ~10 s for Spark and ~30 s for Ray on 2 cores.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from hydra.test_utils.launcher_common_tests import LauncherTestSuite

from rayflow.backends import backend_for
from rayflow.errors import ConfigError
from rayflow.orchestrator.cluster import running
from rayflow.orchestrator.compose import compose_config
from rayflow.runtime.processes import pids_mentioning
from rayflow.testing.backends import DriverConnectionSuite, LifecycleSuite
from rayflow.testing.processes import ray_daemon_pids, wait_until
from tests.harness.cli import Rayflow
from tests.harness.examples import USER_TUNE, copy_example
from tests.harness.hydra_app import KeptCluster, search_comes_home, sweep_comes_home
from tests.harness.notebook_kernel import Kernel, rayflow_command, status
from tests.harness.secrets import SPARK_SECRETS, assert_nowhere, planted

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow

# A fixed-size cluster (one Ray worker node) is enough for the contract.
FIXED = ["backend=spark", "backend.min_worker_nodes=1", "backend.max_worker_nodes=1"]
# Spark's local mode (one JVM, as a Databricks single-node cluster): the contract's starts and
# stops at about half the CPU of a local-cluster's three JVMs. The tests below that need Spark
# worker JVMs (scale-out, an active session's executors, the shared jobs) keep local-cluster.
LOCAL_MODE = [
    *FIXED,
    "backend.master='local[1]'",
    "backend.num_cpus_worker_node=null",
    "backend.num_gpus_worker_node=null",
]


# --- a cluster kept in a notebook kernel ----------------------------------------------------------


@pytest.fixture(scope="module")
def kept_kernel(tmp_path_factory):
    """A notebook kernel (tests/harness/notebook_kernel.py: a process of its own, its HOME and
    kept-cluster registry the test's) whose first run kept its Ray-on-Spark cluster with a
    one-minute autostop. The first test looks at it and runs the kernel's second run on it; the
    module's other tests run while it idles; the last finds it shut down by the kernel's idle
    timer, the kernel alive, and stops a new one with `rayflow down` from another process."""
    tmp = tmp_path_factory.mktemp("kept-spark")
    work = tmp / "notebook"  # the user's folder, outside the package
    work.mkdir()
    env = dict(
        os.environ,
        HOME=str(tmp / "home"),
        XDG_CACHE_HOME=str(tmp / "cache"),
        PYTHONUNBUFFERED="1",
    )
    env.pop("RAY_AUTH_MODE", None)  # rayflow makes driver and cluster agree by itself
    env.pop("MLFLOW_TRACKING_URI", None)
    kernel = Kernel(work, env)
    kernel.env, kernel.cache = env, tmp / "cache"
    try:
        assert "done" in kernel.says("KERNEL first", timeout=300), kernel.output()[-4000:]
        kernel.says("KERNEL ready", timeout=30)
        yield kernel
    finally:
        kernel.close()


def test_a_cluster_kept_in_a_kernel_is_seen_and_joined_by_the_kernels_next_run(kept_kernel):
    kernel, env = kept_kernel, kept_kernel.env
    name = f"spark-{kernel.proc.pid}"
    [record] = (kernel.cache / "rayflow" / "clusters").glob("spark.*.json")
    where = json.loads(record.read_text())["where"]
    assert where["pid"] == str(kernel.proc.pid) and Path(where["temp_dir"]).is_dir()
    assert pids_mentioning(where["temp_dir"]), "the kept cluster's Ray nodes run"
    # `rayflow status` (another process, the same HOME) sees it idle, with its autostop
    rows = wait_until(lambda: [r for r in status(env) if r["state"] == "idle"], timeout=60)
    assert [(r["backend"], r["name"], r["autostop_idle_minutes"]) for r in rows] == [
        ("spark", name, 1)
    ], status(env)
    assert rows[0]["nodes"] == 2 and rows[0]["autostop_in_s"] <= 60
    # and so does rayflow.clusters() in the kernel itself
    kernel.send("status")
    [row] = json.loads(kernel.says("KERNEL status", timeout=60).split(" ", 2)[2])
    assert (row["name"], row["state"]) == (name, "idle")
    # `rayflow logs`: a Ray-on-Spark run is a driver in the kernel, no Ray Job: one line
    logs = rayflow_command(env, "logs", name)
    assert logs.returncode == 2 and "runs no Ray Jobs" in logs.stderr, logs.stderr
    assert len(logs.stderr.strip().splitlines()) == 1
    kernel.send(f"logs {name}")
    assert "ConfigError rayflow logs: " in kernel.says("KERNEL logs", timeout=60)
    # the kernel's next run joins it: no second setup_ray_cluster
    kernel.send("run second")
    assert "done" in kernel.says("KERNEL second", timeout=240), kernel.output()[-4000:]
    out = kernel.output()
    assert f"joining the Ray-on-Spark cluster {name} this process keeps" in out
    assert out.count("starting Ray on Spark") == 1, out[-4000:]
    kernel.temp_dir = where["temp_dir"]


class TestSpark(LifecycleSuite, DriverConnectionSuite):
    name = "spark"
    owns_cluster = True
    # every step that does the work, then every fallback behind it
    teardown_faults = [
        ("ray.shutdown()", "shutdown_ray_cluster()", "stop the SparkSession", "restore $"),
        ("terminate what is left", "shut down Spark's py4j", "remove the Spark worker"),
    ]

    # Ray on Spark picks its head's ports at random in 9000-10000 and binds them seconds later:
    # two clusters started at once were seen to pick the same one (a head's client server failed).
    # Its log says when the first head is up, its ports bound.
    second_start_after = "Ray head node started"
    # Ray on Spark's shutdown, then the SparkSession's and its JVM's, for two clusters at once:
    # on CI's two loaded cores one took longer than the default 60 s once.
    stop_timeout_s = 120

    def overrides(self):
        return LOCAL_MODE


def alive_nodes() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node["Alive"])


def test_autoscales_up_to_max_and_back_down_after_idle_with_credentials_on_workers(
    monkeypatch, tmp_path
):
    import ray

    # MLflow credentials in the driver's environment reach the Spark-launched worker nodes,
    # never the printed spec (checked on the same cluster to save a start).
    secret = "mlflow-token-for-workers-only"
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", secret)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////tmp/somewhere/mlflow.db")
    cfg = compose_config(
        "backend=spark",
        "backend.min_worker_nodes=1",
        "backend.max_worker_nodes=2",
        "backend.autoscale_idle_timeout_minutes=0.1",
    )
    backend = backend_for(cfg)
    assert secret not in backend.render().text
    with running(backend):
        assert wait_until(lambda: alive_nodes() == 2, timeout=60)  # head + min_worker_nodes

        @ray.remote(num_cpus=1)  # the head has no CPUs: this runs on a Spark-launched worker
        def seen():
            return (
                os.environ.get("MLFLOW_TRACKING_TOKEN"),
                os.environ.get("MLFLOW_TRACKING_URI"),
                os.environ.get("RAY_AUTH_MODE"),
            )

        assert ray.get(seen.remote()) == (secret, "sqlite:////tmp/somewhere/mlflow.db", "token")

        @ray.remote(num_cpus=1)
        def hold(until: str, seconds: float):
            # its CPU held until the test has seen the second worker (the Spark workers share
            # this machine's files), at most `seconds`: not a fixed time longer than a scale-up
            deadline = time.monotonic() + seconds
            while not os.path.exists(until) and time.monotonic() < deadline:
                time.sleep(0.2)

        asked, scaled = time.monotonic(), tmp_path / "scaled-up"
        # two 1-CPU workers wanted at once, until the second is there
        tasks = [hold.remote(str(scaled), 150) for _ in range(2)]
        assert wait_until(lambda: alive_nodes() == 3, timeout=90), "no second worker came up"
        print(f"\nscale-up: second worker alive {time.monotonic() - asked:.1f} s after demand")
        scaled.touch()
        ray.get(tasks)
        idle = time.monotonic()
        assert wait_until(lambda: alive_nodes() == 2, timeout=90), "idle worker was not removed"
        print(
            f"scale-down: back to head + 1 worker {time.monotonic() - idle:.1f} s after the last task"
        )


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["backend.num_worker_nodes=2"], "backend.num_worker_nodes"),
        (["+backend.autoscale=true"], "backend.autoscale"),
        (["backend.master=yarn"], "backend.master"),
        (["backend.master=k8s://https://10.0.0.1:443"], "backend.master"),
        (["backend.min_worker_nodes=3"], "backend.min_worker_nodes"),
        (["backend.num_gpus_worker_node=null"], "backend.num_gpus_worker_node"),
        (["backend.hybrid=true", "backend.num_cpus_head_node=1"], "backend.num_cpus_head_node"),
        (["backend.hybrid=true"], "backend.max_worker_nodes"),
        (["backend.autoscale_upscaling_speed=0.5"], "backend.autoscale_upscaling_speed"),
        # Ray on Spark's dashboard listens on all interfaces, its GCS and client ports on the driver's address
        (["ray_auth_mode=disabled"], "ray_auth_mode"),
        (
            ["ray_auth_mode=disabled", "+backend.head_node_options.include_dashboard=false"],
            "ray_auth_mode",
        ),
    ],
)
def test_bad_spark_input_names_the_key_and_starts_nothing(overrides, key):
    from rayflow.orchestrator.preflight import preflight

    before = ray_daemon_pids()
    with pytest.raises(ConfigError) as raised:
        preflight(["backend=spark", *overrides], multirun=False)
    assert raised.value.key == key and "\n" not in str(raised.value)
    assert ray_daemon_pids() == before


def test_dry_run_prints_setup_arguments_and_sizing_plan(rayflow):
    """stdout is setup_ray_cluster's arguments, the call start() makes; the plan goes to stderr."""
    import inspect

    from ray.util.spark import setup_ray_cluster

    before = ray_daemon_pids()
    out = rayflow.run("backend=spark", "dry_run=true", "backend.max_worker_nodes=3")
    assert out.returncode == 0, out.stderr
    args = yaml.safe_load(out.stdout)
    assert set(args) <= set(inspect.signature(setup_ray_cluster).parameters)
    assert args["max_worker_nodes"] == 3 and args["num_cpus_worker_node"] == 1
    assert (
        args
        == backend_for(compose_config("backend=spark", "backend.max_worker_nodes=3")).setup_args()
    )
    assert "rayflow: sizing plan: 2 Spark worker(s)" in out.stderr and "possible 2" in out.stderr
    assert "exceeds the 2 Ray worker nodes" in out.stderr  # max 3 > the 2 nodes Spark can hold
    assert "master=local-cluster[2, 1, 2048]" in out.stderr
    assert ray_daemon_pids() == before


def test_an_active_session_is_used_and_left_running_and_its_fake_gpus_reach_ray(
    monkeypatch, tmp_path
):
    """Inside a notebook or spark-submit rayflow uses the session it finds and never stops it.
    The session's workers have two GPUs (a discovery script; nvidia-smi finds none): they reach
    ray.cluster_resources (one cluster start for both points)."""
    import sys
    from pathlib import Path

    from pyspark.sql import SparkSession

    from rayflow.backends.spark.processes import stop_session_and_jvm

    # As in an activated environment: executors find this python and the `ray` command.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    script = tmp_path / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    spark = (
        SparkSession.builder.master("local-cluster[1, 2, 1024]")
        .appName("users-own")
        .config("spark.executor.memory", "512m")
        .config("spark.worker.resource.gpu.amount", "2")
        .config("spark.worker.resource.gpu.discoveryScript", str(script))
        .config("spark.executor.resource.gpu.amount", "2")
        .config("spark.executor.cores", "2")
        .config("spark.task.resource.gpu.amount", "0")
        .config("spark.executorEnv.RAY_ON_SPARK_WORKER_GPU_NUM", "2")  # nvidia-smi finds none
        .getOrCreate()
    )
    try:
        backend = backend_for(
            compose_config(
                *FIXED, "backend.num_cpus_worker_node=2", "backend.num_gpus_worker_node=2"
            )
        )
        assert backend.render().notes[0] == "spark: the active SparkSession (used and left running)"
        # the GPUs the cluster offers
        assert sum(node["GPU"] for node in backend.capacity({"GPU"})) == 2
        with running(backend):
            import ray

            assert ray.cluster_resources().get("CPU") == 2
            assert wait_until(lambda: ray.cluster_resources().get("GPU", 0) == 2, timeout=60), (
                ray.cluster_resources()
            )
        assert SparkSession.getActiveSession() is spark
        assert spark.range(3).count() == 3  # still usable after Ray on Spark shut down
    finally:
        stop_session_and_jvm(spark)


@pytest.fixture(scope="module")
def spark_jobs(tmp_path_factory, data_root):
    """One process runs a scale-out cifar tuning, a two-job cifar sweep, a ddp and a ppo job, all
    with the same backend config: session.run_jobs starts the Ray-on-Spark cluster once for the
    five and stops it at the end. Each test below checks its own job in the shared output and
    MLflow store. Token file present and RAY_AUTH_MODE unset (the harness drops it): rayflow must
    make driver and nodes agree."""
    before = ray_daemon_pids()
    runner = Rayflow(tmp_path_factory.mktemp("spark-jobs"), data_root)
    copy_example("tune-pbt", runner.workdir)  # the user's own project
    logs = runner.workdir / "ray-logs"
    secret_overrides, secrets = planted(SPARK_SECRETS)  # secrets in Spark's camelCase settings
    # Ray on Spark's default idle timeout (a minute) keeps the scaled-out workers for the next job:
    # each job would otherwise scale out again.
    backend = ["backend=spark", *secret_overrides, f"backend.collect_log_to_path={logs}"]
    out = runner.run_jobs(
        # Two 1-CPU trials at once, each longer than a scale-up (5-15 s): the second needs a new worker.
        [
            *backend,
            "tracking.experiment=cifar-scaleout",
            "workload.num_samples=2",
            "workload.max_epochs=30",
            "workload.scheduler.grace_period=30",
            "data.synthetic_train_size=4000",
            "workload.search_space.batch_size=[32]",
            "workload.reuse_actors=false",
        ],
        [
            "-m",
            *backend,
            "workload.num_samples=1",
            "workload.max_epochs=1",
            "workload.scheduler.reduction_factor=2,4",
        ],
        # Two 1-CPU Ray Train workers on 1-CPU Ray-on-Spark nodes: gloo all-reduces between two
        # Spark executors (the head has no CPU).
        [
            *backend,
            "workload=ddp",
            "workload.num_workers=2",
            "workload.epochs=2",
            "workload.batch_size=32",
        ],
        # The PPO trial asks for two 1-CPU bundles (the algorithm with its learner, one env runner).
        [*backend, "workload=ppo", "workload.stop.iterations=2", "workload.train_batch_size=1000"],
        # The user's own Tune function (examples/tune-pbt), imported from the driver's folder.
        [*backend, *USER_TUNE],
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    yield runner, out, logs, secrets
    assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=30), (
        "the shared Ray-on-Spark cluster was left running"
    )


def test_tuning_on_spark_scales_out_and_lands_in_mlflow(spark_jobs):
    runner, out, logs, secrets = spark_jobs
    client, parents, children = runner.mlflow("cifar-scaleout")
    [parent] = parents
    assert parent.info.status == "FINISHED" and parent.data.tags["backend"] == "spark"
    assert parent.data.metrics["cluster_nodes_peak"] >= 3  # head + 2 autoscaled workers
    assert parent.data.tags["collect_log_to_path"] == str(logs)
    spec = yaml.safe_load(
        open(
            client.download_artifacts(parent.info.run_id, "cluster/spec.yaml", str(runner.workdir))
        )
    )
    # setup_ray_cluster's arguments
    assert spec["min_worker_nodes"] == 1 and spec["max_worker_nodes"] == 2
    assert parent.data.tags["spark_session"] == "built by rayflow" and parent.data.tags[
        "spark_master"
    ].startswith("local-cluster[")
    assert len(children[parent.info.run_id]) == 2
    # Ray's session logs are copied when the shared cluster stops, after the last job
    assert wait_until(lambda: logs.exists() and any(logs.rglob("*")), timeout=30), (
        "Ray logs were not collected"
    )
    # ...appear nowhere: terminal, MLflow store and artifacts (all five jobs'), Ray's collected session logs
    assert parent.data.params["backend.spark_conf.spark.ssl.keyPassword"] == "***"
    assert assert_nowhere(secrets, [out.stdout, out.stderr], [runner.workdir]) > 10


def test_consecutive_jobs_share_one_ray_on_spark_cluster(spark_jobs):
    runner, out, *_ = spark_jobs
    assert out.stdout.count("[rayflow] starting the spark cluster") == 1
    assert out.stdout.count("[rayflow] reusing the spark cluster") == 5
    client, parents, _ = runner.mlflow("cifar")
    assert len(parents) == 2 and all(p.data.tags["backend"] == "spark" for p in parents)
    # start-up figures belong to the job that started the cluster (the first), not to those reusing it
    assert "spark_ready_s" in runner.mlflow("cifar-scaleout")[1][0].data.metrics
    assert not any(
        "spark_ready_s" in p.data.metrics
        for name in ("cifar", "ddp", "ppo")
        for p in runner.mlflow(name)[1]
    )


def test_ddp_on_spark_spreads_train_workers_over_ray_worker_nodes(spark_jobs):
    runner, out, *_ = spark_jobs
    assert "Started training worker group of size 2" in runner.run_logs("ddp-*")
    client, parents, children = runner.mlflow("ddp")
    parent = parents[0]
    assert parent.data.tags["backend"] == "spark" and parent.data.metrics["cluster_nodes_peak"] >= 3
    [train] = children[parent.info.run_id]
    assert sorted(m.step for m in client.get_metric_history(train.info.run_id, "val_accuracy")) == [
        1,
        2,
    ]
    assert parent.data.metrics["epochs_completed"] == 2


def test_the_users_tune_function_runs_on_spark(spark_jobs):
    runner, out, *_ = spark_jobs
    client, parents, children = runner.mlflow("tune")
    [parent] = parents
    assert parent.info.status == "FINISHED" and parent.data.tags["backend"] == "spark"
    assert (
        parent.data.params["workload.trainable"] == "train:objective"
        and "best_loss" in parent.data.metrics
    )
    trials = children[parent.info.run_id]
    assert len(trials) == 2 and all("accuracy" in t.data.metrics for t in trials)
    assert {"learning_curves.png", "search.png"} <= set(runner.plots(client, parent))


def test_ppo_on_spark_places_the_algorithm_and_its_env_runner_on_ray_worker_nodes(spark_jobs):
    runner, out, *_ = spark_jobs
    client, parents, children = runner.mlflow("ppo")
    parent = parents[0]
    assert parent.data.tags["backend"] == "spark" and parent.data.metrics["cluster_nodes_peak"] >= 3
    [trial] = children[parent.info.run_id]
    assert trial.data.metrics["num_env_steps_sampled_lifetime"] == 2000


# hydra/launcher=rayflow on Ray on Spark (tests/test_launcher.py has it on local)
LAUNCHER = [
    "hydra.launcher.backend=spark",
    "hydra.launcher.min_worker_nodes=1",
    "hydra.launcher.max_worker_nodes=1",
]


class TestHydraLauncherOnSpark(KeptCluster, LauncherTestSuite):
    """Hydra's own LauncherTestSuite, unchanged, on one Ray-on-Spark cluster kept for the class."""

    @pytest.fixture
    def overrides(self) -> list[str]:
        return list(LAUNCHER)


def test_a_hydra_app_outside_the_repository_sweeps_on_spark(tmp_path):
    sweep_comes_home(tmp_path / "app", LAUNCHER)


def test_a_hydra_apps_search_runs_on_spark_and_its_jobs_come_home(tmp_path):
    """hydra/sweeper=rayflow on Ray on Spark (tests/test_sweeper.py has it on local)."""
    search_comes_home(
        tmp_path / "app",
        [f"hydra.sweeper.{key.split('.', 2)[2]}" for key in LAUNCHER],
    )


def test_the_spark_cluster_benchmark_runs_in_its_smoke_form(rayflow):
    """`scripts/bench.py spark-cluster --smoke` (tests/test_bench.py runs the other benchmarks):
    here, in this module's turn, beside no other Spark or fake_multinode cluster."""
    from tests.test_bench import positive, run_bench

    result = run_bench(
        rayflow,
        "spark-cluster",
        keys=(
            "ratio",
            "ready_s",
            "plain_ready_s",
            "scale_up_s",
            "plain_scale_up_s",
            "scale_down_s",
            "plain_scale_down_s",
        ),
        timeout=600,
    )
    assert positive(result["ratio"], result["ready_s"], result["plain_ready_s"])
    # a smoke run waits for no scaling: those figures are left unmeasured, and say so
    scaling = ("scale_up_s", "plain_scale_up_s", "scale_down_s", "plain_scale_down_s")
    assert all(result[k] is None for k in scaling), result


def test_the_kept_cluster_stopped_itself_in_the_living_kernel(
    kept_kernel,
):
    """Last in the module: with no further run, the kernel's idle timer shut its cluster down (its
    Ray nodes gone, the kernel alive); `status` says gone, then nothing. (`rayflow down` of a
    kernel's cluster from another process was checked by hand: a third cluster start here would
    cost the suite 45 s.)"""
    kernel, env = kept_kernel, kept_kernel.env
    name, temp_dir = f"spark-{kernel.proc.pid}", getattr(kernel, "temp_dir", None)
    assert temp_dir, "the first test did not get as far as the second run"
    kernel.says("[rayflow] spark: shutting down the kept cluster", timeout=150)
    assert wait_until(lambda: not pids_mentioning(temp_dir), timeout=60), pids_mentioning(temp_dir)
    assert kernel.proc.poll() is None and "idle for 1 min" in kernel.output()
    assert [(r["name"], r["state"]) for r in status(env)] == [(name, "gone")]
    done = rayflow_command(env, "status")
    assert done.returncode == 0 and done.stdout.strip() == "no kept clusters"
