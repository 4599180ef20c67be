"""The CIFAR-10 loader: the on-disk format, synthetic data, the md5-checked download under a lock."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from rayflow.errors import DataError
from rayflow.workloads.presets import cifar_data as data
from rayflow.workloads.presets import cifar_train
from rayflow.workloads.presets.cifar_data import DataSpec
from rayflow.workloads.presets.models import Net


def test_synthetic_files_have_the_cifar_format(tmp_path):
    spec = DataSpec(
        root=str(tmp_path), synthetic=True, synthetic_train_size=500, synthetic_test_size=50
    )
    folder = data.prepare(spec)
    assert folder.name == "cifar-10-batches-py"
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        "batches.meta",
        "data_batch_1",
        "data_batch_2",
        "data_batch_3",
        "data_batch_4",
        "data_batch_5",
        "test_batch",
    ]
    with open(folder / "data_batch_1", "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape == (100, 3072)
    assert len(batch[b"labels"]) == 100 and set(batch[b"labels"]) <= set(range(10))
    images, labels = data.read_batches(folder, [data.TEST_FILE])
    assert images.shape == (50, 3, 32, 32) and labels.shape == (50,)


def test_loader_splits_and_caches_uint8_tensors(tmp_path):
    spec = DataSpec(
        root=str(tmp_path),
        synthetic=True,
        synthetic_train_size=1000,
        synthetic_test_size=10,
        val_fraction=0.2,
    )
    train_x, train_y, val_x, val_y = data.load_split(spec)
    assert train_x.dtype == torch.uint8 and train_x.shape == (800, 3, 32, 32)
    assert val_x.shape == (200, 3, 32, 32) and train_y.dtype == torch.int64
    assert data.load_split(spec)[0] is train_x  # loaded once per process
    batches = list(
        data.iterate(
            train_x, train_y, 256, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
    )
    assert [len(y) for _, y in batches] == [256, 256, 256, 32]
    images = batches[0][0]
    assert images.dtype == torch.float32 and images.min() >= -1.0 and images.max() <= 1.0
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == sorted(train_y.tolist())


def test_normalize_matches_totensor_then_normalize_half():
    raw = torch.tensor([0, 51, 255], dtype=torch.uint8)
    expected = (raw.float() / 255 - 0.5) / 0.5
    assert torch.allclose(data.normalize(raw), expected)


def test_seed_cnn_learns_the_synthetic_set_over_epochs_not_in_one(tmp_path):
    """The seed CNN, trained in-process as a trial trains it (no Ray), on a 1600-image split:
    validation accuracy rises epoch by epoch from near chance and stays far from 1, the loss
    far from 0. A set solved in the first epoch (loss 0, accuracy 1) reads as leakage."""
    spec = DataSpec(
        root=str(tmp_path), synthetic=True, synthetic_train_size=2000, synthetic_test_size=10
    )
    train_x, train_y, val_x, val_y = data.load_split(spec)
    torch.manual_seed(0)
    net = Net()
    criterion = torch.nn.CrossEntropyLoss()
    step = cifar_train.TrainStep(
        net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9), criterion, 32
    )
    generator = torch.Generator().manual_seed(0)
    curve, threads = [], torch.get_num_threads()
    # a trial's one CPU; more threads on a busy machine take minutes, not seconds
    torch.set_num_threads(1)
    try:
        for _ in range(4):
            cifar_train.train_epoch(step, train_x, train_y, generator)
            curve.append(cifar_train.evaluate(net, criterion, val_x, val_y))
    finally:
        torch.set_num_threads(threads)
    losses, accuracies = [loss for loss, _ in curve], [acc for _, acc in curve]
    # learning, over epochs
    assert accuracies[0] < 0.4 and accuracies[-1] > accuracies[0] + 0.2, curve
    assert max(accuracies) < 0.95 and min(losses) > 0.5, curve  # not solved: no leakage look


def test_synthetic_set_is_the_same_for_a_seed_and_another_for_another_seed(tmp_path):
    def images(seed: int) -> np.ndarray:
        spec = DataSpec(
            root=str(tmp_path),
            synthetic=True,
            synthetic_train_size=50,
            synthetic_test_size=10,
            seed=seed,
        )
        return data.read_batches(data.prepare(spec), data.TRAIN_FILES)

    (a, labels_a), (b, labels_b), (c, _) = images(0), images(0), images(1)
    assert np.array_equal(a, b) and np.array_equal(labels_a, labels_b)
    assert not np.array_equal(a, c)


def test_a_synthetic_set_from_an_older_generator_is_not_reused(tmp_path):
    """An older rayflow wrote its (trivially solved) synthetic set under the same data.root:
    the current generator's set is written beside it and read, not the old one."""
    spec = DataSpec(
        root=str(tmp_path), synthetic=True, synthetic_train_size=50, synthetic_test_size=10
    )
    old = tmp_path / "synthetic-50-10-seed0" / data.BATCH_DIR  # the former folder name
    old.mkdir(parents=True)
    for name in data.TRAIN_FILES + [data.TEST_FILE]:
        (old / name).write_bytes(
            pickle.dumps({b"data": np.zeros((10, 3072), np.uint8), b"labels": [0] * 10})
        )
    folder = data.prepare(spec)
    assert folder != old
    images, _ = data.read_batches(folder, data.TRAIN_FILES)
    assert images.shape == (50, 3, 32, 32) and images.any()


