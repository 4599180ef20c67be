"""workload=ddp, the workers' side: data-parallel training of a CIFAR10 model with Ray Train's
TorchTrainer.

`train_loop` runs in every worker: the data set as in-memory tensors
(rayflow.workloads.presets.cifar_data, as workload=cifar), its own shard from a DistributedSampler,
the model wrapped in DDP by `prepare_model` (gloo on CPU, NCCL on GPU). Each epoch all workers
report the same cross-worker metrics; rank 0 saves the checkpoint and writes them to the nested
MLflow run. A restarted worker group (a worker died) or `resume=true` continues from the
latest checkpoint: Ray Train keeps a snapshot of its checkpoints in the run's folder.
The driver side (the workload's checks, `run`, the Tune sweep, the summary) is
rayflow.workloads.presets.ddp.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.data import DistributedSampler

from rayflow.tracking.mlflow_runs import log_step
from rayflow.workloads.presets.cifar_data import iterate, load_split
from rayflow.workloads.presets.cifar_train import read_checkpoint
from rayflow.workloads.presets.models import build_model

# What an epoch reports (to Ray Train, Tune and MLflow).
METRICS = ("train_loss", "val_loss", "val_accuracy", "samples_per_s", "step_time_s", "lr", "epoch")


def lr_factor(config: dict, steps_per_epoch: int):
    """The multiplier of the peak lr at each optimizer step: warm-up, then the schedule."""
    import math

    warmup = config["warmup_epochs"] * steps_per_epoch
    total = config["epochs"] * steps_per_epoch
    name = config["lr_schedule"]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if name == "cosine":
            return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
        if name == "step":
            return config["gamma"] ** ((step - warmup) // (config["step_epochs"] * steps_per_epoch))
        return 1.0

    return factor


def evaluate(model: nn.Module, images, labels, indices, criterion) -> torch.Tensor:
    """(summed loss, correct, count) over this worker's share of the validation set."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=images.device)
    with torch.no_grad():
        for x, y in iterate(images, labels, 1024, shuffle=False, indices=indices):
            out = model(x).float()
            totals[0] += criterion(out, y) * len(y)
            totals[1] += (out.argmax(1) == y).sum()
            totals[2] += len(y)
    return totals


def _save(folder: str, epoch: int, model, optimizer, scheduler, scaler) -> None:
    state = {
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
    }
    torch.save(state, os.path.join(folder, "checkpoint.pt"))


