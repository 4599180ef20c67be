"""Benchmarks of rayflow's overhead: each subcommand prints ONE JSON line on stdout.

Usage (from any directory, with rayflow's venv):

    python scripts/bench.py tune-overhead                      # 16 trials x 2 s on 2 slots
    python scripts/bench.py tune-overhead --repeats 3          # median of 3 runs of each
    python scripts/bench.py tune-overhead --trials 4 --trial-seconds 1   # quick smoke run

tune-overhead runs the same sleep-and-report trials, a user's Tune function, through
workload=tune (its keys composed by Hydra, the TuneJob built from them, run_tune with the MLflow
trial callback; reported as `ratio`, `wall_s`) and through a plain Ray Tune Tuner with its defaults
(`plain_ratio`, `plain_wall_s`). A ratio is wall time / ideal time, where ideal is
trials x trial-seconds / slots: the time if scheduling, actor start-up and result
handling cost nothing. 1.0 is perfect; 1.25 means 25% overhead. Both ratios are
measured side by side in one process, alternating A and B, each run on a fresh 2-CPU cluster
of its own started before its clock starts (rayflow's as backend=local starts it, its workers
prestarted with the workload's imports; plain Tune's by ray.init), so they are comparable
with each other; ratios from different runs or machines are not.

ddp-overhead (`--repeats 3 --batch-size 256`) compares the steady-state step time of
rayflow's TorchTrainer path (2 CPU workers) with raw DDP in 2 torch.multiprocessing
processes on the same data, alternating; `ratio` = rayflow / raw (see bench_ddp.py).

ppo (`--repeats 2`) times workload=ppo (through Tune, with MLflow) and the same PPOConfig
trained by RLlib alone to an episode return of 450; `ratio` = rayflow / plain wall seconds.

data-pipeline (`--batch-size 32`, on a GPU) times a CIFAR10 epoch of the seed CNN through
rayflow's in-memory tensors and through the seed tutorial's torchvision pipeline (8 loader
workers); `ratio` = seed / rayflow. cifar-search times the whole workload=cifar search
(8 trials x 10 epochs) with --compute gpu or cpu (see bench_data.py).

hydra-sweeper (`--trials 16 --step-s 0.5`) searches one Hydra app with hydra/sweeper=rayflow,
FIFO and ASHA, and with Hydra's Optuna sweeper in batches of 2 through the joblib launcher, from a
venv of its own; `ratio` = FIFO's search wall / ideal (see bench_sweeper.py).

hydra-launcher (`--jobs 8 --job-seconds 4`) sweeps examples/hydra-app with hydra/launcher=rayflow on
backend=local and with Hydra's basic launcher; `ratio` = wall / ideal, `speedup` = basic / rayflow
(see bench_launcher.py).

object-storage (`--repeats 3`) runs the same small workload=cifar search with storage_path a
local folder and on an S3-compatible store (moto on loopback unless `--store s3://...`),
alternating; `ratio` = store / folder wall seconds (see bench_storage.py).

kuberay-cluster (`--repeats 2`, root) times backend=kuberay on scripts/kube-local.sh's stack: apply
to head ready and to the dashboard answering, scale-up and scale-down of a worker pod, and a
submitted cifar run against backend=local, with vm-cluster's figures beside them (`vm`; see
bench_kuberay.py).

vm-cluster (`--repeats 2`) times backend=vm on fake_multinode: head ready, scale-up and
scale-down, and what submitting the run as a Ray Job adds (see bench_vm.py). spark-cluster
(`--repeats 1`) times Ray on Spark through rayflow's backend against plain setup_ray_cluster:
ready, scale-up, scale-down; `ratio` = rayflow's ready / plain's.

Every subcommand takes `--smoke`: the same code paths of both sides at the least size (a few
trials of a fraction of a second, one repeat, a few hundred synthetic images, an iteration or
two), without the phases that only measure (the settle sleep before a timed run, the waits for
an autoscaler to add and remove nodes: each cluster is still started, used and stopped), still
one JSON line with the same keys (a figure of a left-out phase is null) and `"smoke": true`, in
seconds to about a minute; its figures measure nothing. tests/test_bench.py (and, in their
modules' turn, tests/test_spark.py and tests/test_vm.py) run each one so that none rots:

    python scripts/bench.py tune-overhead --smoke
    python scripts/bench.py data-pipeline --smoke --device cpu [--rayflow-only]  # no torchvision: --rayflow-only
    python scripts/bench.py cifar-search --smoke --compute cpu

`--smoke --help` of a subcommand lists its smoke sizes; options given beside `--smoke` win.

Everything except the JSON line (Ray's logs, worker output) goes to stderr, so
`python scripts/bench.py tune-overhead > result.json` gives a clean file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_data  # scripts/ is on sys.path when this file runs
import bench_ddp
import bench_kuberay
import bench_launcher
import bench_ppo
import bench_storage
import bench_sweeper
import bench_vm
from bench_common import log, median_or_none, rounded, seconds, smoke_option, wait_for

# Must be set before ray is imported anywhere (rayflow imports it lazily): token auth, as every
# cluster rayflow starts has it (auth off is refused wherever a Ray port listens beyond loopback,
# which every Ray 2.60 cluster's do), so the side-by-side ratios measure what users run.
os.environ.setdefault("RAY_AUTH_MODE", "token")

SLOTS = 2  # local cluster CPUs; each trial takes 1 CPU, so 2 trials run at once
# A started cluster's moment to settle before the timed run: the driver's own set-up (composing,
# the MLflow parent run, Tune's imports) takes about this long before Tune starts in a real run.
SETTLE_S = 2.0


def sleep_trainable(seconds: float, reports: int):
    """A function trainable that does nothing but wait and report, so all time beyond
    `seconds` per trial is Tune's (or rayflow's) overhead."""
    step = seconds / reports

    def trainable(config):
        from ray import tune

        for i in range(reports):
            time.sleep(step)
            tune.report({"score": i})

    return trainable


def mlflow_trial_runs(storage: Path):
    """rayflow's trial callback, writing into a parent run of a fresh SQLite store."""
    from mlflow.tracking import MlflowClient

    from rayflow.tracking.trial_runs import TrialRuns

    uri = f"sqlite:///{storage / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("bench")
    parent = client.create_run(experiment).info.run_id
    return TrialRuns(uri, experiment, parent, ("score",), None)


