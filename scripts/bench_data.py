"""bench.py data-pipeline and cifar-search: the CIFAR data path and the whole search, on a GPU.

data-pipeline: seconds per CIFAR10 epoch of the seed CNN (rayflow.workloads.presets.models.Net, l1=120, l2=84)
on one device, through two pipelines over the same python-batch files:

  rayflow  the workload's in-memory tensors: the batches read once into uint8 tensors on the
           device (rayflow.workloads.presets.cifar_data.load_split), each mini-batch indexed and normalised there
           (rayflow.workloads.presets.cifar_data.iterate); the epoch body is train_cifar's own code (workload=cifar:
           rayflow.workloads.presets.cifar_train.train_epoch with its TrainStep, then evaluate, validation
           in batches of 512): batch losses summed on the device and read once per epoch, and
           on CUDA the full-size batches replaying a CUDA graph of forward, backward and
           optimizer.step (the last, smaller batch eager).
  seed     the seed tutorial's: torchvision.datasets.CIFAR10 with ToTensor and
           Normalize((0.5,)*3, (0.5,)*3) per sample, an 80/20 random_split, DataLoaders with
           `--workers` (8) workers and shuffle for training, each batch copied to the device.

Both train with SGD(lr=0.001, momentum=0.9) at the same batch size; the seed side takes
loss.item() every step, as the tutorial does; an epoch is training on the 80% split plus validation on
the other 20%. The data is rayflow's synthetic set at the full CIFAR10 size (50,000 + 10,000
images) unless --cifar-root points at the real batches; the seed side reads the same
synthetic batches re-pickled with str keys, the way torchvision reads the official files
(see torchvision_copy), and skips only torchvision's md5 check of them. Each side runs --warmup epochs, then --epochs
timed ones; the median is reported (`ratio` = seed / rayflow; > 1 means rayflow is faster).
Then each side produces one more epoch of training batches on the device with no model at
all (`*_pipeline_s`, `pipeline_ratio`): the data path alone, without the training step both
share. torchvision is imported only for the seed side.

cifar-search: wall seconds of the whole `workload=cifar` search (`python -m rayflow`, default
8 trials x 10 epochs, ASHA) on this machine with --compute gpu (--gpu-per-trial 0.25: 4 trials
share a GPU) or --compute cpu; the synthetic set is written before the clock starts. The
CLI's own output goes to stderr; the JSON has the wall time and what the search did.
`--against FILE` (the JSON line of the other side's run) adds `ratio` = that wall / this wall.

--smoke runs both on a few hundred synthetic images: data-pipeline one warm-up and one timed
epoch of 320 + 64 images with 2 loader workers, cifar-search 1 trial of 1 epoch. Neither needs a
GPU with `--device cpu` / `--compute cpu`; without torchvision, data-pipeline's seed side cannot
run: `--rayflow-only` (its seed figures and ratios are then null).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import log, smoke_option

SEED_NORM = (0.5, 0.5, 0.5)
BATCH_DIR = "cifar-10-batches-py"
SEARCH_TIMEOUT_S = 7200  # cifar-search's default --timeout


def _data_spec(args):
    from rayflow.workloads.presets.cifar_data import DataSpec

    if args.cifar_root:  # the real CIFAR-10 batches under <root>/cifar-10-batches-py
        return DataSpec(root=str(Path(args.cifar_root).expanduser()), download=False)
    root = (
        Path(args.data_root).expanduser()
        if args.data_root
        else Path(tempfile.gettempdir()) / "rayflow-bench-data"
    )
    return DataSpec(
        root=str(root),
        synthetic=True,
        synthetic_train_size=args.train_size,
        synthetic_test_size=args.test_size,
    )


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rayflow_epochs(
    spec, device, batch_size: int, count: int
) -> tuple[list[float], list[float], float]:
    """(epoch seconds, training-only seconds, seconds of the pipeline alone for one epoch) of
    train_cifar's epoch body on `device`: rayflow.workloads.presets.cifar_train's train_epoch and evaluate,
    the functions the trainable calls."""
    import torch
    import torch.nn as nn

    from rayflow.workloads.presets.cifar_data import iterate, load_split
    from rayflow.workloads.presets.cifar_train import TrainStep, evaluate, train_epoch
    from rayflow.workloads.presets.models import Net

    start = time.perf_counter()
    train_x, train_y, val_x, val_y = load_split(spec, str(device))
    _sync(device)
    log(
        f"rayflow: data loaded onto {device} in {time.perf_counter() - start:.2f} s "
        f"({len(train_y)} train, {len(val_y)} val)"
    )
    torch.manual_seed(0)
    net = Net().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(0)
    step = TrainStep(net, optimizer, criterion, batch_size)
    epochs, trains = [], []
    for _ in range(count):
        began = time.perf_counter()
        train_loss = train_epoch(step, train_x, train_y, generator)
        _sync(device)
        trained = time.perf_counter()
        _, val_accuracy = evaluate(net, criterion, val_x, val_y)
        _sync(device)
        epochs.append(time.perf_counter() - began)
        trains.append(trained - began)
        log(
            f"rayflow epoch: {epochs[-1]:.3f} s (training {trains[-1]:.3f} s), train_loss {train_loss:.4f}, "
            f"val_accuracy {val_accuracy:.3f}, CUDA graph {'on' if step.graph is not None else 'off'}"
        )
    began = time.perf_counter()  # the pipeline alone: an epoch of training batches, no model
    for images, labels in iterate(train_x, train_y, batch_size, shuffle=True, generator=generator):
        pass
    _sync(device)
    pipeline = time.perf_counter() - began
    log(f"rayflow pipeline alone: {pipeline:.3f} s for an epoch of training batches")
    return epochs, trains, pipeline


def torchvision_copy(batch_dir: Path) -> Path:
    """The same batches with str keys, as torchvision's CIFAR10 reads them.

    The official files were pickled by Python 2, so under encoding="latin1" (torchvision's)
    their keys come back as str ("data", "labels", "label_names"); rayflow's synthetic set
    is pickled by Python 3 with bytes keys (what rayflow.workloads.presets.cifar_data reads with encoding="bytes").
    Same images and labels, same batch files; written once next to the original.
    """
    import pickle

    from rayflow.workloads.presets.cifar_data import TEST_FILE, TRAIN_FILES, read_batches

    target = batch_dir.parent / "torchvision-copy" / BATCH_DIR
    if (target / "batches.meta").is_file():
        return target
    tmp = target.with_name(BATCH_DIR + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for name in TRAIN_FILES + [TEST_FILE]:
        images, labels = read_batches(batch_dir, [name])
        with open(tmp / name, "wb") as f:
            pickle.dump({"data": images.reshape(len(labels), -1), "labels": labels.tolist()}, f)
    with open(batch_dir / "batches.meta", "rb") as f:
        meta = pickle.load(f, encoding="bytes")
    names = [
        n.decode() if isinstance(n, bytes) else n
        for n in meta.get(b"label_names", meta.get("label_names", []))
    ]
    with open(tmp / "batches.meta", "wb") as f:
        pickle.dump({"label_names": names}, f)
    tmp.replace(target)
    return target


def seed_epochs(
    batch_dir: Path, device, batch_size: int, workers: int, count: int
) -> tuple[list[float], list[float], float]:
    """(epoch seconds, training-only seconds, seconds of the pipeline alone for one epoch) of the
    seed tutorial's train_cifar epoch."""
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, random_split

    try:
        import torchvision
        import torchvision.transforms as transforms
    except Exception as err:  # noqa: BLE001 - any import failure means: no seed side here
        raise SystemExit(
            f"bench data-pipeline: the seed side needs torchvision, which does not import here ({type(err).__name__}: {err})"
        ) from None

    from rayflow.workloads.presets.models import Net

    class SeedCIFAR10(torchvision.datasets.CIFAR10):
        """torchvision's CIFAR10 as it is, but for its md5 checks of the official files (a
        synthetic set has other bytes); on the real batches the checks run."""

        def _check_integrity(self) -> bool:
            return not check_md5 or super()._check_integrity()

        def _load_meta(self) -> None:
            if check_md5:
                return super()._load_meta()
            import pickle

            with open(batch_dir / "batches.meta", "rb") as f:
                self.classes = pickle.load(f, encoding="latin1")["label_names"]
            self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    check_md5 = batch_dir.parent.name != "torchvision-copy"
    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize(SEED_NORM, SEED_NORM)]
    )
    trainset = SeedCIFAR10(
        root=str(batch_dir.parent), train=True, download=False, transform=transform
    )
    n_train = int(len(trainset) * 0.8)
    train_subset, val_subset = random_split(
        trainset, [n_train, len(trainset) - n_train], generator=torch.Generator().manual_seed(0)
    )
    trainloader = DataLoader(train_subset, batch_size=batch_size, shuffle=True, num_workers=workers)
    valloader = DataLoader(val_subset, batch_size=batch_size, shuffle=True, num_workers=workers)
    log(
        f"seed: torchvision {torchvision.__version__} CIFAR10 ({len(train_subset)} train, {len(val_subset)} val), {workers} workers"
    )
    torch.manual_seed(0)
    net = Net().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    epochs, trains = [], []
    for _ in range(count):
        began = time.perf_counter()
        net.train()
        running_loss = 0.0
        for inputs, labels in trainloader:
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = criterion(net(inputs), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
        _sync(device)
        trained = time.perf_counter()
        net.eval()
        correct, total = 0, 0
        with torch.no_grad():
            for inputs, labels in valloader:
                inputs, labels = inputs.to(device), labels.to(device)
                outputs = net(inputs)
                criterion(outputs, labels).cpu().numpy()
                correct += (outputs.argmax(1) == labels).sum().item()
                total += labels.size(0)
        _sync(device)
        epochs.append(time.perf_counter() - began)
        trains.append(trained - began)
        log(
            f"seed epoch: {epochs[-1]:.3f} s (training {trains[-1]:.3f} s), val_accuracy {correct / total:.3f}"
        )
    # the pipeline alone: an epoch of training batches on the device, no model
    began = time.perf_counter()
    for inputs, labels in trainloader:
        inputs, labels = inputs.to(device), labels.to(device)
    _sync(device)
    pipeline = time.perf_counter() - began
    log(f"seed pipeline alone: {pipeline:.3f} s for an epoch of training batches")
    return epochs, trains, pipeline


def device_label(device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def data_pipeline(args) -> dict:
    import torch

    from rayflow.workloads.presets.cifar_data import prepare

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "bench data-pipeline: --device cuda but torch sees no CUDA device (use --device cpu)"
        )
    device = torch.device(args.device)
    spec = _data_spec(args)
    began = time.perf_counter()
    batch_dir = prepare(spec)
    log(
        f"data: {'real CIFAR-10' if not spec.synthetic else 'synthetic CIFAR-format'} batches at {batch_dir} "
        f"(ready in {time.perf_counter() - began:.1f} s)"
    )
    count = args.warmup + args.epochs
    sides = ("rayflow",) if args.rayflow_only else ("rayflow", "seed")
    figures = {}
    for name in sides:
        if name == "rayflow":
            epochs, trains, pipeline = rayflow_epochs(spec, device, args.batch_size, count)
        else:
            seed_dir = torchvision_copy(batch_dir) if spec.synthetic else batch_dir
            epochs, trains, pipeline = seed_epochs(
                seed_dir, device, args.batch_size, args.workers, count
            )
        figures[name] = {
            "epoch_s": round(statistics.median(epochs[args.warmup :]), 4),
            "train_s": round(statistics.median(trains[args.warmup :]), 4),
            "epochs_s": [round(t, 4) for t in epochs],
            "pipeline_s": round(pipeline, 4),
        }
    result = {
        "name": "data-pipeline",
        "ratio": round(figures["seed"]["epoch_s"] / figures["rayflow"]["epoch_s"], 3)
        if "seed" in figures
        else None,
        "train_ratio": round(figures["seed"]["train_s"] / figures["rayflow"]["train_s"], 3)
        if "seed" in figures
        else None,
        "pipeline_ratio": round(figures["seed"]["pipeline_s"] / figures["rayflow"]["pipeline_s"], 2)
        if "seed" in figures
        else None,
        "rayflow_epoch_s": figures["rayflow"]["epoch_s"],
        "seed_epoch_s": figures.get("seed", {}).get("epoch_s"),
        "rayflow_train_s": figures["rayflow"]["train_s"],
        "seed_train_s": figures.get("seed", {}).get("train_s"),
        "rayflow_epochs_s": figures["rayflow"]["epochs_s"],
        "seed_epochs_s": figures.get("seed", {}).get("epochs_s"),
        "rayflow_pipeline_s": figures["rayflow"]["pipeline_s"],
        "seed_pipeline_s": figures.get("seed", {}).get("pipeline_s"),
        "batch_size": args.batch_size,
        "seed_loader_workers": args.workers,
        "warmup_epochs": args.warmup,
        "timed_epochs": args.epochs,
        "data": "real CIFAR-10"
        if not spec.synthetic
        else f"synthetic CIFAR-format ({spec.synthetic_train_size} + {spec.synthetic_test_size})",
        "device": device_label(device),
        "torch_version": torch.__version__,
        "cpu_count": os.cpu_count(),
    }
    return result


def data_pipeline_args(p) -> None:
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="both sides (the seed tutorial's loaders use the trial's)",
    )
    p.add_argument("--workers", type=int, default=8, help="the seed DataLoader's worker processes")
    p.add_argument("--warmup", type=int, default=1, help="untimed epochs first, on each side")
    p.add_argument(
        "--epochs", type=int, default=3, help="timed epochs on each side; the median is reported"
    )
    p.add_argument(
        "--train-size", type=int, default=50000, help="synthetic training images (CIFAR10: 50,000)"
    )
    p.add_argument(
        "--test-size", type=int, default=10000, help="synthetic test images (CIFAR10: 10,000)"
    )
    p.add_argument(
        "--data-root",
        help="where the synthetic set is written (default: a folder in $TMPDIR, reused)",
    )
    p.add_argument(
        "--cifar-root", help="use the real CIFAR-10 batches under this root instead (no download)"
    )
    p.add_argument(
        "--rayflow-only",
        action="store_true",
        help="time rayflow's side alone (no torchvision needed)",
    )
    smoke_option(p, warmup=1, epochs=1, train_size=320, test_size=64, workers=2)


