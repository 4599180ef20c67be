"""bench.py vm-cluster: backend=vm on fake_multinode (Ray's real autoscaler, worker nodes as
processes on this machine) — time to a ready head, scale-up and scale-down latency against
the autoscaler's update interval, and what submitting the run as a Ray Job costs: the same
4-trial cifar run on backend=vm (into a cluster already at full size, submitted as a run on it is:
rayflow.orchestrator.submission.submit with the handle's Submission, `python -m rayflow.job_entry`
and the overrides as its request) and on backend=local (its own cluster start subtracted),
alternating.

Each cluster lives as a run's does (rayflow.orchestrator.cluster.running): started, then stopped
however the block ends. This driver joins the fake cluster's GCS (`provider.gcs_address` of the
`autoscaling.yaml` in the cluster's temp dir, the one its teardown command names) to watch its nodes.

--smoke: no autoscaling cluster (its scale-up and scale-down are the measurement's; those figures
are null, `head_ready_s` is the run cluster's), a full size of 1 worker that the first run does
not wait for, and one pair of 1-trial, 1-epoch runs on 256 synthetic images: the same submission
and local paths, in about 45 seconds here.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import log, smoke_option, wait_for

FAKE = [
    "backend=vm",
    "backend.provider=fake_multinode",
    "backend.worker.cpu.num_cpus=1",
    "backend.cluster_name=rayflow-bench",
    "ray_auth_mode=token",
]
IDLE_TIMEOUT_MINUTES = 0.1
RUN_TIMEOUT_S = 900  # one run on either side may take this long


def run_overrides(args) -> list[str]:
    """Identical trials on both sides (no sampling, no early stopping), 2 at a time."""
    return [
        "data.synthetic=true",
        f"data.synthetic_train_size={args.train_size}",
        "data.synthetic_test_size=200",
        f"workload.num_samples={args.samples}",
        f"workload.max_epochs={args.epochs}",
        f"workload.scheduler.grace_period={args.epochs}",
        "workload.search_space.l1.min=64",
        "workload.search_space.l1.max=64",
        "workload.search_space.l2.min=64",
        "workload.search_space.l2.max=64",
        "workload.search_space.batch_size=[64]",
    ]


def vm_cluster_args(parser) -> None:
    parser.add_argument(
        "--repeats", type=int, default=2, help="submission-cost pairs (vm, local), alternating"
    )
    parser.add_argument(
        "--hold-seconds",
        type=float,
        default=15,
        help="the task whose demand scales the cluster up holds its node this long",
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="worker nodes of the full-size cluster the run joins"
    )
    parser.add_argument("--samples", type=int, default=4, help="trials of the timed run")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each trial")
    parser.add_argument("--train-size", type=int, default=2000, help="synthetic training images")
    smoke_option(
        parser,
        "no autoscaling cluster (no scale-up or scale-down is waited for), and the run is "
        "submitted without waiting for the full size",
        repeats=1,
        workers=1,
        samples=1,
        epochs=1,
        train_size=256,
    )


def _alive() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node["Alive"])


def _backend(*overrides: str):
    from rayflow.backends import backend_for
    from rayflow.orchestrator.compose import compose_config

    return backend_for(compose_config(*FAKE, *overrides))


def _connect(handle) -> None:
    """This driver joins the fake cluster's GCS, named in its autoscaling config."""
    import ray
    import yaml

    # python -m rayflow.backends.vm.teardown <temp dir>
    temp_dir = handle.teardown_command.rsplit(" ", 1)[-1]
    config = yaml.safe_load((Path(temp_dir) / "autoscaling.yaml").read_text())
    ray.init(address=config["provider"]["gcs_address"], log_to_driver=False)


def autoscaling(interval_s: float, hold_s: float) -> dict:
    import ray

    from rayflow.orchestrator.cluster import running

    backend = _backend(
        "backend.min_worker_nodes=0",
        "backend.max_worker_nodes=1",
        f"backend.autoscale_idle_timeout_minutes={IDLE_TIMEOUT_MINUTES}",
    )
    started = time.monotonic()
    with running(backend) as handle:
        head_ready = time.monotonic() - started
        _connect(handle)
        try:
            hold = ray.remote(num_cpus=1)(lambda s: time.sleep(s))
            task = hold.remote(hold_s)  # the head has no CPU: it waits for a worker node
            up = wait_for(lambda: _alive() == 2, 120, "second node")
            ray.get(task, timeout=hold_s + 120)
            down = wait_for(lambda: _alive() == 1, 120, "scale-down")
        finally:
            ray.shutdown()
    return {
        "head_ready_s": round(head_ready, 1),
        "scale_up_s": round(up, 1),
        "scale_down_after_idle_s": round(down, 1),
        "autoscaler_update_interval_s": interval_s,
        "idle_timeout_s": IDLE_TIMEOUT_MINUTES * 60,
    }


