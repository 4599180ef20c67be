"""bench.py kuberay-cluster: backend=kuberay on the local Kubernetes (scripts/kube_local: the real
control plane and KubeRay operator, Ray's autoscaler in the head pod, pods as processes), beside
vm-cluster's fake_multinode figures measured in the same run (`vm`):

- `head_ready_s`: apply -> the RayCluster's HeadPodReady condition, and `dashboard_s`: apply ->
  the Jobs API answering through the API server's service proxy (what rayflow waits for);
- `scale_up_s`: a task the head cannot hold submitted -> the worker pod Ready (the autoscaler's
  request, the operator's pod, the scheduler's binding, the pod's Ray joining), and
  `scale_down_after_idle_s`: the task done -> the worker pod gone (idle timeout, workersToDelete);
- `kuberay_run_s` against `local_run_s`: the same cifar run submitted to the cluster at full size
  (its checkpoints in the S3 bucket on the bridge) and on backend=local (its own cluster start
  subtracted), alternating; `ratio` = kuberay / local.

Needs root and the built control plane (`bash scripts/setup.sh --test`). --smoke: one
1-trial, 1-epoch run on the cluster, no local run (vm-cluster's smoke runs that), no scale-up or
scale-down waited for, and no vm figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import bench_vm
from bench_common import log, smoke_option, wait_for

REPO = Path(__file__).resolve().parents[1]

IDLE_TIMEOUT_MINUTES = 0.1
HOLD = (
    "import ray, time; ray.init(); "
    "ray.get(ray.remote(num_cpus=1)(lambda s: time.sleep(s)).remote({}))"
)


def kuberay_cluster_args(parser) -> None:
    parser.add_argument("--repeats", type=int, default=2, help="run pairs (kuberay, local)")
    parser.add_argument("--hold-seconds", type=float, default=15, help="the scale-up task's length")
    parser.add_argument("--samples", type=int, default=4, help="trials of the timed run")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each trial")
    parser.add_argument("--train-size", type=int, default=2000, help="synthetic training images")
    smoke_option(
        parser,
        "no scale-up or scale-down is waited for, and no vm-cluster figures",
        repeats=1,
        samples=1,
        epochs=1,
        train_size=256,
    )


@contextlib.contextmanager
def local_kube(state: Path) -> Iterator[dict[str, str]]:
    """scripts/kube-local.sh up ... down, as a user runs it: the variables `up` exports."""
    argv = [sys.executable, "-m", "scripts.kube_local.cli"]
    up = subprocess.run(
        [*argv, "up", f"--state={state}"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    try:
        if up.returncode != 0:
            raise RuntimeError(f"kube-local up failed: {up.stderr[-2000:]}")
        exports = {}
        for line in up.stdout.splitlines():  # export lines, and nothing else
            if not line.startswith("export "):
                raise RuntimeError(f"kube-local up printed more than export lines: {line!r}")
            key, _, value = line.removeprefix("export ").partition("=")
            exports[key] = shlex.split(value)[0] if value else ""
        yield exports
    finally:
        subprocess.run([*argv, "down", f"--state={state}"], cwd=REPO, timeout=300)


class Cluster:
    """The RayCluster `bench` and its pods, read with the kubeconfig `up` wrote."""

    def __init__(self, kubeconfig: str):
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=kubeconfig)
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def pods(self, kind: str) -> list:
        selector = f"ray.io/cluster=bench,ray.io/node-type={kind}"
        return self.core.list_namespaced_pod("default", label_selector=selector).items

    def worker_ready(self) -> bool:
        return any(
            c.type == "Ready" and c.status == "True"
            for pod in self.pods("worker")
            for c in pod.status.conditions or []
        )

    def head_ready_at(self, started: float) -> float | None:
        """Seconds from `started` (a monotonic reading at apply) to HeadPodReady, from the
        condition's lastTransitionTime (whole seconds)."""
        import datetime

        cluster = self.custom.get_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", "bench"
        )
        for condition in cluster.get("status", {}).get("conditions") or []:
            if condition["type"] == "HeadPodReady" and condition["status"] == "True":
                stamp = datetime.datetime.fromisoformat(condition["lastTransitionTime"])
                ago = datetime.datetime.now(datetime.UTC).timestamp() - stamp.timestamp()
                return round(time.monotonic() - ago - started, 1)
        return None


def _backend(kubeconfig: str, *overrides: str):
    from rayflow.backends import backend_for
    from rayflow.orchestrator.compose import compose_config

    return backend_for(
        compose_config(
            "backend=kuberay",
            f"backend.kubeconfig={kubeconfig}",
            "backend.job_pip=[]",
            "backend.cluster_name=bench",
            "backend.max_worker_nodes=1",
            f"backend.autoscale_idle_timeout_minutes={IDLE_TIMEOUT_MINUTES}",
            "storage_path=s3://rayflow-local/runs",
            *overrides,
        )
    )