def cifar_search(args) -> dict:
    from rayflow.workloads.presets.cifar_data import DataSpec, prepare

    work = Path(args.workdir or tempfile.mkdtemp(prefix="rayflow-bench-search-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data_root = (
        Path(args.data_root).expanduser()
        if args.data_root
        else Path(tempfile.gettempdir()) / "rayflow-bench-data"
    )
    prepare(
        DataSpec(
            root=str(data_root),
            synthetic=True,
            synthetic_train_size=args.train_size,
            synthetic_test_size=args.test_size,
        )
    )  # written once, before the clock starts
    overrides = [
        f"data.root={data_root}",
        "data.synthetic=true",
        f"data.synthetic_train_size={args.train_size}",
        f"data.synthetic_test_size={args.test_size}",
        f"workload.num_samples={args.samples}",
        f"workload.max_epochs={args.max_epochs}",
        f"compute={args.compute}",
        f"storage_path={work / 'ray_results'}",
        f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
    ]
    if args.compute == "gpu":
        overrides.append(f"workload.resources_per_trial.gpu={args.gpu_per_trial}")
    overrides += args.override
    argv = [sys.executable, "-m", "rayflow", *overrides]
    log("running: " + " ".join(argv))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("RAY_AUTH_MODE", "token")
    began = time.perf_counter()
    try:  # SIGTERM on timeout: the CLI stops its cluster before it exits
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, text=True)
        output, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        output, _ = proc.communicate(timeout=120)
        sys.stderr.write(output)
        raise SystemExit(
            f"bench cifar-search: python -m rayflow ran past {args.timeout:g} s"
        ) from None
    wall = time.perf_counter() - began
    sys.stderr.write(output)
    if proc.returncode != 0:
        raise SystemExit(f"bench cifar-search: python -m rayflow exited {proc.returncode}")
    used = re.search(r"trial-epochs used: (\d+) of (\d+)", output)
    trials = re.search(r"trials: (\d+) \((\d+) stopped early by ASHA, (\d+) errored\)", output)
    best = re.search(r"best val_accuracy\s+([0-9.]+)", output)
    device_name = None
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("cifar")
        runs = (
            client.search_runs([experiment.experiment_id], max_results=1000) if experiment else []
        )
        device_name = next(
            (r.data.tags["device_name"] for r in runs if "device_name" in r.data.tags), None
        )
    except Exception as err:  # noqa: BLE001 - the figure stands without the tag
        log(f"could not read the device name from MLflow: {err}")
    result = {
        "name": "cifar-search",
        "wall_s": round(wall, 2),
        "compute": args.compute,
        "gpu_per_trial": args.gpu_per_trial if args.compute == "gpu" else 0,
        "trials": int(trials.group(1)) if trials else None,
        "stopped_early": int(trials.group(2)) if trials else None,
        "errored": int(trials.group(3)) if trials else None,
        "trial_epochs": int(used.group(1)) if used else None,
        "budget_epochs": int(used.group(2)) if used else None,
        "best_val_accuracy": float(best.group(1)) if best else None,
        "device_name": device_name,
        "train_size": args.train_size,
        "test_size": args.test_size,
        "cpu_count": os.cpu_count(),
    }
    if result["trial_epochs"]:
        result["s_per_trial_epoch"] = round(wall / result["trial_epochs"], 3)
    if args.against:
        other = json.loads(Path(args.against).read_text().strip().splitlines()[-1])
        result["against"] = {
            k: other.get(k)
            for k in ("compute", "wall_s", "trial_epochs", "device_name", "cpu_count")
        }
        result["ratio"] = round(other["wall_s"] / wall, 3)
    return result


def cifar_search_args(p) -> None:
    p.add_argument("--compute", default="gpu", choices=("gpu", "cpu"))
    p.add_argument(
        "--gpu-per-trial",
        type=float,
        default=0.25,
        help="compute=gpu: trials sharing a GPU = 1 / this",
    )
    p.add_argument("--samples", type=int, default=8, help="workload.num_samples")
    p.add_argument("--max-epochs", type=int, default=10, help="workload.max_epochs")
    p.add_argument("--train-size", type=int, default=50000)
    p.add_argument("--test-size", type=int, default=10000)
    p.add_argument(
        "--data-root",
        help="where the synthetic set is written (default: a folder in $TMPDIR, reused)",
    )
    p.add_argument(
        "--workdir", help="storage and MLflow store of the run (default: a new temporary folder)"
    )
    p.add_argument(
        "--against",
        help="a file holding the other side's JSON line: adds ratio = its wall_s / this wall_s",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=SEARCH_TIMEOUT_S,
        help="seconds the search may take before it is stopped",
    )
    p.add_argument("override", nargs="*", help="more rayflow overrides (key=value)")
    smoke_option(p, samples=1, max_epochs=1, train_size=320, test_size=64)
