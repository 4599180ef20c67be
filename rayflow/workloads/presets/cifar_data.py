"""CIFAR-10 in its python-batch format, loaded once per process into uint8 tensors.

No torchvision and no per-sample PIL transforms: a trial reads the pickled batches once,
keeps them as uint8 tensors (on its device when that is a GPU), and normalises each
mini-batch on the device. Reused Tune actors keep the tensors across trials.
`synthetic=True` writes a small set in the same on-disk format, with a class signal a
CNN learns over several epochs (not in one: see write_synthetic), and reads it through the
same code: for offline machines and tests.

A batch is a pickle, and `pickle.load` runs whatever code a file names: anyone who can write
to `data.root` would run code in every trial. So batches are read by an unpickler that builds
only what the CIFAR format holds (dicts, lists, bytes, numbers, numpy arrays) and refuses any
other class or function by name, before calling it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import pickle
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rayflow.errors import DataError
from rayflow.runtime import progress, transfer
from rayflow.security.redaction import mask_text

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR_MD5 = "c58f30108f718f92721af3b95e74349a"
BATCH_DIR = "cifar-10-batches-py"
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_FILE = "test_batch"
NUM_CLASSES = 10

# The synthetic set's difficulty (grey levels of uint8 pixels). With these the seed CNN on 4000
# images goes from about 0.1 to 0.5 validation accuracy over 3 epochs at lr 0.003 (batch 64), from
# 0.6 to 0.9 at lr 0.01 (batch 32), and levels off near 0.9 (the random labels cap it); bump
# SYNTHETIC_VERSION when any of them, or the generator, changes.
SYNTHETIC_VERSION = 3
SYNTHETIC_PAIR_AMPLITUDE = 100.0  # the pattern two classes share
SYNTHETIC_CLASS_AMPLITUDE = 40.0  # the pattern of one class alone
SYNTHETIC_CLUTTER_SD = 50.0  # per-image 8x8 clutter: makes classes overlap
SYNTHETIC_PIXEL_SD = 30.0  # per-pixel noise
SYNTHETIC_LABEL_NOISE = 0.1  # share of labels drawn at random


@dataclass(frozen=True)
class DataSpec:
    """The `data:` config section as a small picklable value trials receive."""

    root: str
    download: bool = True
    synthetic: bool = False
    synthetic_train_size: int = 4000
    synthetic_test_size: int = 1000
    val_fraction: float = 0.2
    seed: int = 0
    url: str = CIFAR_URL
    md5: str = CIFAR_MD5
    timeout_s: float = 600.0  # a stalled download, and the wait for another process's download

    @classmethod
    def from_config(cls, data, seed: int = 0) -> DataSpec:
        return cls(
            root=str(Path(str(data.root)).expanduser()),
            download=bool(data.download),
            synthetic=bool(data.synthetic),
            synthetic_train_size=int(data.synthetic_train_size),
            synthetic_test_size=int(data.synthetic_test_size),
            val_fraction=float(data.val_fraction),
            seed=int(seed),
            url=str(data.get("url") or CIFAR_URL),
            md5=str(data.get("md5") or CIFAR_MD5),
            timeout_s=float(data.get("timeout_s") or 600.0),
        )

    @property
    def batch_dir(self) -> Path:
        if self.synthetic:
            # The version is in the name: a set written by an older generator under the same root
            # is not reused (it would show the old, trivially solved learning curves).
            name = (
                f"synthetic-v{SYNTHETIC_VERSION}-{self.synthetic_train_size}-"
                f"{self.synthetic_test_size}-seed{self.seed}"
            )
            return Path(self.root) / name / BATCH_DIR
        return Path(self.root) / BATCH_DIR


def spec(cfg) -> DataSpec:
    """The data set a run of cifar or ddp reads: its `data:` section
    (conf/workload/data/cifar10.yaml) and seed."""
    return DataSpec.from_config(cfg.data, seed=int(cfg.seed))


def tags(cfg) -> dict[str, str]:
    """For the run's MLflow parent run: whether its numbers come from the synthetic set."""
    return {"synthetic": str(bool(cfg.data.synthetic)).lower()}


def prepare_run(cfg, here: bool) -> None:
    """Before the cluster starts: say when the set is synthetic, and where the trials read this
    machine's files (`here`) make it now, so missing data fails before anything starts."""
    data = spec(cfg)
    if data.synthetic:
        print(
            "[rayflow] data: SYNTHETIC CIFAR-format set (data.synthetic=true) under "
            f"{data.batch_dir}",
            flush=True,
        )
    if here:
        prepare(data)


def _complete(batch_dir: Path) -> bool:
    return all((batch_dir / f).is_file() for f in TRAIN_FILES + [TEST_FILE])


