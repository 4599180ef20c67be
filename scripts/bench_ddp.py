"""bench.py ddp-overhead: rayflow's Ray Train path against raw torch.distributed DDP.

rayflow's side is workload=ddp as `python -m rayflow workload=ddp compute=cpu` runs it: its keys
composed by Hydra and checked by the preflight (plan_job), the cluster backend=local starts for it
(rayflow.orchestrator.cluster.running, 2 CPUs), and the workload's own run (presets.ddp.run: its
TrainJob through workload=train's run_training, i.e. train_runner.trainer's TorchTrainer with
ddp_loop.train_loop on 2 workers); each epoch's step time is read from the reports the run keeps
(rayflow_epochs.jsonl). The raw side is plain DDP in 2 torch.multiprocessing processes.

Both sides train the same model on the same tensors (rayflow.workloads.presets.cifar_data.load_split of one
synthetic set) with the same per-worker batch, sampler, optimizer and lr schedule (the TrainJob's
train_loop_config), on 2 CPU processes with gloo. What is compared is the steady-state step time:
the median of (training seconds of an epoch / its steps) over epochs 2.., so start-up (Ray
Train's worker group, process spawn, the first epoch's warm-up) is left out on both sides.

--smoke: 2 epochs (epoch 1 is not counted) of 32 images per worker on 320 synthetic images, once.
"""

from __future__ import annotations

import socket
import statistics
import tempfile
import time
from pathlib import Path

from bench_common import log, smoke_option

WORKERS = 2
RAW_TIMEOUT_S = 3600  # the raw side's processes may take this long in all; then they are ended


def overrides(args, data_root: Path) -> list[str]:
    """workload=ddp on 2 CPU workers, every epoch checkpointed and every checkpoint kept, amp off
    (CPU training is float32 anyway), no restarts, no MLflow: the raw side has none of those."""
    return [
        "workload=ddp",
        "compute=cpu",
        "tracking=none",
        f"backend.num_cpus={WORKERS}",
        f"workload.num_workers={WORKERS}",
        f"workload.model={args.model}",
        f"workload.epochs={args.epochs}",
        f"workload.batch_size={args.batch_size}",
        "workload.amp=false",
        "workload.max_failures=0",
        "workload.checkpoint.every_epochs=1",
        f"workload.checkpoint.keep_best={args.epochs}",
        f"data.root={data_root}",
        "data.synthetic=true",
        f"data.synthetic_train_size={args.train_size}",
        f"data.synthetic_test_size={max(100, args.train_size // 10)}",
    ]


def steady(step_times: dict[int, float]) -> float:
    return statistics.median(t for epoch, t in step_times.items() if epoch >= 2)


def rayflow_epochs(plan, folder: Path) -> dict[int, float]:
    """Epoch -> step time of workload=ddp's own run (presets.ddp.run) in the experiment `folder`."""
    from rayflow.results.records import train_epochs
    from rayflow.tracking.tracker import Tracker
    from rayflow.workloads import RunContext

    folder.mkdir(parents=True)  # as the driver claims it before the workload runs
    context = RunContext(Tracker(plan.cfg), folder, resume=False, trial_slots=plan.trial_slots)
    summary = plan.workload.run(plan.cfg, context)
    if summary.errored or summary.interrupted:
        raise RuntimeError(f"bench ddp-overhead: the Ray Train run failed: {summary.error}")
    return {int(r["epoch"]): float(r["step_time_s"]) for r in train_epochs(folder)}


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
    processes = mp.spawn(_raw_worker, args=(config, port, str(out)), nprocs=WORKERS, join=False)
    deadline = time.monotonic() + RAW_TIMEOUT_S
    try:
        while not processes.join(timeout=5):  # raises the error of a process that failed
            if time.monotonic() > deadline:
                raise RuntimeError(f"bench ddp-overhead: raw DDP ran past {RAW_TIMEOUT_S} s")
    finally:
        for process in processes.processes:
            if process.is_alive():
                process.kill()
                process.join(10)
    return ast.literal_eval(out.read_text())


def ddp_overhead(args) -> dict:
    import shutil

    import ray

    from rayflow.orchestrator.cluster import running
    from rayflow.orchestrator.compose import compose_config
    from rayflow.orchestrator.preflight import plan_job
    from rayflow.workloads.presets.cifar_data import prepare, spec

    tmp = Path(tempfile.mkdtemp(prefix="rayflow-bench-ddp-"))
    runs: dict[str, list[float]] = {"rayflow": [], "raw": []}
    try:
        given = overrides(args, tmp / "data")
        plan = plan_job(compose_config(*given, f"storage_path={tmp}"), given)
        prepare(spec(plan.cfg))  # the data set both sides read, written before any timing
        # The TrainJob workload=ddp builds (presets.ddp.job): its train_loop_config is the raw
        # side's config too, so both train with the same keys.
        config = plan.workload.job(plan.cfg, None).config
        # One cluster for every rayflow run, started before any timing, as backend=local starts
        # it (with the dashboard, whose state API Ray Train's cleanup of a run's placement group asks).
        with running(plan.backend, plan.preload):
            for rep in range(args.repeats):  # alternate, so drift on a noisy machine hits both
                for name in ("rayflow", "raw"):
                    folder = tmp / f"{name}-{rep}"
                    if name == "rayflow":
                        times = rayflow_epochs(plan, folder)
                    else:
                        folder.mkdir()
                        times = raw_epochs(config, folder)
                    runs[name].append(steady(times))
                    log(
                        f"repeat {rep + 1}/{args.repeats} {name}: {runs[name][-1] * 1000:.1f} ms/step"
                    )
    finally:
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
    smoke_option(p, repeats=1, epochs=2, batch_size=32, train_size=320)
