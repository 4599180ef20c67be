"""workload=cifar's trial: the seed tutorial's CIFAR10 CNN trained in one Tune trial's process.

Each trial loads the data once (uint8 tensors, see rayflow.workloads.presets.cifar_data), trains
with SGD, and every epoch reports val_loss, val_accuracy and epoch with a checkpoint holding the
model and optimizer state. A restarted trial (FailureConfig.max_failures) or a resumed
experiment (resume=true) continues from the trial's last checkpoint.

The epoch body is train_epoch (with TrainStep) and evaluate, which scripts/bench_data.py
times as they are. At the seed's batch sizes the tiny CNN is bound by per-step host work,
so neither reads a value back per step (losses are summed on the device, one read per
epoch) and on CUDA the full-size batches replay a CUDA graph of forward, backward and
optimizer.step (see TrainStep); CPU training runs the plain eager step.

Only trials import this module, and torch with it: the trainable the driver hands to Tune,
rayflow.workloads.presets.cifar.train_cifar, imports it when it runs.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from rayflow.workloads.presets.cifar_data import DataSpec, iterate, load_split
from rayflow.workloads.presets.models import Net


def save_checkpoint(folder: str, net: nn.Module, optimizer, epoch: int) -> None:
    state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
    torch.save(state, os.path.join(folder, "checkpoint.pt"))


def read_checkpoint(path: str, device: str | torch.device = "cpu") -> dict:
    """A checkpoint as the presets save it (state dicts and an int epoch), read by torch's safe
    loader (weights_only=True): a checkpoint is read from storage others may write (a shared
    bucket, a resumed experiment), and one whose unpickling would run code is refused unrun."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as err:
        said = str(err).strip().splitlines()
        raise pickle.UnpicklingError(
            f"{path}: refused by torch's safe loader (weights_only=True), not a checkpoint of "
            f"tensors and numbers: {said[0] if said else type(err).__name__}"
        ) from None


def load_checkpoint(folder: str, net: nn.Module, optimizer, device: str = "cpu") -> int:
    """Restore model and optimizer state in place; returns the epoch the checkpoint ended."""
    state = read_checkpoint(os.path.join(folder, "checkpoint.pt"), device)
    net.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["epoch"])


GRAPH_ENV = "RAYFLOW_CUDA_GRAPH"  # "0" turns the CUDA-graph step off (eager steps on CUDA too)
GRAPH_WARMUP_STEPS = 3  # eager steps on a side stream before capture, as PyTorch's docs do


@dataclass
class Captured:
    """A step captured as a CUDA graph: the graph, the tensors it reads its batch from (the later
    batches are copied into them), and what it baked in (TrainStep._signature)."""

    graph: torch.cuda.CUDAGraph
    images: torch.Tensor
    labels: torch.Tensor
    signature: tuple[Any, ...]