def _scaling(cluster: Cluster, handle, hold_s: float) -> dict:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(handle.address, headers=handle.submission.headers)
    job = client.submit_job(entrypoint=f"python -c '{HOLD.format(hold_s)}'")

    def worker_ready() -> bool:
        if client.get_job_status(job).is_terminal():  # it ended before any demand was seen
            raise RuntimeError(f"the scale-up job ended: {client.get_job_logs(job)[-2000:]}")
        return cluster.worker_ready()

    up = wait_for(worker_ready, 300, "a Ready worker pod", interval=0.5)
    wait_for(lambda: client.get_job_status(job).is_terminal(), hold_s + 300, "the task's end")
    down = wait_for(lambda: not cluster.pods("worker"), 300, "the worker pod gone")
    return {"scale_up_s": round(up, 1), "scale_down_after_idle_s": round(down, 1)}


def _kuberay_run(workdir: Path, handle, rep: int, run: list[str], bucket_env: dict) -> float:
    from rayflow.orchestrator.submission import SUBMITTED_BY, job_entrypoint, job_overrides, submit
    from rayflow.results.run_result import RESULT_MARKER

    overrides = job_overrides(
        run,
        {
            "storage_path": f"s3://rayflow-local/runs-{rep}",
            "data.root": "/tmp/data",  # the head pod's and each worker pod's own /tmp
            "ray_auth_mode": "token",
            "tracking.uri": f"sqlite:////tmp/kuberay-{rep}.db",  # in the head pod
        },
    )
    start = time.monotonic()
    done = submit(
        handle,
        job_entrypoint(handle.submission.python),
        {"PYTHONUNBUFFERED": "1", SUBMITTED_BY: "kuberay", **bucket_env},
        RESULT_MARKER,
        request={"overrides": overrides},
    )
    if not done.succeeded:
        raise RuntimeError(f"kuberay run ended {done.outcome.status}: {done.outcome.error}")
    return time.monotonic() - start


def kuberay_cluster(args) -> dict:
    from rayflow.orchestrator.cluster import running

    os.environ.setdefault("RAY_AUTH_MODE", "token")
    vm = None
    if not args.smoke:  # the fake_multinode figures beside these, in the same run
        vm = bench_vm.vm_cluster(argparse.Namespace(**{**vars(args), "workers": 1}))
        log(f"vm-cluster: {json.dumps(vm)}")
    run = bench_vm.run_overrides(args)
    figures: dict = {}
    kube_s, local_s = [], []
    with tempfile.TemporaryDirectory(prefix="bench-kuberay-") as tmp:
        workdir = Path(tmp)
        with local_kube(workdir / "kube-local") as exports:
            store = {k: v for k, v in exports.items() if k.startswith("AWS_")}
            os.environ.update(store)  # this driver's S3 settings: the job gets them too
            cluster = Cluster(exports["KUBECONFIG"])
            started = time.monotonic()
            with running(_backend(exports["KUBECONFIG"])) as handle:
                figures["dashboard_s"] = round(time.monotonic() - started, 1)
                figures["head_ready_s"] = cluster.head_ready_at(started)
                if args.smoke:
                    figures.update(scale_up_s=None, scale_down_after_idle_s=None)
                else:
                    figures.update(_scaling(cluster, handle, args.hold_seconds))
                for rep in range(args.repeats):
                    kube_s.append(_kuberay_run(workdir, handle, rep, run, store))
                    log(f"repeat {rep + 1}: kuberay {kube_s[-1]:.1f} s")
                    if not args.smoke:  # vm-cluster's smoke runs the local half
                        local_s.append(bench_vm.local_run(workdir, rep, run))
                        log(f"repeat {rep + 1}: local {local_s[-1]:.1f} s")
    kube_median = statistics.median(kube_s)
    local_median = statistics.median(local_s) if local_s else None
    return {
        "name": "kuberay-cluster",
        **figures,
        "idle_timeout_s": IDLE_TIMEOUT_MINUTES * 60,
        "kuberay_run_s": round(kube_median, 1),
        "local_run_s": local_median and round(local_median, 1),
        "submission_added_s": local_median and round(kube_median - local_median, 1),
        "ratio": local_median and round(kube_median / local_median, 3),
        "kuberay_runs_s": [round(v, 1) for v in kube_s],
        "local_runs_s": [round(v, 1) for v in local_s],
        "vm": vm,
    }
