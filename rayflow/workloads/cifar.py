"""workload=cifar: Ray Tune + ASHA over the seed tutorial's CIFAR10 CNN, a checkpoint per epoch.

Each trial loads the data once (uint8 tensors, see rayflow.data), trains with SGD, and
every epoch reports val_loss, val_accuracy and epoch with a checkpoint holding the model
and optimizer state. A restarted trial (FailureConfig.max_failures) or a resumed
experiment (resume=true) continues from the trial's last checkpoint.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.nn as nn

from rayflow.config import ConfigError, bounds, gpu_request, one_of, positive_int, positive_number
from rayflow.data import DataSpec, iterate, load_split
from rayflow.models import Net
from rayflow.placement import Bundle, section_bundle

METRICS = ("val_loss", "val_accuracy", "train_loss", "epoch")


def powers_of_two(low: int, high: int) -> list[int]:
    return [2**i for i in range(0, 31) if low <= 2**i <= high]


def check(cfg) -> None:
    w = cfg.workload
    positive_int(cfg, "workload.num_samples")
    max_epochs = positive_int(cfg, "workload.max_epochs")
    grace = positive_int(cfg, "workload.scheduler.grace_period")
    if grace > max_epochs:
        raise ConfigError("workload.scheduler.grace_period", f"({grace}) exceeds workload.max_epochs ({max_epochs})")
    positive_int(cfg, "workload.scheduler.reduction_factor", minimum=2)
    positive_int(cfg, "workload.max_failures", minimum=0)
    if w.checkpoints_to_keep is not None:
        positive_int(cfg, "workload.checkpoints_to_keep")
    one_of(cfg, "workload.metric", ("val_loss", "val_accuracy"))
    one_of(cfg, "workload.mode", ("min", "max"))
    positive_number(cfg, "workload.resources_per_trial.cpu")
    gpu_request(cfg, "workload.resources_per_trial.gpu")
    if w.resources_per_trial.get("memory") is not None:
        positive_int(cfg, "workload.resources_per_trial.memory")
    for key in ("l1", "l2"):
        low, high = bounds(cfg, f"workload.search_space.{key}")
        if not powers_of_two(low, high):
            raise ConfigError(f"workload.search_space.{key}", f"no power of two between {low} and {high}")
    bounds(cfg, "workload.search_space.lr", log=True)
    sizes = list(w.search_space.batch_size)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ConfigError("workload.search_space.batch_size", f"must be a non-empty list of positive integers; got {sizes}")


def demand(cfg) -> list[Bundle]:
    return [section_bundle(cfg, "a trial", "workload.resources_per_trial")]


def search_space(w) -> dict:
    from ray import tune

    s = w.search_space
    return {
        "l1": tune.choice(powers_of_two(s.l1.min, s.l1.max)),
        "l2": tune.choice(powers_of_two(s.l2.min, s.l2.max)),
        "lr": tune.loguniform(s.lr.min, s.lr.max),
        "batch_size": tune.choice(list(s.batch_size)),
        "momentum": float(s.momentum),
    }


def save_checkpoint(folder: str, net: nn.Module, optimizer, epoch: int) -> None:
    state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
    torch.save(state, os.path.join(folder, "checkpoint.pt"))


def load_checkpoint(folder: str, net: nn.Module, optimizer, device: str = "cpu") -> int:
    """Restore model and optimizer state in place; returns the epoch the checkpoint ended."""
    state = torch.load(os.path.join(folder, "checkpoint.pt"), map_location=device)
    net.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["epoch"])


def train_cifar(config: dict, data: DataSpec, max_epochs: int, want_gpu: bool) -> None:
    """The trainable: one trial, one process; reports and checkpoints every epoch."""
    from ray import tune

    device = "cuda" if want_gpu and torch.cuda.is_available() else "cpu"
    train_x, train_y, val_x, val_y = load_split(data, device)
    net = Net(config["l1"], config["l2"]).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=config["lr"], momentum=config["momentum"])
    criterion = nn.CrossEntropyLoss()
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            start = load_checkpoint(folder, net, optimizer, device)
    generator = torch.Generator().manual_seed(data.seed + start)
    batch_size = int(config["batch_size"])

    for epoch in range(start + 1, max_epochs + 1):
        net.train()
        train_loss, steps = 0.0, 0
        for images, labels in iterate(train_x, train_y, batch_size, shuffle=True, generator=generator):
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            train_loss += loss.item()
            steps += 1
        net.eval()
        val_loss, correct = 0.0, 0
        with torch.no_grad():
            for images, labels in iterate(val_x, val_y, 512, shuffle=False):
                outputs = net(images)
                val_loss += criterion(outputs, labels).item() * len(labels)
                correct += (outputs.argmax(1) == labels).sum().item()
        metrics = {
            "epoch": epoch,
            "train_loss": train_loss / max(steps, 1),
            "val_loss": val_loss / len(val_y),
            "val_accuracy": correct / len(val_y),
            "device": device,
            "device_name": torch.cuda.get_device_name(device) if device == "cuda" else device,
            "synthetic": data.synthetic,
        }
        with tempfile.TemporaryDirectory() as folder:
            save_checkpoint(folder, net, optimizer, epoch)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))


def run(cfg, ctx):
    """Tune the CNN with ASHA on the connected cluster; returns a TuneSummary."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from rayflow.tuning import TuneJob, run_tune, summarize

    w = cfg.workload
    gpus = float(w.resources_per_trial.gpu or 0)
    trainable = tune.with_parameters(
        train_cifar, data=ctx.data, max_epochs=int(w.max_epochs), want_gpu=gpus > 0
    )
    job = TuneJob(
        trainable=trainable,
        param_space=search_space(w),
        metric=str(w.metric),
        mode=str(w.mode),
        num_samples=int(w.num_samples),
        resources={"cpu": float(w.resources_per_trial.cpu), "gpu": gpus,
                   **({"memory": int(w.resources_per_trial.memory)} if w.resources_per_trial.get("memory") else {})},
        scheduler=ASHAScheduler(
            time_attr="epoch",
            max_t=int(w.max_epochs),
            grace_period=int(w.scheduler.grace_period),
            reduction_factor=int(w.scheduler.reduction_factor),
        ),
        max_failures=int(w.max_failures),
        checkpoints_to_keep=w.checkpoints_to_keep,
        reuse_actors=bool(w.reuse_actors),
        callbacks=[cb for cb in [ctx.tracker.trial_callback(METRICS, int(w.max_epochs))] if cb],
    )
    results, interrupted = run_tune(job, ctx.experiment_dir, resume=ctx.resume)
    return summarize(results, job.metric, job.mode, int(w.max_epochs), int(w.num_samples), interrupted)