class TrainStep:
    """One SGD step on a batch: zero_grad, forward, loss, backward, optimizer.step.

    Each batch's loss is added, on the device and in float64, to `loss_sum` (train_epoch
    reads it once per epoch), so no step waits for the device. On CUDA, batches of exactly
    `batch_size` replay a CUDA graph of the whole step: the first GRAPH_WARMUP_STEPS such
    batches run eagerly on a side stream (real steps of the epoch, which also create the
    momentum buffers), then the step is captured once, reading its batch from static
    tensors the later batches are copied into. The graph holds the parameters, gradients,
    optimizer state and hyperparameters as they were at capture; train_epoch calls
    `check()` first, which drops the graph (and re-captures) when the optimizer's state
    tensors or param_groups changed, e.g. after optimizer.load_state_dict. Other batch
    sizes (an epoch's last, smaller batch), CPU, RAYFLOW_CUDA_GRAPH=0 and a failed capture
    run the eager step.
    """

    def __init__(
        self, net: nn.Module, optimizer, criterion, batch_size: int, cuda_graph: bool | None = None
    ):
        self.net, self.optimizer, self.criterion = net, optimizer, criterion
        self.batch_size = int(batch_size)
        self.device = next(net.parameters()).device
        if cuda_graph is None:
            cuda_graph = os.environ.get(GRAPH_ENV, "1") != "0"
        self.use_graph = bool(cuda_graph) and self.device.type == "cuda"
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.captured: Captured | None = None
        self.warmed = 0

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        """The captured step's CUDA graph; None while the steps run eagerly."""
        return self.captured.graph if self.captured is not None else None

    def __call__(self, images, labels) -> None:
        if self.use_graph and len(labels) == self.batch_size:
            if self.captured is not None:
                self.captured.images.copy_(images)
                self.captured.labels.copy_(labels)
                self.captured.graph.replay()
                return
            if self.warmed < GRAPH_WARMUP_STEPS:
                self._side_stream_step(images, labels)
                self.warmed += 1
                return
            captured = self._capture(images, labels)
            if captured is not None:
                captured.graph.replay()  # capturing ran nothing: this batch's step
                return
        self._step(images, labels)

    def _step(self, images, labels) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.criterion(self.net(images), labels)
        loss.backward()
        self.optimizer.step()
        self.loss_sum.add_(loss.detach().double())

    def _side_stream_step(self, images, labels) -> None:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self._step(images, labels)
        current.wait_stream(side)

    def _signature(self) -> tuple[Any, ...]:
        """What the captured graph baked in: the tensors it reads and writes, the
        hyperparameters."""
        params = tuple(
            p.data_ptr() for group in self.optimizer.param_groups for p in group["params"]
        )
        state = tuple(
            (key, value.data_ptr() if torch.is_tensor(value) else value)
            for group in self.optimizer.param_groups
            for p in group["params"]
            for key, value in sorted(self.optimizer.state.get(p, {}).items())
        )
        hyper = tuple(
            tuple(sorted((k, repr(v)) for k, v in group.items() if k != "params"))
            for group in self.optimizer.param_groups
        )
        return params, state, hyper

    def _capture(self, images, labels) -> Captured | None:
        """Capture the step on this batch (the capture runs nothing); None where capture failed
        (the steps run eagerly from then on)."""
        static_images, static_labels = images.clone(), labels.clone()
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        # Broad on purpose: whatever the capture raises (an op CUDA graphs cannot hold, a driver's
        # limit), an eager step trains the same; the run must not end over a speed-up.
        try:
            with torch.cuda.graph(graph):
                loss = self.criterion(self.net(static_images), static_labels)
                loss.backward()
                self.optimizer.step()
                self.loss_sum.add_(loss.detach().double())
        except Exception as err:  # noqa: BLE001
            warnings.warn(
                f"CUDA graph capture of the training step failed, training eagerly: {err}",
                RuntimeWarning,
                stacklevel=1,  # the step's own event, not its caller's doing
            )
            self.use_graph = False
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.captured = Captured(graph, static_images, static_labels, self._signature())
        return self.captured

    def check(self) -> None:
        """Drop the graph if what it captured is no longer the optimizer's (the next full
        batches warm up and capture again)."""
        if self.captured is not None and self._signature() != self.captured.signature:
            self.captured = None
            self.warmed = 0


def train_epoch(step: TrainStep, train_x, train_y, generator) -> float:
    """One epoch of training batches (shuffled with `generator`); the mean of the batch losses."""
    step.net.train()
    step.check()
    step.loss_sum.zero_()
    steps = 0
    for images, labels in iterate(
        train_x, train_y, step.batch_size, shuffle=True, generator=generator
    ):
        step(images, labels)
        steps += 1
    return step.loss_sum.item() / max(steps, 1)


def evaluate(net: nn.Module, criterion, val_x, val_y, batch_size: int = 512) -> tuple[float, float]:
    """(val_loss, val_accuracy) over the validation tensors, in batches; one read at the end."""
    net.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=val_x.device)
    correct = torch.zeros((), dtype=torch.long, device=val_x.device)
    with torch.no_grad():
        for images, labels in iterate(val_x, val_y, batch_size, shuffle=False):
            outputs = net(images)
            loss_sum.add_(criterion(outputs, labels).double() * len(labels))
            correct.add_((outputs.argmax(1) == labels).sum())
    return loss_sum.item() / len(val_y), correct.item() / len(val_y)


def train(config: dict, data: DataSpec, max_epochs: int, want_gpu: bool) -> None:
    """One trial, in its process (cifar.train_cifar, the trainable, calls it there); reports and
    checkpoints every epoch."""
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
    # after the restore: see TrainStep
    step = TrainStep(net, optimizer, criterion, int(config["batch_size"]))

    for epoch in range(start + 1, max_epochs + 1):
        train_loss = train_epoch(step, train_x, train_y, generator)
        val_loss, val_accuracy = evaluate(net, criterion, val_x, val_y)
        metrics = {
            "epoch": epoch,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "device": device,
            "device_name": torch.cuda.get_device_name(device) if device == "cuda" else device,
            "synthetic": data.synthetic,
        }
        with tempfile.TemporaryDirectory() as folder:
            save_checkpoint(folder, net, optimizer, epoch)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
