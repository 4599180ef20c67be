"""A Ray Train loop (TorchTrainer's train_loop_per_worker): data-parallel regression.

Every worker builds the same synthetic data set (fixed seed), trains on its own shard
(DistributedSampler), and the model is wrapped in DistributedDataParallel by
`prepare_model`, so gradients are averaged across workers (gloo on CPU, NCCL on GPU).
Each epoch all workers report {"epoch", "loss", "val_loss"}; rank 0 adds the checkpoint.
A restarted run (a worker died, or resume) continues from the latest checkpoint.
"""

import os
import tempfile

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_data(n=12000, features=16, seed=0):
    """y = a smooth nonlinear function of x plus noise; 20% held out for val_loss."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g) / features**0.5
    y = torch.sin(3 * x @ w) + 0.5 * (x[:, :1] * x[:, 1:2]) + 0.1 * torch.randn(n, 1, generator=g)
    split = int(0.8 * n)
    return TensorDataset(x[:split], y[:split]), TensorDataset(x[split:], y[split:])


def train_loop(config):
    epochs, lr = int(config.get("epochs", 5)), float(config.get("lr", 0.01))
    batch_size = int(config.get("batch_size", 64))  # per worker
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()

    torch.manual_seed(0)  # the same initial weights on every worker
    train_set, val_set = make_data()
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    model = nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:  # every worker loads the same state
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"]
    model = ray.train.torch.prepare_model(model)  # to the worker's device, DDP when world > 1
    device = ray.train.torch.get_device()

    for epoch in range(start, epochs):
        sampler.set_epoch(epoch)  # a different shuffle each epoch
        model.train()
        total = torch.zeros(2, device=device)  # summed loss, samples
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(x), torch.tensor(len(x), device=device)])
        if dist.is_initialized():  # the mean over every worker's shard
            dist.all_reduce(total)

        model.eval()
        with torch.no_grad():
            x, y = val_set.tensors
            val_loss = nn.functional.mse_loss(model(x.to(device)), y.to(device)).item()

        metrics = {"epoch": epoch + 1, "loss": (total[0] / total[1]).item(), "val_loss": val_loss}
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if rank == 0:
                state = {
                    "model": getattr(model, "module", model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch + 1,
                }
                torch.save(state, os.path.join(d, "state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(d)
            ray.train.report(metrics, checkpoint=checkpoint)
