"""GPU smoke test: compute=gpu trains on CUDA and says so in MLflow. Skips without a CUDA device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_compute_gpu_trains_on_cuda(rayflow):
    out = rayflow.run("compute=gpu", "workload.num_samples=1", "workload.max_epochs=2")
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("cifar")
    assert parents[0].data.tags["device"] == "cuda"
    assert [r.data.tags["device"] for r in children[parents[0].info.run_id]] == ["cuda"]


def test_compute_auto_uses_the_gpu(rayflow):
    out = rayflow.run("compute=auto", "workload.num_samples=1", "workload.max_epochs=1")
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, _ = rayflow.mlflow("cifar")
    assert parents[0].data.tags["device"] == "cuda"
