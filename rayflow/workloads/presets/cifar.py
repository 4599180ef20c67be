"""workload=cifar: Ray Tune + ASHA over the seed tutorial's CIFAR10 CNN, a checkpoint per epoch.

Each trial loads the data once (uint8 tensors, see rayflow.workloads.presets.cifar_data), trains
with SGD, and every epoch reports val_loss, val_accuracy and epoch with a checkpoint holding the
model and optimizer state. A restarted trial (FailureConfig.max_failures) or a resumed
experiment (resume=true) continues from the trial's last checkpoint.

The epoch body is train_epoch (with TrainStep) and evaluate, which scripts/bench_data.py
times as they are. At the seed's batch sizes the tiny CNN is bound by per-step host work,
so neither reads a value back per step (losses are summed on the device, one read per
epoch) and on CUDA the full-size batches replay a CUDA graph of forward, backward and
optimizer.step (see TrainStep); CPU training runs the plain eager step.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from rayflow.runtime.placement import Bundle, section_bundle
from rayflow.workloads.presets import cifar_data
from rayflow.workloads.presets.cifar_data import DataSpec, iterate, load_split
from rayflow.workloads.presets.models import Net

# a preset of workload=tune: conf/workload/cifar.yaml names train_cifar as its trainable
KIND = "tune"
METRICS = ("val_loss", "val_accuracy", "train_loss", "epoch")


def prepare(cfg, here: bool) -> None:
    """The CIFAR-format data set (conf/workload/data/cifar10.yaml), made or fetched here before the
    cluster starts."""
    cifar_data.prepare_run(cfg, here)


def worker_imports(cfg) -> tuple[str, ...]:
    # none preloaded (rayflow.workloads.Workload): a trial imports torch in about a second
    return ()


def metrics(cfg) -> dict[str, str]:
    return {m: m for m in METRICS}


def params(cfg) -> None:
    return None


def powers_of_two(low: int, high: int) -> list[int]:
    return [2**i for i in range(0, 31) if low <= 2**i <= high]


def check(cfg) -> None:
    """Every key of workload=cifar is checked by its schema
    (rayflow.workloads.presets.keys.Cifar)."""


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


def scheduler_keys(w) -> dict:
    """ASHA over epochs, in workload=tune's scheduler vocabulary."""
    return {
        "name": "asha",
        "time_attr": "epoch",
        "max_t": int(w.max_epochs),
        "grace_period": int(w.scheduler.grace_period),
        "reduction_factor": int(w.scheduler.reduction_factor),
    }


def job(cfg, ctx):
    """workload=cifar's keys as the TuneJob workload=tune runs (rayflow.workloads.tune)."""
    from ray import tune

    from rayflow.runtime.progress import tune_verbose
    from rayflow.workloads import user_code
    from rayflow.workloads.tune import resources
    from rayflow.workloads.tune_runner import TuneJob
    from rayflow.workloads.tune_search import make_scheduler

    w = cfg.workload
    gpus = float(w.resources_per_trial.gpu or 0)
    fn = user_code.load(w.trainable, "workload.trainable")
    return TuneJob(
        trainable=tune.with_parameters(
            fn, data=cifar_data.spec(cfg), max_epochs=int(w.max_epochs), want_gpu=gpus > 0
        ),
        param_space=search_space(w),
        metric=str(w.metric),
        mode=str(w.mode),
        num_samples=int(w.num_samples),
        resources=resources(w.resources_per_trial),
        scheduler=make_scheduler(scheduler_keys(w), str(w.metric), str(w.mode)),
        max_failures=int(w.max_failures),
        checkpoints_to_keep=w.checkpoints_to_keep,
        reuse_actors=bool(w.reuse_actors),
        time_attr="epoch",
        max_t=int(w.max_epochs),
        scheduler_label="ASHA",
        shown_metrics=("val_accuracy", "val_loss"),
        verbose=tune_verbose(cfg.get("verbose")),  # Tune's tables only when `verbose` asks
    )


def run(cfg, ctx):
    """Tune the CNN with ASHA on the connected cluster; returns a TuneSummary."""
    from rayflow.workloads.tune import run_job

    ctx.tracker.set_tags(cifar_data.tags(cfg))
    return run_job(job(cfg, ctx), ctx, metrics(cfg))


def figures(cfg, experiment_dir):
    from rayflow.results.plots import tune_figures
    from rayflow.workloads.tune import progress

    w = cfg.workload
    _, time_attr, max_t, rungs = progress(scheduler_keys(w), None)
    return tune_figures(experiment_dir, str(w.metric), str(w.mode), time_attr, max_t, rungs, "ASHA")
