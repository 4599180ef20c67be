"""The CIFAR workload's pieces: the seed CNN, its search space, the checkpoint round trip."""

from __future__ import annotations

import torch

from rayflow.orchestrator.compose import compose_config
from rayflow.workloads.presets import cifar, cifar_train


def test_net_is_the_seed_cnn():
    net = cifar_train.Net(l1=32, l2=16)
    assert (net.conv1.in_channels, net.conv1.out_channels, net.conv1.kernel_size) == (3, 6, (5, 5))
    assert (net.conv2.in_channels, net.conv2.out_channels) == (6, 16)
    assert (
        net.fc1.in_features,
        net.fc1.out_features,
        net.fc2.out_features,
        net.fc3.out_features,
    ) == (400, 32, 16, 10)
    assert net(torch.zeros(4, 3, 32, 32)).shape == (4, 10)


def test_search_space_follows_the_config():
    from ray.tune.search.sample import Categorical, Float

    cfg = compose_config(
        "workload.search_space.l1.min=16",
        "workload.search_space.l1.max=64",
        "workload.search_space.batch_size=[8,16]",
    )
    space = cifar.search_space(cfg.workload)
    assert isinstance(space["l1"], Categorical) and space["l1"].categories == [16, 32, 64]
    assert space["l2"].categories == [4, 8, 16, 32, 64, 128, 256]
    assert isinstance(space["lr"], Float) and (space["lr"].lower, space["lr"].upper) == (1e-4, 1e-1)
    assert space["batch_size"].categories == [8, 16]


def test_checkpoint_round_trip_restores_model_and_optimizer(tmp_path):
    torch.manual_seed(0)
    net = cifar_train.Net(8, 8)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    images, labels = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    for _ in range(2):  # momentum buffers become non-trivial state
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(images), labels).backward()
        optimizer.step()
    cifar_train.save_checkpoint(str(tmp_path), net, optimizer, epoch=3)

    restored = cifar_train.Net(8, 8)
    restored_optimizer = torch.optim.SGD(restored.parameters(), lr=0.5, momentum=0.0)
    assert cifar_train.load_checkpoint(str(tmp_path), restored, restored_optimizer) == 3
    for a, b in zip(net.state_dict().values(), restored.state_dict().values()):
        assert torch.equal(a, b)
    assert restored_optimizer.param_groups[0]["lr"] == 0.1
    buffers = [restored_optimizer.state[p]["momentum_buffer"] for p in restored.parameters()]
    expected = [optimizer.state[p]["momentum_buffer"] for p in net.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(buffers, expected))
    # the next step of the restored pair is the next step of the original
    for model, opt in ((net, optimizer), (restored, restored_optimizer)):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        opt.step()
    assert torch.equal(net.fc3.weight, restored.fc3.weight)


def _toy_split(n: int = 200, seed: int = 0):
    """uint8 CIFAR-shaped images with a class signal, int64 labels (n % 32 != 0: a short last batch)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    base = torch.randint(0, 256, (10, 3, 32, 32), generator=g)
    noise = torch.randint(-40, 41, (n, 3, 32, 32), generator=g)
    images = (base[labels] + noise).clamp(0, 255).to(torch.uint8)
    return images, labels


def _former_epoch(net, optimizer, criterion, images, labels, batch_size, generator):
    """train_cifar's epoch body as it was: loss.item() every step, then the val loop."""
    from rayflow.workloads.presets.cifar_data import iterate

    net.train()
    train_loss, steps = 0.0, 0
    for x, y in iterate(images, labels, batch_size, shuffle=True, generator=generator):
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(net(x), y)
        loss.backward()
        optimizer.step()
        train_loss += loss.item()
        steps += 1
    net.eval()
    val_loss, correct = 0.0, 0
    with torch.no_grad():
        for x, y in iterate(images, labels, 64, shuffle=False):
            outputs = net(x)
            val_loss += criterion(outputs, y).item() * len(y)
            correct += (outputs.argmax(1) == y).sum().item()
    return train_loss / steps, val_loss / len(labels), correct / len(labels)


def test_train_epoch_gives_the_former_loop_values_on_cpu():
    images, labels = _toy_split()
    criterion = torch.nn.CrossEntropyLoss()
    runs = []
    for refactored in (False, True):
        torch.manual_seed(0)
        net = cifar_train.Net(16, 8)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        generator = torch.Generator().manual_seed(0)
        step = cifar_train.TrainStep(net, optimizer, criterion, 32)
        assert not step.use_graph  # CPU: the eager step, always
        values = []
        for _ in range(2):
            if refactored:
                values.append(
                    (
                        cifar_train.train_epoch(step, images, labels, generator),
                        *cifar_train.evaluate(net, criterion, images, labels, batch_size=64),
                    )
                )
            else:
                values.append(
                    _former_epoch(net, optimizer, criterion, images, labels, 32, generator)
                )
        runs.append((values, [p.detach().clone() for p in net.parameters()]))
    (former, former_params), (new, new_params) = runs
    assert new == former  # the same floats: train_loss, val_loss, val_accuracy per epoch
    assert all(torch.equal(a, b) for a, b in zip(former_params, new_params))
    assert new[1][0] < new[0][0]


def test_train_epoch_continues_from_a_restored_checkpoint(tmp_path):
    images, labels = _toy_split()
    criterion = torch.nn.CrossEntropyLoss()

    def fresh():
        torch.manual_seed(0)
        net = cifar_train.Net(16, 8)
        return net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    net, optimizer = fresh()
    step = cifar_train.TrainStep(net, optimizer, criterion, 32)
    cifar_train.train_epoch(step, images, labels, torch.Generator().manual_seed(1))
    cifar_train.save_checkpoint(str(tmp_path), net, optimizer, epoch=1)
    expected = cifar_train.train_epoch(step, images, labels, torch.Generator().manual_seed(2))

    restored = cifar_train.Net(16, 8)
    restored_optimizer = torch.optim.SGD(restored.parameters(), lr=0.5, momentum=0.0)
    assert cifar_train.load_checkpoint(str(tmp_path), restored, restored_optimizer) == 1
    restored_step = cifar_train.TrainStep(restored, restored_optimizer, criterion, 32)
    assert (
        cifar_train.train_epoch(restored_step, images, labels, torch.Generator().manual_seed(2))
        == expected
    )
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), restored.parameters()))
