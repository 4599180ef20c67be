"""GPU smoke test behind scripts/gpu_smoke.sh: every workload briefly with compute=gpu on the
local backend, checked from the outside (exit code, checkpoints on disk, runs in MLflow).

  cifar  2 trials x 1 epoch sharing one GPU (workload.resources_per_trial.gpu=0.5)
  ddp    1 GPU worker (NCCL) x 1 epoch with AMP, the small ResNet
  ppo    3 iterations of PPO with the learner on the GPU

For each: `python -m rayflow` exits 0; the trials or workers report the GPU's model
(torch.cuda.get_device_name in their own process, the MLflow tag `device_name`) on every
trial run and on the parent; checkpoints are on disk; MLflow has the parent and nested runs,
finished, with their metrics. A table (workload, GPU model, wall time, result) goes to stdout;
the exit code is 0 when everything passed, 1 when anything failed, 2 when nothing could run
(no CUDA device, rayflow not installed) with one line saying why.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOADS = {
    "cifar": [
        "workload=cifar",
        "workload.num_samples=2",
        "workload.max_epochs=1",
        "workload.resources_per_trial.gpu=0.5",
    ],
    "ddp": [
        "workload=ddp",
        "workload.num_workers=1",
        "workload.epochs=1",
        "workload.amp=true",
        "workload.model=resnet",
    ],
    "ppo": [
        "workload=ppo",
        "workload.stop.iterations=3",
        "workload.train_batch_size=1000",
        "workload.checkpoint_every=1",
    ],
}
COMPUTE, DEVICE = "compute=gpu", "cuda"  # what every run asks for, and the parent's device tag then
READS_CIFAR = ("cifar", "ddp")  # the presets that bring the data set (`data.*`; others refuse it)
CHECKPOINTS = {
    "cifar": "cifar-*/*/checkpoint_*/checkpoint.pt",
    "ddp": "ddp-*/checkpoint_*/checkpoint.pt",
    "ppo": "ppo-*/PPO_*/checkpoint_*/algorithm_state.pkl",
}


def overrides(name: str, work: Path, folder: Path) -> list[str]:
    """The workload's command line: on this machine's GPU, its runs and store under `folder`,
    the synthetic CIFAR-format set under `work` for the presets that read it."""
    data = ["data.synthetic=true", f"data.root={work / 'data'}"] if name in READS_CIFAR else []
    return [
        *WORKLOADS[name],
        COMPUTE,
        "backend=local",
        *data,
        f"storage_path={folder / 'ray_results'}",
        f"tracking.uri=sqlite:///{folder / 'mlflow.db'}",
    ]


class Refused(Exception):
    """Nothing can run here: one line, exit 2."""


def preflight() -> str:
    """The GPU's model, or Refused saying why there is nothing to test."""
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - any failure to import torch means no GPU run
        raise Refused(f"torch does not import ({type(err).__name__}: {err})") from None
    if not torch.cuda.is_available():
        raise Refused(
            f"no CUDA device: torch {torch.__version__} sees none "
            f"(CUDA build: {torch.version.cuda or 'no'}); run it on a machine with an NVIDIA GPU"
        )
    for module in ("rayflow", "ray", "mlflow", "hydra"):
        try:
            __import__(module)
        except Exception as err:  # noqa: BLE001
            raise Refused(
                f"rayflow is not installed with its dependencies here ({type(err).__name__}: {err})"
            ) from None
    return torch.cuda.get_device_name(0)


