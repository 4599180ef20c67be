"""bench.py ddp-overhead: rayflow's Ray Train path against raw torch.distributed DDP.

Both sides train the same model on the same tensors (rayflow.workloads.presets.cifar_data.load_split of one
synthetic set) with the same per-worker batch, sampler, optimizer and lr schedule, on 2
CPU processes with gloo. What is compared is the steady-state step time: the median of
(training seconds of an epoch / its steps) over epochs 2.., so start-up (Ray Train's
worker group, process spawn, the first epoch's warm-up) is left out on both sides.
"""

from __future__ import annotations

import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

WORKERS = 2


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def loop_config(args, data) -> dict:
    """The ddp workload's worker config (the keys of conf/workload/ddp.yaml), as run by the CLI."""
    return {
        "model": args.model,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": 0.05,
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "lr_schedule": "cosine",
        "warmup_epochs": 0,
        "step_epochs": 3,
        "gamma": 0.1,
        "amp": False,
        "checkpoint_every": 1,
        "data": data,
        "mlflow": None,
    }


def steady(step_times: dict[int, float]) -> float:
    return statistics.median(t for epoch, t in step_times.items() if epoch >= 2)


def rayflow_epochs(config: dict, storage: Path) -> dict[int, float]:
    """Epoch -> step time through rayflow's TorchTrainer (ddp.make_trainer + ddp_loop.train_loop)."""
    from rayflow.workloads.presets.ddp import make_trainer

    spec = {
        "num_workers": WORKERS,
        "cpu": 1.0,
        "gpu": 0.0,
        "max_failures": 0,
        "keep_best": config["epochs"],
    }
    result = make_trainer(spec, config, name="ddp-bench", storage=str(storage)).fit()
    # Every epoch checkpoints and none is dropped, so every epoch's metrics are here.
    return {int(m["epoch"]): float(m["step_time_s"]) for _, m in result.best_checkpoints}


def _raw_worker(rank: int, config: dict, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    from rayflow.workloads.presets.cifar_data import iterate, load_split
    from rayflow.workloads.presets.ddp_loop import lr_factor
    from rayflow.workloads.presets.models import build_model

    torch.set_num_threads(1)  # what Ray Train gives a 1-CPU worker (OMP_NUM_THREADS=1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORKERS
    )
    data = config["data"]
    train_x, train_y, _, _ = load_split(data)
    torch.manual_seed(data.seed)
    net = build_model(config["model"])
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(
        net.parameters(),
        lr=config["lr"],
        momentum=config["momentum"],
        weight_decay=config["weight_decay"],
    )
    sampler = DistributedSampler(
        range(len(train_y)),
        num_replicas=WORKERS,
        rank=rank,
        shuffle=True,
        seed=data.seed,
        drop_last=True,
    )
    steps = -(-len(sampler) // config["batch_size"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(config, steps))
    criterion = torch.nn.CrossEntropyLoss()
    times = {}
    for epoch in range(1, config["epochs"] + 1):
        sampler.set_epoch(epoch)
        model.train()
        began = time.perf_counter()
        for images, labels in iterate(
            train_x, train_y, config["batch_size"], shuffle=False, indices=list(sampler)
        ):
            optimizer.zero_grad(set_to_none=True)
            criterion(model(images), labels).backward()
            optimizer.step()
            scheduler.step()
        times[epoch] = (time.perf_counter() - began) / steps
    if rank == 0:
        Path(out).write_text(repr(times))
    dist.destroy_process_group()


def raw_epochs(config: dict, storage: Path) -> dict[int, float]:
    """Epoch -> step time of plain DDP in 2 processes from torch.multiprocessing."""
    import ast

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = storage / "raw-times.txt"
    mp.spawn(_raw_worker, args=(config, port, str(out)), nprocs=WORKERS, join=True)
    return ast.literal_eval(out.read_text())


def ddp_overhead(args) -> dict:
    import ray

    from rayflow.workloads.presets.cifar_data import DataSpec, prepare

    tmp = Path(tempfile.mkdtemp(prefix="rayflow-bench-ddp-"))
    data = DataSpec(
        root=str(tmp / "data"),
        synthetic=True,
        synthetic_train_size=args.train_size,
        synthetic_test_size=max(100, args.train_size // 10),
    )
    prepare(data)
    config = loop_config(args, data)
    # One cluster for every rayflow run, started before any timing (Ray Train's cleanup of a
    # run's placement group goes through the dashboard's state API).
    ray.init(address="local", num_cpus=WORKERS, include_dashboard=True)
    runs: dict[str, list[float]] = {"rayflow": [], "raw": []}
    try:
        for rep in range(args.repeats):  # alternate, so drift on a noisy machine hits both
            for name, run in (("rayflow", rayflow_epochs), ("raw", raw_epochs)):
                storage = tmp / f"{name}-{rep}"
                storage.mkdir()
                runs[name].append(steady(run(config, storage)))
                log(f"repeat {rep + 1}/{args.repeats} {name}: {runs[name][-1] * 1000:.1f} ms/step")
    finally:
        ray.shutdown()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    step, raw = statistics.median(runs["rayflow"]), statistics.median(runs["raw"])
    return {
        "name": "ddp-overhead",
        "ratio": round(step / raw, 4),
        "rayflow_step_s": round(step, 5),
        "raw_step_s": round(raw, 5),
        "rayflow_runs_s": [round(t, 5) for t in runs["rayflow"]],
        "raw_runs_s": [round(t, 5) for t in runs["raw"]],
        "batch_size": args.batch_size,
        "workers": WORKERS,
        "epochs": args.epochs,
        "train_size": args.train_size,
        "model": args.model,
        "repeats": args.repeats,
        "ray_version": ray.__version__,
    }


def ddp_overhead_args(p) -> None:
    p.add_argument(
        "--repeats", type=int, default=3, help="runs of each path, alternating; medians compared"
    )
    p.add_argument("--epochs", type=int, default=4, help="epoch 1 is warm-up and not counted")
    p.add_argument("--batch-size", type=int, default=256, help="per worker")
    p.add_argument(
        "--train-size", type=int, default=20000, help="synthetic training images (80%% train)"
    )
    p.add_argument("--model", default="cnn", choices=("cnn", "resnet"))
