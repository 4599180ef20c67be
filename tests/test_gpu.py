"""GPU tests (`pytest -m gpu`): every workload with compute=gpu trains on CUDA and says so in
MLflow, with the GPU's model as its trials and workers saw it. Each skips without a CUDA device
(CI has none); scripts/gpu_smoke.sh runs the same paths as a script."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)"
    ),
]


@pytest.fixture(scope="module")
def gpu_model() -> str:
    """e.g. "NVIDIA H100 80GB HBM3": what torch.cuda.get_device_name says here."""
    return torch.cuda.get_device_name(0)


def test_cifar_trials_share_one_gpu_and_report_its_model(rayflow, gpu_model):
    out = rayflow.run(
        "compute=gpu",
        "workload.num_samples=2",
        "workload.max_epochs=1",
        "workload.resources_per_trial.gpu=0.5",
    )
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
    out = rayflow.run(
        "compute=gpu",
        "workload=ddp",
        f"workload.num_workers={gpus}",
        "workload.model=resnet",
        "workload.amp=true",
        "workload.epochs=2",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("ddp")
    assert parents[0].data.tags["device"] == "cuda"
    assert gpu_model in parents[0].data.tags["device_name"]
    [train] = children[parents[0].info.run_id]
    assert gpu_model in train.data.tags["device_name"]  # reported by the Train workers
    assert sorted(m.step for m in client.get_metric_history(train.info.run_id, "val_accuracy")) == [
        1,
        2,
    ]
    assert sorted(rayflow.storage.glob("ddp-*/checkpoint_*/checkpoint.pt"))


def test_ppo_learner_on_cuda(rayflow, gpu_model):
    pytest.importorskip("ray.rllib")
    out = rayflow.run(
        "compute=gpu",
        "workload=ppo",
        "workload.stop.iterations=2",
        "workload.train_batch_size=1000",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("ppo")
    assert parents[0].data.tags["device"] == "cuda"
    assert gpu_model in parents[0].data.tags["device_name"]
    [trial] = children[parents[0].info.run_id]
    # asked of the learner: the device of its RLModule's parameters, in the process holding them
    assert trial.data.tags["device"] == "cuda" and gpu_model in trial.data.tags["device_name"]
    assert trial.data.metrics["num_env_steps_sampled_lifetime"] == 2000
    assert sorted(rayflow.storage.glob("ppo-*/PPO_*/checkpoint_*/algorithm_state.pkl"))


def test_cifar_cuda_graph_step_trains_like_the_eager_step(tmp_path, monkeypatch):
    """workload=cifar's TrainStep on CUDA: the full-size batches replay a captured CUDA graph,
    the loss falls, and every epoch's loss and the weights match the eager step's; a
    checkpoint restores into a fresh trial and into the captured one (which re-captures)."""
    from rayflow.workloads.presets import cifar_train

    # cuDNN's default conv backward algorithms are nondeterministic: on the H100 two eager runs
    # of this very test differed by up to 1.3e-2 in a weight after 3 epochs, which fails the
    # comparisons below now and then. With deterministic kernels graph, eager and restored runs
    # were bit-identical there, so what is compared is the step, not the kernels' atomics.
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)

    g = torch.Generator().manual_seed(0)
    n = 2000  # 62 batches of 32 and one of 16 (eager)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = (
        (
            torch.randint(0, 256, (10, 3, 32, 32), generator=g)[labels]
            + torch.randint(-40, 41, (n, 3, 32, 32), generator=g)
        )
        .clamp(0, 255)
        .to(torch.uint8)
    )
    images, labels = images.cuda(), labels.cuda()
    criterion = torch.nn.CrossEntropyLoss()

    def trial():
        torch.manual_seed(0)
        net = cifar_train.Net(16, 8).cuda()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        return net, optimizer

    runs = {}
    for graph in (False, True):
        net, optimizer = trial()
        step = cifar_train.TrainStep(net, optimizer, criterion, 32, cuda_graph=graph)
        losses = []
        for epoch in range(3):
            losses.append(
                cifar_train.train_epoch(step, images, labels, torch.Generator().manual_seed(epoch))
            )
            if epoch == 1 and graph:
                cifar_train.save_checkpoint(str(tmp_path), net, optimizer, epoch=2)
        assert (step.graph is not None) == graph
        runs[graph] = (
            losses,
            [p.detach().clone() for p in net.parameters()],
            cifar_train.evaluate(net, criterion, images, labels),
        )
    (eager, eager_params, eager_val), (graphed, graphed_params, graphed_val) = (
        runs[False],
        runs[True],
    )
    assert graphed[2] < graphed[0] * 0.9, graphed
    assert graphed == pytest.approx(eager, rel=1e-3)
    assert all(
        torch.allclose(a, b, rtol=1e-3, atol=1e-4) for a, b in zip(graphed_params, eager_params)
    )
    assert graphed_val == pytest.approx(eager_val, rel=1e-2)

    # a fresh trial restored from the epoch-2 checkpoint: its epoch 3 is the graphed run's
    net, optimizer = trial()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.0)
    assert cifar_train.load_checkpoint(str(tmp_path), net, optimizer, "cuda") == 2
    step = cifar_train.TrainStep(net, optimizer, criterion, 32)
    assert cifar_train.train_epoch(
        step, images, labels, torch.Generator().manual_seed(2)
    ) == pytest.approx(graphed[2], rel=1e-4)
    assert step.graph is not None
    # restored into the trial whose graph is captured: the graph is dropped and re-captured
    captured = step.graph
    assert cifar_train.load_checkpoint(str(tmp_path), net, optimizer, "cuda") == 2
    assert cifar_train.train_epoch(
        step, images, labels, torch.Generator().manual_seed(2)
    ) == pytest.approx(graphed[2], rel=1e-4)
    assert step.graph is not None and step.graph is not captured
    assert all(
        torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(net.parameters(), graphed_params)
    )