def runs(db: Path, experiment: str):
    """(parent runs, nested runs) of an MLflow experiment in a SQLite store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return client, [], []
    every = client.search_runs([found.experiment_id], max_results=1000)
    parents = [r for r in every if "mlflow.parentRunId" not in r.data.tags]
    nested = [r for r in every if "mlflow.parentRunId" in r.data.tags]
    return client, parents, nested


def check(name: str, folder: Path, gpu: str, proc) -> list[str]:
    """What is wrong with one workload's run (empty: it passed), plus a note on what was seen."""
    problems: list[str] = []
    if proc.returncode != 0:
        tail = " | ".join(proc.stdout.strip().splitlines()[-3:])
        return [f"exit {proc.returncode}: {tail[-300:]}"]
    client, parents, nested = runs(folder / "mlflow.db", name)
    if len(parents) != 1:
        return [f"{len(parents)} parent runs in MLflow, expected 1"]
    parent = parents[0]
    if parent.info.status != "FINISHED":
        problems.append(f"parent run {parent.info.status}")
    if parent.data.tags.get("device") != DEVICE:
        problems.append(f"parent tag device={parent.data.tags.get('device')!r}")
    if gpu not in parent.data.tags.get("device_name", ""):
        problems.append(
            f"parent tag device_name={parent.data.tags.get('device_name')!r} lacks {gpu!r}"
        )
    expected = {"cifar": 2, "ddp": 1, "ppo": 1}[name]
    if len(nested) != expected:
        problems.append(f"{len(nested)} nested runs, expected {expected}")
    metric = {"cifar": "val_loss", "ddp": "val_accuracy", "ppo": "episode_return_mean"}[name]
    for run in nested:
        label = run.data.tags.get("mlflow.runName", run.info.run_id)
        if run.info.status != "FINISHED":
            problems.append(f"{label}: {run.info.status}")
        if gpu not in run.data.tags.get("device_name", ""):
            problems.append(
                f"{label}: device_name={run.data.tags.get('device_name')!r} lacks {gpu!r}"
            )
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, metric))
        want = [1, 2, 3] if name == "ppo" else [1]
        if steps != want:
            problems.append(f"{label}: {metric} at steps {steps}, expected {want}")
    if name == "cifar" and len(nested) == 2:  # both trials held the one GPU at once
        starts = [r.info.start_time for r in nested]
        ends = [r.info.end_time or 0 for r in nested]
        if not max(starts) < min(ends):
            problems.append("the two trials did not overlap in time (not sharing the GPU)")
    saved = sorted((folder / "ray_results").glob(CHECKPOINTS[name]))
    if len(saved) < expected:
        problems.append(
            f"{len(saved)} checkpoints ({CHECKPOINTS[name]}), expected at least {expected}"
        )
    return problems


def seen(name: str, folder: Path) -> str:
    saved = len(list((folder / "ray_results").glob(CHECKPOINTS[name])))
    return {
        "cifar": f"2 trials sharing 1 GPU, {saved} checkpoints",
        "ddp": f"1 NCCL worker, AMP, {saved} checkpoint(s)",
        "ppo": f"3 iterations, GPU learner, {saved} checkpoints",
    }[name]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu_smoke.sh", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--workloads", default="cifar,ddp,ppo", help="comma-separated, from cifar, ddp, ppo"
    )
    parser.add_argument(
        "--workdir",
        help="keep the runs (storage, MLflow stores, logs) here; default: a temporary folder, removed when all pass",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds each workload may take")
    args = parser.parse_args(argv)
    chosen = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown or not chosen:
        parser.error(f"--workloads: choose from {', '.join(WORKLOADS)}")
    try:
        gpu = preflight()
    except Refused as why:
        print(f"gpu_smoke: {why}", file=sys.stderr)
        return 2

    work = Path(args.workdir or tempfile.mkdtemp(prefix="rayflow-gpu-smoke-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0")
    env.pop("MLFLOW_TRACKING_URI", None)
    rows = []
    for name in chosen:
        folder = work / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        argv = [sys.executable, "-m", "rayflow", *overrides(name, work, folder)]
        print(f"[gpu_smoke] {name}: {' '.join(argv[3:])}", file=sys.stderr, flush=True)
        began = time.perf_counter()
        try:
            proc = subprocess.run(
                argv,
                cwd=folder,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=args.timeout,
            )
        except subprocess.TimeoutExpired as err:
            proc = subprocess.CompletedProcess(
                argv,
                124,
                stdout=(err.stdout or b"").decode(errors="replace")
                if isinstance(err.stdout, bytes)
                else (err.stdout or ""),
            )
            proc.stdout += f"\ntimed out after {args.timeout:g} s"
        wall = time.perf_counter() - began
        (folder / "run.log").write_text(proc.stdout)
        try:
            problems = check(name, folder, gpu, proc)
        except Exception as err:  # noqa: BLE001 - a broken store is a failure of this workload
            problems = [f"could not read the results: {type(err).__name__}: {err}"]
        result = "PASS  " + seen(name, folder) if not problems else "FAIL  " + "; ".join(problems)
        rows.append((name, gpu, f"{wall:.1f} s", result))
        print(
            f"[gpu_smoke] {name}: {result} ({wall:.1f} s; log {folder / 'run.log'})",
            file=sys.stderr,
            flush=True,
        )

    widths = [
        max(len(str(r[i])) for r in rows + [("workload", "GPU", "wall", "result")])
        for i in range(3)
    ]
    lines = [f"{'workload':<{widths[0]}}  {'GPU':<{widths[1]}}  {'wall':>{widths[2]}}  result"]
    lines += [f"{w:<{widths[0]}}  {g:<{widths[1]}}  {t:>{widths[2]}}  {r}" for w, g, t, r in rows]
    print("\n".join(lines), flush=True)
    failed = [r[0] for r in rows if r[3].startswith("FAIL")]
    if failed:
        print(f"gpu_smoke: FAILED: {', '.join(failed)} (runs and logs in {work})", file=sys.stderr)
        return 1
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("gpu_smoke: interrupted", file=sys.stderr)
        sys.exit(130)
