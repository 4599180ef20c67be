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


def test_ddp_trains_with_nccl_and_mixed_precision_on_cuda(rayflow):
    gpus = torch.cuda.device_count()
    out = rayflow.run("compute=gpu", "workload=ddp", f"workload.num_workers={gpus}", "workload.model=resnet",
                      "workload.amp=true", "workload.epochs=2")
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("ddp")
    assert parents[0].data.tags["device"] == "cuda"
    [train] = children[parents[0].info.run_id]
    assert sorted(m.step for m in client.get_metric_history(train.info.run_id, "val_accuracy")) == [1, 2]


def test_ppo_learner_on_cuda(rayflow):
    pytest.importorskip("ray.rllib")
    out = rayflow.run("compute=gpu", "workload=ppo", "workload.stop.iterations=2", "workload.train_batch_size=1000")
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("ppo")
    assert parents[0].data.tags["device"] == "cuda"
    [trial] = children[parents[0].info.run_id]
    assert trial.data.metrics["num_env_steps_sampled_lifetime"] == 2000