@contextlib.contextmanager
def _lock(root: Path, timeout_s: float):
    """The node's data lock; waiting longer than timeout_s for it is an error, not a hang."""
    from filelock import FileLock, Timeout

    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / ".rayflow.lock"))
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:  # another process prepares the data: say so once, then wait for it
            progress.note(f"waiting for another process preparing the data under {root}", "data")
            lock.acquire(timeout=timeout_s)
    except Timeout:
        raise DataError(
            f"data.timeout_s: waited {timeout_s:g} s for another process preparing the data under "
            f"{root} (lock {lock.lock_file})"
        ) from None
    try:
        yield
    finally:
        lock.release()


def prepare(spec: DataSpec) -> Path:
    """Make sure the batches exist on this node (download or synthesise once), return their
    folder."""
    batch_dir = spec.batch_dir
    if _complete(batch_dir):
        return batch_dir
    # concurrent trials on a node: one fetches, the others wait
    with _lock(Path(spec.root), spec.timeout_s):
        if not _complete(batch_dir):
            if spec.synthetic:
                write_synthetic(
                    batch_dir, spec.synthetic_train_size, spec.synthetic_test_size, spec.seed
                )
            elif spec.download:
                download(Path(spec.root), spec.url, spec.md5, spec.timeout_s)
            else:
                raise DataError(
                    f"data.root: no CIFAR-10 batches under {batch_dir}; "
                    "set data.download=true, or data.synthetic=true to run offline"
                )
    return batch_dir


def download(
    root: Path, url: str = CIFAR_URL, md5: str = CIFAR_MD5, timeout_s: float = 600.0
) -> None:
    """Fetch the official archive, check its md5, unpack it under root (caller holds the lock).
    timeout_s bounds each connect and read, so a server that stops sending ends the wait.
    Shows bytes, rate and time left on a terminal; one line on any other stderr."""
    shown = mask_text(url)
    name = Path(urllib.parse.urlsplit(url).path).name or "cifar-10-python.tar.gz"
    with (
        tempfile.TemporaryDirectory(dir=root) as tmp,
        transfer.Transfer(f"downloading {name}", "data") as bar,
    ):
        archive = Path(tmp) / "cifar-10-python.tar.gz"
        digest = hashlib.md5()
        try:
            with (
                urllib.request.urlopen(url, timeout=timeout_s) as response,
                open(archive, "wb") as out,
            ):
                bar.expect(int(response.headers.get("Content-Length") or 0))
                while chunk := response.read(1 << 16):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        except OSError as err:
            raise DataError(
                f"data.download: could not fetch {shown} ({mask_text(str(err))}; "
                f"data.timeout_s={timeout_s:g}); set data.synthetic=true to run offline"
            ) from None
        bar.finished()
        if digest.hexdigest() != md5:
            raise DataError(
                f"data.download: {shown} has md5 {digest.hexdigest()}, expected {md5}; not unpacked"
            )
        bar.status("md5 ok, unpacking")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        target = root / BATCH_DIR
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(str(Path(tmp) / BATCH_DIR), str(target))
        bar.done(f"downloaded {name} from {shown} ({bar.summary()}), md5 ok, unpacked")


