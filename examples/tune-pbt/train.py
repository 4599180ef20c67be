"""A Ray Tune objective: a small MLP classifier on synthetic data, one epoch per iteration.

Every iteration reports {"loss", "accuracy"} on a held-out set together with a checkpoint,
and a trial (re)starting from a checkpoint continues from it: Population Based Training
needs both to copy a good trial's weights into a weaker one (and to change its lr).

config: lr (required), width (32), batch_size (64), max_epochs (100), seed (0).
"""

import os
import tempfile

import numpy as np
import torch
from ray import tune
from torch import nn


def make_data(n=20000, features=8, seed=0):
    """Points labelled by a fixed random 'teacher' network, 2% of labels flipped: the same data
    in every trial and on every node."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    w1, w2 = rng.normal(size=(features, 8)), rng.normal(size=(8,))
    y = (np.tanh(x @ w1) @ w2 > 0).astype(np.int64)
    flip = rng.random(n) < 0.02
    y[flip] = 1 - y[flip]
    split = int(0.8 * n)
    return (
        torch.from_numpy(x[:split]),
        torch.from_numpy(y[:split]),
        torch.from_numpy(x[split:]),
        torch.from_numpy(y[split:]),
    )


def objective(config):
    torch.manual_seed(config.get("seed", 0))
    x_train, y_train, x_val, y_val = make_data()
    width = int(config.get("width", 32))
    model = nn.Sequential(
        nn.Linear(x_train.shape[1], width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 2),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    batch_size = int(config.get("batch_size", 64))

    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:  # a restart, or PBT handing this trial another trial's weights
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"]
    for group in optimizer.param_groups:  # PBT may have changed lr: the config wins
        group["lr"] = config["lr"]

    for epoch in range(start, int(config.get("max_epochs", 100))):
        model.train()
        for i in torch.randperm(len(x_train)).split(batch_size):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x_train[i]), y_train[i]).backward()
            optimizer.step()

        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            loss = nn.functional.cross_entropy(logits, y_val).item()
            accuracy = (logits.argmax(1) == y_val).float().mean().item()

        with tempfile.TemporaryDirectory() as d:
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch + 1,
                },
                os.path.join(d, "state.pt"),
            )
            tune.report(
                {"loss": loss, "accuracy": accuracy, "epoch": epoch + 1},
                checkpoint=tune.Checkpoint.from_directory(d),
            )
