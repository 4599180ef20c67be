"""backend=kuberay end to end on a real Kubernetes cluster with the KubeRay operator: apply →
head ready → the run as a Ray Job → delete, as a user runs it. Marked `kuberay`; it runs only
where RAYFLOW_TEST_KUBERAY=1 and KUBECONFIG points at such a cluster (docs/backends/kuberay.md: "Kubernetes:
backend=kuberay" shows kind). No such cluster can run on the development and CI machines.

RAYFLOW_TEST_KUBERAY_IMAGE: an image built from backends/kuberay/Dockerfile (then nothing is
installed per job); without it the job installs rayflow's dependencies (backend.job_pip).
"""

from __future__ import annotations

import os
import secrets

import pytest

pytestmark = [
    pytest.mark.kuberay,
    pytest.mark.cloud,  # a cluster outside this machine: it skips in CI too
    pytest.mark.skipif(
        os.environ.get("RAYFLOW_TEST_KUBERAY") != "1",
        reason="needs a Kubernetes cluster with the KubeRay operator: RAYFLOW_TEST_KUBERAY=1 and KUBECONFIG",
    ),
]


def test_apply_run_delete_on_a_real_cluster(rayflow):
    from rayflow.backends.kuberay.kube import Kube

    name = f"rayflow-e2e-{secrets.token_hex(3)}"
    image = os.environ.get("RAYFLOW_TEST_KUBERAY_IMAGE")
    # The trials run on the head (2 Ray CPUs): one pod, so Tune's local storage_path is enough.
    out = rayflow.run(
        "backend=kuberay",
        f"backend.cluster_name={name}",
        "backend.head.num_cpus=2",
        "backend.head.cpu=2",
        "backend.head.memory=6Gi",
        "backend.worker_groups.cpu.cpu=1",
        "backend.worker_groups.cpu.memory=2Gi",
        *([f"backend.image={image}", "backend.job_pip=[]"] if image else []),
        "workload.num_samples=2",
        "workload.max_epochs=1",
        "workload.scheduler.grace_period=1",
        "storage_path=/tmp/ray_results",
        "data.root=/tmp/cifar",
        "tracking=none",
        timeout=1800,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-5000:]
    assert f"applied RayCluster default/{name}" in text and "== rayflow results ==" in text
    assert f"deleted RayCluster default/{name} and its pods" in text
    kube = Kube("default")
    assert kube.get("RayCluster", name) is None and not kube.pods(f"ray.io/cluster={name}")