def write_synthetic(batch_dir: Path, train_size: int, test_size: int, seed: int) -> None:
    """Write CIFAR-format batches whose classes a small CNN learns over several epochs, not one:
    a first run solved in one epoch (loss 0, accuracy 1) looks like leakage, not training."""
    rng = np.random.default_rng(seed)
    prototypes = _class_prototypes(rng)

    def make(n: int) -> dict:
        labels = rng.integers(0, NUM_CLASSES, size=n)
        # Per-image clutter at the prototypes' own 8x8 scale: pooling cannot average it away,
        # so classes overlap and it takes the seed CNN epochs, not steps, to tell them apart.
        coarse = prototypes[labels] + rng.normal(0, SYNTHETIC_CLUTTER_SD, size=(n, 3, 8, 8))
        images = (
            128
            + coarse.repeat(4, axis=2).repeat(4, axis=3)
            + rng.normal(0, SYNTHETIC_PIXEL_SD, size=(n, 3, 32, 32))
        )
        # Some labels drawn at random, as in real data: no model reaches loss 0 on the validation
        # split.
        noisy = rng.random(n) < SYNTHETIC_LABEL_NOISE
        labels = np.where(noisy, rng.integers(0, NUM_CLASSES, size=n), labels)
        data = np.clip(images, 0, 255).astype(np.uint8).reshape(n, 3072)
        return {b"data": data, b"labels": labels.tolist()}

    tmp = batch_dir.with_name(batch_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    parts = np.array_split(np.arange(train_size), len(TRAIN_FILES))
    for name, size in zip(TRAIN_FILES, parts, strict=True):
        _dump(tmp / name, make(len(size)))
    _dump(tmp / TEST_FILE, make(test_size))
    _dump(
        tmp / "batches.meta", {b"label_names": [f"class{i}".encode() for i in range(NUM_CLASSES)]}
    )
    tmp.replace(batch_dir)  # readers never see a half-written folder


def _class_prototypes(rng) -> np.ndarray:
    """One smooth 8x8 colour pattern per class, as offsets from grey: classes come in pairs that
    share a strong pattern (told apart from the others in the first epoch) and differ by a weak
    one (told apart from each other over the next epochs), so accuracy rises epoch by epoch."""
    pairs = rng.uniform(
        -SYNTHETIC_PAIR_AMPLITUDE, SYNTHETIC_PAIR_AMPLITUDE, size=(NUM_CLASSES // 2, 3, 8, 8)
    )
    own = rng.uniform(
        -SYNTHETIC_CLASS_AMPLITUDE, SYNTHETIC_CLASS_AMPLITUDE, size=(NUM_CLASSES, 3, 8, 8)
    )
    return pairs.repeat(2, axis=0) + own


def _dump(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=4)


# What a CIFAR-10 python batch names (pickled by Python 2's numpy, or by rayflow's write_synthetic
# under numpy 1 or 2): building numpy arrays and bytes. Nothing here runs code a file chooses.
_NUMPY_CORE = (
    "numpy.core.multiarray",
    "numpy._core.multiarray",
    "numpy.core.numeric",
    "numpy._core.numeric",
)
BATCH_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
    *((module, "_reconstruct") for module in _NUMPY_CORE[:2]),
    *((module, "_frombuffer") for module in _NUMPY_CORE[2:]),
}


class BatchUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR batch and nothing else: any other global is refused by name, unloaded."""

    def find_class(self, module: str, name: str):
        if (module, name) not in BATCH_GLOBALS:
            raise pickle.UnpicklingError(
                f"it names {module}.{name}, which a CIFAR-10 batch never holds"
            )
        if module.startswith("numpy.core."):  # numpy 1's path in older pickles; numpy 2 warns on it
            module = (
                module.replace("numpy.core.", "numpy._core.") if hasattr(np, "_core") else module
            )
        return super().find_class(module, name)


def load_batch(path: Path) -> dict:
    """One CIFAR batch file as its dict, or DataError in one line (a file that is no CIFAR batch,
    or one that asks to run code, is refused before anything in it runs)."""
    try:
        with open(path, "rb") as f:
            batch = BatchUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as err:
        raise DataError(
            f"data.root: {path} is not a CIFAR-10 batch pickle ({type(err).__name__}: {err}); not "
            "loaded: remove it or point data.root elsewhere"
        ) from None
    if not isinstance(batch, dict) or not {b"data", b"labels"} <= set(batch):
        raise DataError(
            f"data.root: {path} is not a CIFAR-10 batch (no data and labels); not loaded: remove "
            "it or point data.root elsewhere"
        )
    return batch


def read_batches(batch_dir: Path, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for name in names:
        batch = load_batch(batch_dir / name)
        images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels.append(np.asarray(batch[b"labels"], dtype=np.int64))
    return np.concatenate(images), np.concatenate(labels)


def load_split(spec: DataSpec, device: str = "cpu"):
    """(train_x, train_y, val_x, val_y) as tensors on `device`, uint8 images; cached per process."""
    return _split(spec, device)


@functools.lru_cache(maxsize=1)  # one data set per process: a reused actor never holds two
def _split(spec: DataSpec, device: str):
    import torch

    images, labels = read_batches(prepare(spec), TRAIN_FILES)
    order = np.random.default_rng(spec.seed).permutation(len(labels))
    n_val = max(1, int(len(labels) * spec.val_fraction))
    val, train = order[:n_val], order[n_val:]
    return tuple(
        torch.from_numpy(a).to(device)
        for a in (images[train], labels[train], images[val], labels[val])
    )


def normalize(images):
    """uint8 [0, 255] -> float [-1, 1]: the seed tutorial's ToTensor + Normalize(0.5, 0.5)."""
    return images.float().div_(127.5).sub_(1.0)


def iterate(images, labels, batch_size: int, shuffle: bool, generator=None, indices=None):
    """Mini-batches (normalised float images, labels), indexed straight from the tensors.

    `indices` (e.g. one worker's shard from a DistributedSampler) picks and orders the
    samples instead of `shuffle`.
    """
    import torch

    n = len(labels)
    if indices is not None:
        order = torch.as_tensor(indices, dtype=torch.long).to(images.device)
    elif shuffle:
        order = torch.randperm(n, generator=generator).to(images.device)
    else:
        order = torch.arange(n, device=images.device)
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        yield normalize(images[index]), labels[index]