def tune_overhead(args) -> dict:
    import ray
    from ray import tune

    from rayflow.orchestrator.cluster import running
    from rayflow.orchestrator.compose import compose_config
    from rayflow.orchestrator.preflight import plan_job
    from rayflow.results.experiment import Experiment
    from rayflow.workloads import tune as tune_kind
    from rayflow.workloads.tune_fit import fit_watching_interrupts
    from rayflow.workloads.tune_runner import run_tune
    from rayflow.workloads.user_code import give

    trainable = sleep_trainable(args.trial_seconds, args.reports)
    param_space = {"i": tune.grid_search(list(range(args.trials)))}
    # The job as `python -m rayflow workload=tune backend.num_cpus=2` composes and checks it; the
    # MLflow trial callback is made here (mlflow_trial_runs), so the config's own tracking is off.
    overrides = [
        "workload=tune",
        f'workload.trainable="{give(trainable)}"',
        "workload.metric=score",
        "workload.mode=max",
        f"workload.search_space={{i: {{grid_search: {list(range(args.trials))}}}}}",
        f"backend.num_cpus={SLOTS}",
        "backend.include_dashboard=false",
        "tracking=none",
    ]
    cfg = compose_config(*overrides)
    plan = plan_job(cfg, overrides)  # the preflight: the backend, what it preloads, the trial slots
    slots = plan.trial_slots
    ideal = args.trials * args.trial_seconds / SLOTS

    # Both return whether Ctrl-C stopped Tune early; fit_watching_interrupts only swaps a
    # signal handler around fit(), so plain Tune gets the same stop handling at no cost.
    def rayflow_setup(storage: Path) -> list:
        # Like the workload: every result also goes to a nested MLflow run, from the driver.
        # The store and parent run exist before Tune starts there too, so they are not timed.
        return [mlflow_trial_runs(storage)] if args.tracking else []

    def rayflow_run(storage: Path, callbacks: list) -> bool:
        # The user's trainable through workload=tune: its keys composed by Hydra, the TuneJob
        # built from them (rayflow.workloads.tune.job) and run by run_tune, as a run does.
        tuned = tune_kind.job(cfg, trainable, callbacks=callbacks)
        tuned.verbose = 0
        tuned.max_pending_trials = slots  # as run_job sets it from RunContext.trial_slots
        return run_tune(tuned, Experiment(str(storage / "rayflow-bench")))[1]

    def plain_run(storage: Path, _: None) -> bool:
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            param_space=param_space,
            tune_config=tune.TuneConfig(metric="score", mode="max"),
            run_config=tune.RunConfig(storage_path=str(storage), name="plain-bench", verbose=0),
        )
        return fit_watching_interrupts(tuner)[1]

    def rayflow_cluster():
        # The cluster backend=local starts for this job (rayflow.orchestrator.cluster.running):
        # its idle workers prestarted with the workload's imports (Tune's function-trainable
        # wrapper; a notebook's function travels pickled), the preload the preflight planned, as
        # `python -m rayflow workload=tune` gets them.
        return running(plan.backend, plan.preload)

    @contextlib.contextmanager
    def plain_cluster():
        ray.init(num_cpus=SLOTS, include_dashboard=False)
        try:
            yield
        finally:
            ray.shutdown()

    # Each run gets a fresh cluster of its own, started before its timing starts: the seconds
    # of start-up are not what is measured (`start_s` reports them), and no run inherits
    # another's warm workers.
    tmp = Path(tempfile.mkdtemp(prefix="rayflow-bench-"))
    walls: dict[str, list[float]] = {"rayflow": [], "plain": []}
    starts: dict[str, list[float]] = {"rayflow": [], "plain": []}
    paths = (
        ("rayflow", rayflow_cluster, rayflow_setup, rayflow_run),
        ("plain", plain_cluster, lambda s: None, plain_run),
    )
    try:
        # Alternate A and B so drift (other load on the machine, warm caches) hits
        # both alike instead of all of one side.
        for rep in range(args.repeats):
            for name, cluster, setup, run in paths:
                storage = tmp / f"rep{rep}" / name  # fresh folder: no run finds another's state
                storage.mkdir(parents=True)
                prepared = setup(storage)
                began = time.perf_counter()
                with cluster():
                    starts[name].append(time.perf_counter() - began)
                    if not args.smoke:  # only the measurement needs the settled cluster
                        time.sleep(SETTLE_S)
                    start = time.perf_counter()
                    interrupted = run(storage, prepared)
                    walls[name].append(time.perf_counter() - start)
                if interrupted:  # a cut-short run's wall time means nothing
                    raise SystemExit(130)
                log(
                    f"repeat {rep + 1}/{args.repeats} {name}: {walls[name][-1]:.2f} s (ideal {ideal:.2f} s; "
                    f"cluster start {starts[name][-1]:.1f} s)"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    wall, plain_wall = statistics.median(walls["rayflow"]), statistics.median(walls["plain"])
    return {
        "name": "tune-overhead",
        "ratio": round(wall / ideal, 4),
        "plain_ratio": round(plain_wall / ideal, 4),
        "wall_s": round(wall, 3),
        "plain_wall_s": round(plain_wall, 3),
        "ideal_s": ideal,
        "start_s": round(statistics.median(starts["rayflow"]), 2),
        "plain_start_s": round(statistics.median(starts["plain"]), 2),
        "trials": args.trials,
        "slots": SLOTS,
        "repeats": args.repeats,
        "tracking": "mlflow" if args.tracking else "none",
        "ray_version": ray.__version__,
    }


def tune_overhead_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--trial-seconds", type=float, default=2.0, help="time each trial sleeps in all")
    p.add_argument("--reports", type=int, default=4, help="tune.report calls per trial")
    p.add_argument(
        "--repeats", type=int, default=1, help="runs of each path; the median is reported"
    )
    p.add_argument(
        "--no-tracking",
        dest="tracking",
        action="store_false",
        help="leave out the MLflow trial callback on rayflow's side",
    )
    smoke_option(
        p,
        "no settle sleep before a timed run",
        trials=2,
        trial_seconds=0.2,
        reports=2,
        repeats=1,
    )


# A smoke run's Spark: local mode, one JVM (local-cluster starts a master, a worker and an
# executor), where Ray on Spark sizes its nodes by spark.task.cpus.
SMOKE_SPARK = [
    "backend.master='local[1]'",
    "backend.num_cpus_worker_node=null",
    "backend.num_gpus_worker_node=null",
]


def spark_cluster(args) -> dict:
    """Ray on Spark through rayflow's backend against plain setup_ray_cluster, in turn."""
    import ray
    from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

    from rayflow.backends import backend_for
    from rayflow.backends.spark.processes import stop_session_and_jvm
    from rayflow.orchestrator.cluster import running
    from rayflow.orchestrator.compose import compose_config

    # The scaling measurement starts from one worker node and adds a second. A smoke run measures
    # no scaling: each cluster is the Ray head alone (no worker node's Spark job is launched) on
    # the least Spark (SMOKE_SPARK: local mode, one JVM).
    workers = 0 if args.smoke else 1
    overrides = [
        "backend=spark",
        f"backend.min_worker_nodes={workers}",
        f"backend.max_worker_nodes={1 if args.smoke else 2}",
        f"backend.autoscale_idle_timeout_minutes={args.idle_minutes}",
        *(SMOKE_SPARK if args.smoke else []),
    ]
    cfg = compose_config(*overrides)

    def rayflow_path():
        # The cluster's whole life as a run has it (rayflow.orchestrator.cluster.running): started
        # here, stopped by closing the stack, however the measurement ends.
        backend = backend_for(cfg)
        life = contextlib.ExitStack()
        start = time.perf_counter()
        life.enter_context(running(backend))
        return time.perf_counter() - start, life.close

    def plain_path():
        # What a user writes by hand: the same session settings and setup_ray_cluster arguments.
        from pyspark.sql import SparkSession

        backend = backend_for(cfg)  # only to read the same arguments and spark_conf
        start = time.perf_counter()
        builder = SparkSession.builder.master(str(cfg.backend.master)).appName("plain")
        for key, value in backend.spark_conf().items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        try:
            address, _ = setup_ray_cluster(**backend.setup_args())
            ray.init(address=address)
        except BaseException:
            shutdown_ray_cluster()
            stop_session_and_jvm(spark)
            raise
        ready = time.perf_counter() - start

        def stop():
            ray.shutdown()
            shutdown_ray_cluster()
            stop_session_and_jvm(spark)

        return ready, stop

    def scaling() -> tuple[float | None, float | None]:
        """(demand -> second worker alive, first worker idle -> it is removed), in seconds; in a
        smoke run (None, None) once the driver sees the cluster's nodes: no scaling is waited for."""
        alive = lambda: sum(1 for n in ray.nodes() if n["Alive"])  # noqa: E731
        wait_for(lambda: alive() >= 1 + workers, NODE_WAIT_S, "the Ray-on-Spark nodes")
        if args.smoke:
            return None, None
        hold = ray.remote(num_cpus=1)(lambda s: time.sleep(s))
        asked = time.perf_counter()
        refs = [hold.remote(args.task_seconds) for _ in range(2)]
        wait_for(lambda: alive() >= 3, NODE_WAIT_S, "second worker node (scale-up)")
        up = time.perf_counter() - asked
        ray.wait(refs, num_returns=1, timeout=args.task_seconds + NODE_WAIT_S)
        idle = time.perf_counter()
        wait_for(lambda: alive() <= 2, NODE_WAIT_S, "scale-down of the idle worker node")
        down = time.perf_counter() - idle
        ray.get(refs, timeout=args.task_seconds + NODE_WAIT_S)
        return up, down

    # The Spark and Ray-on-Spark launchers need the venv's bin on PATH and its python.
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    figures: dict[str, list] = {}
    for rep in range(args.repeats):
        for name, path in (("rayflow", rayflow_path), ("plain", plain_path)):
            ready, stop = path()
            try:
                up, down = scaling()
            finally:
                stop()
            figures.setdefault(name, []).append((ready, up, down))
            log(
                f"repeat {rep + 1}/{args.repeats} {name}: ready {ready:.1f} s, scale-up {seconds(up)}, scale-down {seconds(down)}"
            )

    med = {
        name: [median_or_none(v[i] for v in runs) for i in range(3)]
        for name, runs in figures.items()
    }
    return {
        "name": "spark-cluster",
        "ratio": round(med["rayflow"][0] / med["plain"][0], 4),
        "ready_s": rounded(med["rayflow"][0], 2),
        "plain_ready_s": rounded(med["plain"][0], 2),
        "scale_up_s": rounded(med["rayflow"][1], 2),
        "plain_scale_up_s": rounded(med["plain"][1], 2),
        "scale_down_s": rounded(med["rayflow"][2], 2),
        "plain_scale_down_s": rounded(med["plain"][2], 2),
        "idle_timeout_s": args.idle_minutes * 60,
        "master": str(cfg.backend.master),
        "repeats": args.repeats,
    }


# The most a wait for a Ray-on-Spark node to come or go may take (Spark launches worker nodes on a
# 10 s interval; a 2-core machine under load is slower).
NODE_WAIT_S = 180


def spark_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--idle-minutes", type=float, default=0.1, help="autoscale_idle_timeout_minutes")
    p.add_argument(
        "--task-seconds",
        type=float,
        default=40,
        help="length of the two tasks that force a scale-up (longer than a scale-up takes)",
    )
    p.add_argument("--repeats", type=int, default=1)
    smoke_option(
        p,
        "each side's Ray cluster is its head node alone (backend.min_worker_nodes=0) on Spark's "
        "local mode (local[1]), started, seen by the driver and stopped: no scale-up or "
        "scale-down is waited for",
        repeats=1,
    )


# name -> (function returning the result dict, function adding its options, help).
# A new benchmark is one more entry here (longer ones live in a bench_*.py next to this file).
BENCHMARKS = {
    "data-pipeline": (
        bench_data.data_pipeline,
        bench_data.data_pipeline_args,
        "seconds per CIFAR10 epoch: rayflow's in-memory tensors against the seed's torchvision DataLoader",
    ),
    "cifar-search": (
        bench_data.cifar_search,
        bench_data.cifar_search_args,
        "wall seconds of the whole workload=cifar search (8 trials x 10 epochs) on GPU or CPU",
    ),
    "ppo": (
        bench_ppo.ppo,
        bench_ppo.ppo_args,
        "wall seconds and env steps to return 450 on CartPole: workload=ppo against RLlib alone",
    ),
    "ddp-overhead": (
        bench_ddp.ddp_overhead,
        bench_ddp.ddp_overhead_args,
        "step time of rayflow's Ray Train path against raw torch.distributed DDP, 2 CPU workers",
    ),
    "tune-overhead": (
        tune_overhead,
        tune_overhead_args,
        "rayflow's run_tune against a plain Tuner",
    ),
    "vm-cluster": (
        bench_vm.vm_cluster,
        bench_vm.vm_cluster_args,
        "backend=vm on fake_multinode: head ready, scale-up/down, what submitting the run as a Ray Job adds",
    ),
    "kuberay-cluster": (
        bench_kuberay.kuberay_cluster,
        bench_kuberay.kuberay_cluster_args,
        "backend=kuberay on the local Kubernetes (real operator and autoscaler), beside vm-cluster",
    ),
    "object-storage": (
        bench_storage.object_storage,
        bench_storage.object_storage_args,
        "the same cifar run with storage_path a local folder and on an S3-compatible store",
    ),
    "hydra-launcher": (
        bench_launcher.hydra_launcher,
        bench_launcher.hydra_launcher_args,
        "a Hydra app's sweep: hydra/launcher=rayflow on local against Hydra's basic launcher",
    ),
    "hydra-sweeper": (
        bench_sweeper.hydra_sweeper,
        bench_sweeper.hydra_sweeper_args,
        "a Hydra app's search: hydra/sweeper=rayflow (FIFO, ASHA) against Hydra's Optuna sweeper in batches",
    ),
    "spark-cluster": (
        spark_cluster,
        spark_cluster_args,
        "Ray on Spark via rayflow against plain setup_ray_cluster: ready, scale-up, scale-down",
    ),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, add_args, help_) in BENCHMARKS.items():
        add_args(sub.add_parser(name, help=help_))
    args = parser.parse_args(argv)
    if args.smoke:  # its sizes become the defaults; options given beside --smoke still win
        sub.choices[args.command].set_defaults(**args.smoke_sizes)
        args = parser.parse_args(argv)
        log(
            f"{args.command} --smoke: {args.smoke_sizes} (a smoke run: its figures measure nothing)"
        )

    # Keep stdout for the JSON line alone: point fd 1 at stderr for the run, so that
    # Ray's driver, worker-log forwarding and child processes cannot write into it.
    sys.stdout.flush()
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    result = BENCHMARKS[args.command][0](args)
    if args.smoke:  # its figures measure nothing: the line says so
        result["smoke"] = True
    result_out.write(json.dumps(result) + "\n")
    result_out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