def _restore(model, optimizer, scheduler, scaler, device) -> int:
    """Load the latest checkpoint of this run, if any; returns the epoch it ended."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as folder:
        state = read_checkpoint(os.path.join(folder, "checkpoint.pt"), device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    return int(state["epoch"])


@dataclass
class _Worker:
    """What one worker trains with (_setup): its share of the data, the model, the optimizer."""

    rank: int
    world: int
    device: torch.device
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    val_share: torch.Tensor  # the indices of this worker's share of the validation set
    net: nn.Module  # the model itself: validation and checkpoints
    model: nn.Module  # what trains: `net` on the device, wrapped in DDP when world > 1
    optimizer: torch.optim.Optimizer
    sampler: DistributedSampler[int]
    batch: int
    steps_per_epoch: int
    scheduler: torch.optim.lr_scheduler.LambdaLR
    amp: bool
    scaler: torch.amp.GradScaler
    criterion: nn.Module


def train_loop(config: dict) -> None:
    """Runs on every Ray Train worker."""
    w = _setup(config)
    start = _restore(w.net, w.optimizer, w.scheduler, w.scaler, w.device)
    if start and w.rank == 0:
        print(f"[rayflow] rank 0 resumed from the checkpoint of epoch {start}", flush=True)
    data, mlflow = config["data"], config.get("mlflow")

    for epoch in range(start + 1, config["epochs"] + 1):
        loss_sum, seconds = _train_epoch(w, epoch)
        metrics = _metrics(w, epoch, loss_sum, seconds)
        if w.rank == 0 and mlflow:
            log_step(mlflow["uri"], mlflow["run_id"], metrics, step=epoch)
        # e.g. "NVIDIA H100 80GB HBM3"
        name = torch.cuda.get_device_name(w.device) if w.device.type == "cuda" else w.device.type
        reported = {
            **metrics,
            "device": w.device.type,
            "device_name": name,
            "synthetic": data.synthetic,
        }
        _report(w, config, epoch, reported)


def _setup(config: dict) -> _Worker:
    """This worker's data (loaded to its device), model, shard of the training set, optimizer and
    schedule, as `config` says."""
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    data = config["data"]
    train_x, train_y, val_x, val_y = load_split(data, str(device))
    torch.manual_seed(data.seed)  # every replica starts from the same weights
    net = build_model(config["model"])
    model = ray.train.torch.prepare_model(net)  # to the device; DDP when world > 1
    optimizer = torch.optim.SGD(
        net.parameters(),
        lr=config["lr"],
        momentum=config["momentum"],
        weight_decay=config["weight_decay"],
    )
    # equal shards: DDP needs equal step counts
    sampler: DistributedSampler[int] = DistributedSampler(
        range(len(train_y)),  # it takes only the len() of its dataset
        num_replicas=world,
        rank=rank,
        shuffle=True,
        seed=data.seed,
        drop_last=True,
    )
    batch = config["batch_size"]
    steps_per_epoch = -(-len(sampler) // batch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(config, steps_per_epoch))
    amp = bool(config["amp"]) and device.type == "cuda"
    return _Worker(
        rank,
        world,
        device,
        train_x,
        train_y,
        val_x,
        val_y,
        torch.arange(rank, len(val_y), world),
        net,
        model,
        optimizer,
        sampler,
        batch,
        steps_per_epoch,
        scheduler,
        amp,
        torch.amp.GradScaler("cuda", enabled=amp),
        nn.CrossEntropyLoss(),
    )


def _train_epoch(w: _Worker, epoch: int) -> tuple[torch.Tensor, float]:
    """One epoch over this worker's shard: (the summed batch losses, on the device; seconds)."""
    w.sampler.set_epoch(epoch)
    w.model.train()
    began = time.perf_counter()
    loss_sum = torch.zeros((), dtype=torch.float64, device=w.device)
    for images, labels in iterate(
        w.train_x, w.train_y, w.batch, shuffle=False, indices=list(w.sampler)
    ):
        w.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(w.device.type, dtype=torch.float16, enabled=w.amp):
            loss = w.criterion(w.model(images), labels)
        w.scaler.scale(loss).backward()
        w.scaler.step(w.optimizer)
        w.scaler.update()
        w.scheduler.step()
        loss_sum += loss.detach()
    if w.device.type == "cuda":
        torch.cuda.synchronize()
    return loss_sum, time.perf_counter() - began


def _metrics(w: _Worker, epoch: int, loss_sum: torch.Tensor, seconds: float) -> dict[str, float]:
    """The epoch's metrics, the same on every worker: losses and accuracy summed across them."""
    import torch.distributed as dist

    # Validation on the unwrapped module: shards may differ by one batch, DDP must not sync
    # there.
    totals = torch.cat(
        [loss_sum.reshape(1), evaluate(w.net, w.val_x, w.val_y, w.val_share, w.criterion)]
    )
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals)
    loss_total, val_loss, correct, count = totals.tolist()
    return {
        "epoch": epoch,
        "train_loss": loss_total / (w.steps_per_epoch * w.world),
        "val_loss": val_loss / count,
        "val_accuracy": correct / count,
        "samples_per_s": len(w.sampler) * w.world / seconds,
        "step_time_s": seconds / w.steps_per_epoch,
        "lr": w.scheduler.get_last_lr()[0],
    }


def _report(w: _Worker, config: dict, epoch: int, reported: dict) -> None:
    """The epoch's report to Ray Train, with a checkpoint every `checkpoint_every` epochs and at
    the last."""
    import ray.train

    if epoch % config["checkpoint_every"] and epoch != config["epochs"]:
        ray.train.report(reported)
        return
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if w.rank == 0:  # one copy of the replicated state is enough
            _save(folder, epoch, w.net, w.optimizer, w.scheduler, w.scaler)
            checkpoint = ray.train.Checkpoint.from_directory(folder)
        ray.train.report(reported, checkpoint=checkpoint)


def loop_config(cfg, data, mlflow: dict | None = None) -> dict:
    """What every worker needs, as plain values (it is pickled to the workers)."""
    w = cfg.workload
    keys = (
        "model",
        "epochs",
        "batch_size",
        "lr",
        "momentum",
        "weight_decay",
        "lr_schedule",
        "warmup_epochs",
        "step_epochs",
        "gamma",
        "amp",
    )
    config = {k: w[k] for k in keys}
    return {
        **config,
        "checkpoint_every": int(w.checkpoint.every_epochs),
        "data": data,
        "mlflow": mlflow,
    }
