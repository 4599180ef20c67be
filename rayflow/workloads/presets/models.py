"""The networks rayflow trains on CIFAR10-shaped input (3x32x32, 10 classes).

`cnn` is the seed tutorial's network (workload=cifar tunes its layer widths); `resnet`
is a small ResNet (three stages of basic residual blocks, about 0.7M parameters) that
keeps a GPU busy where the CNN would leave it idle.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("cnn", "resnet")


class Net(nn.Module):
    """conv(3,6,5) -> pool -> conv(6,16,5) -> pool -> fc(l1) -> fc(l2) -> fc(10)."""

    def __init__(self, l1: int = 120, l2: int = 84):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, l1)
        self.fc2 = nn.Linear(l1, l2)
        self.fc3 = nn.Linear(l2, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class BasicBlock(nn.Module):
    """Two 3x3 convs with batch norm and an identity (or 1x1 projection) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """stem 3x3 conv -> stages of width w, 2w, 4w (32, 16, 8 px) -> global pool -> fc(10)."""

    def __init__(self, width: int = 32, blocks_per_stage: int = 2):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        layers, cin = [], width
        for stage, cout in enumerate((width, 2 * width, 4 * width)):
            for block in range(blocks_per_stage):
                layers.append(BasicBlock(cin, cout, stride=2 if stage > 0 and block == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, 10)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model(name: str) -> nn.Module:
    if name == "cnn":
        return Net()
    if name == "resnet":
        return SmallResNet()
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
