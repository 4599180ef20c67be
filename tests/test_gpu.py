"""GPU tests (`pytest -m gpu`): every workload with compute=gpu trains on CUDA and says so in
MLflow, with the GPU's model as its trials and workers saw it. Each skips without a CUDA device
(CI has none); scripts/gpu_smoke.sh runs the same paths as a script."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)"),
]


@pytest.fixture(scope="module")
def gpu_model() -> str:
    """e.g. "NVIDIA H100 80GB HBM3": what torch.cuda.get_device_name says here."""
    return torch.cuda.get_device_name(0)


def test_cifar_trials_share_one_gpu_and_report_its_model(rayflow, gpu_model):
    out = rayflow.run("compute=gpu", "workload.num_samples=2", "workload.max_epochs=1",
                      "workload.resources_per_trial.gpu=0.5")
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("cifar")
    [parent] = parents
    assert parent.data.tags["device"] == "cuda"
    assert gpu_model in parent.data.tags["device_name"]
    trials = children[parent.info.run_id]
    assert len(trials) == 2
    for trial in trials:
        assert trial.data.tags["device"] == "cuda"
        assert gpu_model in trial.data.tags["device_name"], trial.data.tags
        assert [m.step for m in client.get_metric_history(trial.info.run_id, "val_loss")] == [1]
    # 0.5 GPU each: both trials held the one GPU at the same time
    assert max(t.info.start_time for t in trials) < min(t.info.end_time for t in trials)
    assert len(rayflow.checkpoints()) == 2


def test_compute_gpu_trains_two_epochs_on_cuda(rayflow, gpu_model):
    out = rayflow.run("compute=gpu", "workload.num_samples=1", "workload.max_epochs=2")
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("cifar")
    assert parents[0].data.tags["device"] == "cuda"
    [trial] = children[parents[0].info.run_id]
    assert trial.data.tags["device"] == "cuda" and gpu_model in trial.data.tags["device_name"]


def test_compute_auto_uses_the_gpu(rayflow, gpu_model):
    out = rayflow.run("compute=auto", "workload.num_samples=1", "workload.max_epochs=1")
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, _ = rayflow.mlflow("cifar")
    assert parents[0].data.tags["device"] == "cuda"
    assert gpu_model in parents[0].data.tags["device_name"]


def test_ddp_trains_with_nccl_and_mixed_precision_on_cuda(rayflow, gpu_model):
    gpus = torch.cuda.device_count()
    out = rayflow.run("compute=gpu", "workload=ddp", f"workload.num_workers={gpus}", "workload.model=resnet",
                      "workload.amp=true", "workload.epochs=2")
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("ddp")
    assert parents[0].data.tags["device"] == "cuda"
    assert gpu_model in parents[0].data.tags["device_name"]
    [train] = children[parents[0].info.run_id]
    assert gpu_model in train.data.tags["device_name"]  # reported by the Train workers
    assert sorted(m.step for m in client.get_metric_history(train.info.run_id, "val_accuracy")) == [1, 2]
    assert sorted(rayflow.storage.glob("ddp-*/checkpoint_*/checkpoint.pt"))


def test_ppo_learner_on_cuda(rayflow, gpu_model):
    pytest.importorskip("ray.rllib")
    out = rayflow.run("compute=gpu", "workload=ppo", "workload.stop.iterations=2", "workload.train_batch_size=1000")
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("ppo")
    assert parents[0].data.tags["device"] == "cuda"
    assert gpu_model in parents[0].data.tags["device_name"]
    [trial] = children[parents[0].info.run_id]
    # asked of the learner: the device of its RLModule's parameters, in the process holding them
    assert trial.data.tags["device"] == "cuda" and gpu_model in trial.data.tags["device_name"]
    assert trial.data.metrics["num_env_steps_sampled_lifetime"] == 2000
    assert sorted(rayflow.storage.glob("ppo-*/PPO_*/checkpoint_*/algorithm_state.pkl"))
