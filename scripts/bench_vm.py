"""bench.py vm-cluster: backend=vm on fake_multinode (Ray's real autoscaler, worker nodes as
processes on this machine) — time to a ready head, scale-up and scale-down latency against
the autoscaler's update interval, and what submitting the run as a Ray Job costs: the same
4-trial cifar run on backend=vm (into a cluster already at full size) and on backend=local
(its own cluster start subtracted), alternating."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Identical trials on both sides (no sampling, no early stopping), 2 at a time.
RUN = [
    "data.synthetic=true",
    "data.synthetic_train_size=2000",
    "data.synthetic_test_size=200",
    "workload.num_samples=4",
    "workload.max_epochs=3",
    "workload.scheduler.grace_period=3",
    "workload.search_space.l1.min=64",
    "workload.search_space.l1.max=64",
    "workload.search_space.l2.min=64",
    "workload.search_space.l2.max=64",
    "workload.search_space.batch_size=[64]",
]
FAKE = [
    "backend=vm",
    "backend.provider=fake_multinode",
    "backend.worker.cpu.num_cpus=1",
    "backend.cluster_name=rayflow-bench",
    "ray_auth_mode=disabled",
]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def vm_cluster_args(parser) -> None:
    parser.add_argument(
        "--repeats", type=int, default=2, help="submission-cost pairs (vm, local), alternating"
    )


def _alive() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node["Alive"])


def _wait(predicate, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"bench vm-cluster: no {what} within {timeout:g} s")
        time.sleep(0.2)
    return time.monotonic() - start


def _backend(*overrides: str):
    from rayflow.backends import backend_for
    from rayflow.orchestrator.compose import compose_config

    return backend_for(compose_config(*FAKE, *overrides))


def _connect(backend) -> None:
    import ray
    import yaml

    gcs = yaml.safe_load(Path(backend._config_file).read_text())["provider"]["gcs_address"]
    ray.init(address=gcs, log_to_driver=False)


def autoscaling(interval_s: float) -> dict:
    import ray

    backend = _backend(
        "backend.min_worker_nodes=0",
        "backend.max_worker_nodes=1",
        "backend.autoscale_idle_timeout_minutes=0.1",
    )
    started = time.monotonic()
    with backend:
        head_ready = time.monotonic() - started
        _connect(backend)
        try:
            hold = ray.remote(num_cpus=1)(lambda s: time.sleep(s))
            task = hold.remote(15)
            up = _wait(lambda: _alive() == 2, 120, "second node")
            ray.get(task)
            down = _wait(lambda: _alive() == 1, 120, "scale-down")
        finally:
            ray.shutdown()
    return {
        "head_ready_s": round(head_ready, 1),
        "scale_up_s": round(up, 1),
        "scale_down_after_idle_s": round(down, 1),
        "autoscaler_update_interval_s": interval_s,
        "idle_timeout_s": 6.0,
    }


def local_run(workdir: Path, rep: int) -> float:
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
            *RUN,
            "backend.num_cpus=2",
            f"storage_path={workdir / 'local'}",
            f"data.root={workdir / 'data'}",
            "ray_auth_mode=disabled",
            f"tracking.uri=sqlite:///{db}",
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.monotonic() - start
    if out.returncode != 0:
        raise RuntimeError(f"local run failed: {out.stderr[-2000:]}")
    client = MlflowClient(f"sqlite:///{db}")
    [run] = client.search_runs(
        [client.get_experiment_by_name("cifar").experiment_id],
        "tags.backend = 'local'",
        max_results=1,
    )
    return wall - run.data.metrics["cluster_start_s"]


def vm_run(workdir: Path, url: str, rep: int) -> float:
    """Wall seconds of the same run submitted as a Ray Job to a cluster already at full size."""
    from rayflow.orchestrator.submission import job_overrides, run_as_job

    overrides = job_overrides(
        RUN,
        {
            "storage_path": str(workdir / "vm"),
            "data.root": str(workdir / "data"),
            "ray_auth_mode": "disabled",
            "tracking.uri": f"sqlite:///{workdir / f'vm-{rep}.db'}",
        },
    )
    start = time.monotonic()
    outcome = run_as_job(
        url, [sys.executable, "-m", "rayflow", *overrides], {"PYTHONUNBUFFERED": "1"}
    )
    if outcome.status != "SUCCEEDED":
        raise RuntimeError(f"vm run ended {outcome.status}: {outcome.error}")
    return time.monotonic() - start


def vm_cluster(args) -> dict:
    from ray._private import ray_constants

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    interval = float(getattr(ray_constants, "AUTOSCALER_UPDATE_INTERVAL_S", 5))
    scaling = autoscaling(interval)
    log(f"autoscaling: {json.dumps(scaling)}")
    local_s, vm_s = [], []
    with tempfile.TemporaryDirectory(prefix="bench-vm-") as tmp:
        workdir = Path(tmp)
        backend = _backend("backend.min_worker_nodes=2", "backend.max_worker_nodes=2")
        with backend:
            _connect(backend)
            _wait(lambda: _alive() == 3, 180, "two worker nodes")
            import ray

            ray.shutdown()
            for rep in range(args.repeats):
                vm_s.append(vm_run(workdir, backend.address, rep))
                local_s.append(local_run(workdir, rep))
                log(f"repeat {rep + 1}: vm {vm_s[-1]:.1f} s, local {local_s[-1]:.1f} s")
    vm_median, local_median = statistics.median(vm_s), statistics.median(local_s)
    return {
        "benchmark": "vm-cluster",
        **scaling,
        "vm_run_s": round(vm_median, 1),
        "local_run_s": round(local_median, 1),
        "submission_added_s": round(vm_median - local_median, 1),
        "ratio": round(vm_median / local_median, 3),
        "vm_runs_s": [round(v, 1) for v in vm_s],
        "local_runs_s": [round(v, 1) for v in local_s],
    }