def test_missing_data_without_download_names_the_keys(tmp_path):
    with pytest.raises(DataError, match="data.download=true"):
        data.prepare(DataSpec(root=str(tmp_path), download=False))


def test_download_checks_md5_and_unpacks(tmp_path, archive_server):
    url, md5, _ = archive_server
    with pytest.raises(DataError, match="md5"):
        data.prepare(DataSpec(root=str(tmp_path / "bad"), url=url, md5="0" * 32))
    assert not (tmp_path / "bad" / data.BATCH_DIR).exists()
    folder = data.prepare(DataSpec(root=str(tmp_path / "good"), url=url, md5=md5))
    images, _ = data.read_batches(folder, data.TRAIN_FILES)
    assert images.shape == (50, 3, 32, 32)


def test_unreachable_download_says_how_to_run_offline(tmp_path):
    with pytest.raises(DataError, match="data.synthetic=true"):
        data.prepare(DataSpec(root=str(tmp_path), url="http://127.0.0.1:9/cifar-10-python.tar.gz"))


def test_concurrent_trials_download_once(tmp_path, archive_server):
    """Four processes preparing the same root at once: one fetch, all four see the data."""
    url, md5, hits = archive_server
    script = (
        "import sys; from rayflow.workloads.presets import cifar_data as data\n"
        "print(data.prepare(data.DataSpec(root=sys.argv[3], url=sys.argv[1], md5=sys.argv[2])))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, url, md5, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outputs)) == 1 and outputs[0].endswith(data.BATCH_DIR)
    assert len(hits) == 1


def test_batches_pickled_by_python2_numpy_still_load(tmp_path):
    """The official archive's batches (Python 2's cPickle, numpy 1's `numpy.core` paths, str
    keys read as bytes) pass the loader's allow-list of what a CIFAR batch holds."""
    batch = {
        b"batch_label": b"training batch 1 of 5",
        b"labels": [3, 7],
        b"data": np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072),
        b"filenames": [b"a.png", b"b.png"],
    }
    old = pickle.dumps(batch, protocol=2).replace(
        b"numpy._core.multiarray", b"numpy.core.multiarray"
    )
    assert b"numpy.core.multiarray" in old
    (tmp_path / "data_batch_1").write_bytes(old)
    images, labels = data.read_batches(tmp_path, ["data_batch_1"])
    assert images.shape == (2, 3, 32, 32) and labels.tolist() == [3, 7]