def local_run(workdir: Path, rep: int, run: list[str]) -> float:
    """Wall seconds of the run on backend=local, less its cluster start (ray.init, as the run's
    parent MLflow run records it in cluster_start_s)."""
    from mlflow.tracking import MlflowClient

    db = workdir / f"local-{rep}.db"
    start = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayflow",
            *run,
            "backend.num_cpus=2",
            f"storage_path={workdir / 'local'}",
            f"data.root={workdir / 'data'}",
            "ray_auth_mode=token",
            f"tracking.uri=sqlite:///{db}",
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    wall = time.monotonic() - start
    if out.returncode != 0:
        raise RuntimeError(f"local run failed: {out.stderr[-2000:]}")
    client = MlflowClient(f"sqlite:///{db}")
    [found] = client.search_runs(
        [client.get_experiment_by_name("cifar").experiment_id],
        "tags.backend = 'local'",
        max_results=1,
    )
    return wall - found.data.metrics["cluster_start_s"]


def vm_run(workdir: Path, handle, rep: int, run: list[str]) -> float:
    """Wall seconds of the same run submitted as a Ray Job to a cluster already at full size, as
    a run on backend=vm submits it (rayflow.orchestrator.remote_run): `python -m rayflow.job_entry`
    with the overrides as its request, through the handle's Submission."""
    from rayflow.orchestrator.submission import (
        SUBMITTED_BY,
        job_entrypoint,
        job_overrides,
        submit,
    )
    from rayflow.results.run_result import RESULT_MARKER

    overrides = job_overrides(
        run,
        {
            "storage_path": str(workdir / "vm"),
            "data.root": str(workdir / "data"),
            "ray_auth_mode": "token",
            "tracking.uri": f"sqlite:///{workdir / f'vm-{rep}.db'}",
        },
    )
    start = time.monotonic()
    done = submit(
        handle,
        job_entrypoint(handle.submission.python),
        # as remote_run says it: the job's folder check is the submitting side's (fake nodes)
        {"PYTHONUNBUFFERED": "1", SUBMITTED_BY: "vm"},
        RESULT_MARKER,
        request={"overrides": overrides},
    )
    if not done.succeeded:
        raise RuntimeError(f"vm run ended {done.outcome.status}: {done.outcome.error}")
    return time.monotonic() - start


def vm_cluster(args) -> dict:
    import ray
    from ray._private import ray_constants

    from rayflow.orchestrator.cluster import running

    os.environ.setdefault("RAY_AUTH_MODE", "token")
    interval = float(getattr(ray_constants, "AUTOSCALER_UPDATE_INTERVAL_S", 5))
    if args.smoke:  # no autoscaling cluster: the run's cluster below gives head_ready_s
        scaling = {
            "head_ready_s": None,
            "scale_up_s": None,
            "scale_down_after_idle_s": None,
            "autoscaler_update_interval_s": interval,
            "idle_timeout_s": IDLE_TIMEOUT_MINUTES * 60,
        }
    else:
        scaling = autoscaling(interval, args.hold_seconds)
        log(f"autoscaling: {json.dumps(scaling)}")
    run = run_overrides(args)
    local_s, vm_s = [], []
    with tempfile.TemporaryDirectory(prefix="bench-vm-") as tmp:
        workdir = Path(tmp)
        backend = _backend(
            f"backend.min_worker_nodes={args.workers}", f"backend.max_worker_nodes={args.workers}"
        )
        started = time.monotonic()
        with running(backend) as handle:
            if args.smoke:
                scaling["head_ready_s"] = round(time.monotonic() - started, 1)
            _connect(handle)
            try:
                if args.smoke:  # the driver sees the head; the run waits for its worker itself
                    wait_for(lambda: _alive() >= 1, 60, "the head node")
                else:  # the timed run joins a cluster at its full size
                    wait_for(
                        lambda: _alive() == 1 + args.workers, 180, f"{args.workers} worker nodes"
                    )
            finally:
                ray.shutdown()
            for rep in range(args.repeats):
                vm_s.append(vm_run(workdir, handle, rep, run))
                local_s.append(local_run(workdir, rep, run))
                log(f"repeat {rep + 1}: vm {vm_s[-1]:.1f} s, local {local_s[-1]:.1f} s")
    vm_median, local_median = statistics.median(vm_s), statistics.median(local_s)
    return {
        "name": "vm-cluster",
        "benchmark": "vm-cluster",  # the key this line had before `name`
        **scaling,
        "vm_run_s": round(vm_median, 1),
        "local_run_s": round(local_median, 1),
        "submission_added_s": round(vm_median - local_median, 1),
        "ratio": round(vm_median / local_median, 3),
        "vm_runs_s": [round(v, 1) for v in vm_s],
        "local_runs_s": [round(v, 1) for v in local_s],
    }
