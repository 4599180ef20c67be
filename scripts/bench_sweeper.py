"""hydra-sweeper: one Hydra app's parameter search, each whole command a user runs, side by side:

- `hydra/sweeper=rayflow` with FIFO (no early stopping) on backend=local with 2 CPUs, 2 trials at
  once: `ratio` = the search's wall / ideal, where ideal is the sum of the trials' own times / 2
  slots (the search's wall: its first trial's start to its last trial's end, from Tune's results;
  `command_ratio` counts the whole command, the cluster's start and stop with it);
- the same search with ASHA: its wall and best value against FIFO's (`asha_wall_ratio`);
- Hydra's Optuna sweeper in batches of 2 through Hydra's joblib launcher (2 processes), the same
  trials: `fifo_vs_batched` = rayflow FIFO's command wall / the batched sweep's.

The app (written here, outside the repository) is a learning curve, value = x^2 + y^2 + 10/step,
reported once a step; a trial's length depends on its job number alone (2 to 16 steps of
--step-s, 1 to 8 s at the default), so every sweeper runs the same lengths in the same order.
Random search with one seed on both sides. The Optuna sweeper pins optuna < 3, which clashes with
rayflow's: it runs from a venv of its own (--peer-venv, made with pip on first use), where a
stand-in `rayflow.report` does nothing, as rayflow's own does under another sweeper.

--smoke: 4 trials of 0.05 s steps through both of rayflow's sides; the peer is left out (its
figures null: installing its venv is the full run's)."""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import smoke_option

SLOTS = 2
APP = """
import time

import hydra
from hydra.core.hydra_config import HydraConfig

import rayflow


@hydra.main(version_base="1.3", config_path=None, config_name="config")
def curve(cfg):
    steps = 2 + (HydraConfig.get().job.num * 5) % 15  # 2..16: the same lengths for every sweeper
    value = 0.0
    for step in range(1, steps + 1):
        time.sleep(cfg.step_s)
        value = cfg.x**2 + cfg.y**2 + 10.0 / step
        rayflow.report(objective=value)
    return value


if __name__ == "__main__":
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="config", node={"x": 0.0, "y": 0.0, "step_s": 0.5})
    curve()
"""
STAND_IN = '''"""rayflow.report under another sweeper: nothing listens (the peer's venv has no rayflow)."""


def report(**metrics):
    return None
'''
PEER_PACKAGES = ["hydra-core", "hydra-optuna-sweeper", "hydra-joblib-launcher"]
PARAMS = ["x=interval(-5, 5)", "y=interval(-5, 5)"]


def _run(argv: list[str], cwd: Path, env: dict) -> float:
    started = time.monotonic()
    out = subprocess.run(argv, cwd=cwd, env=env, stdout=sys.stderr, stderr=sys.stderr, timeout=1800)
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"the sweep failed: {' '.join(argv)}")
    return wall


def _rayflow(app: Path, args, scheduler: str) -> dict:
    sweep = Path(tempfile.mkdtemp(prefix="sweep-", dir=app))
    argv = [
        sys.executable,
        "app.py",
        "-m",
        "hydra/sweeper=rayflow",
        f"hydra.sweep.dir={sweep}",
        f"hydra.sweeper.n_trials={args.trials}",
        f"hydra.sweeper.max_concurrent={SLOTS}",
        f"hydra.sweeper.num_cpus={SLOTS}",
        f"hydra.sweeper.seed={args.seed}",
        f"hydra.sweeper.scheduler={scheduler}",
        "hydra.sweeper.tracking=none",
        f"step_s={args.step_s}",
        *PARAMS,
    ]
    env = dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "token"))
    wall = _run(argv, app, env)
    starts, ends, own = [], [], 0.0
    for result in (sweep / "search").glob("*/result.json"):
        rows = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
        starts.append(rows[0]["timestamp"] - rows[0]["time_this_iter_s"])
        ends.append(rows[-1]["timestamp"])
        own += rows[-1]["time_total_s"]
    with (sweep / "trials.csv").open() as f:
        values = [float(r["objective"]) for r in csv.DictReader(f) if r["objective"]]
    return {
        "wall": wall,
        "search": max(ends) - min(starts),
        "ideal": own / SLOTS,
        "best": min(values),
    }


def _peer_venv(path: Path) -> Path:
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    return python


def _optuna(app: Path, args, python: Path) -> dict:
    sweep = Path(tempfile.mkdtemp(prefix="sweep-", dir=app))
    argv = [
        str(python),
        "app.py",
        "-m",
        "hydra/sweeper=optuna",
        "hydra/sweeper/sampler=random",
        "hydra/launcher=joblib",
        f"hydra.sweep.dir={sweep}",
        f"hydra.sweeper.n_trials={args.trials}",
        f"hydra.sweeper.n_jobs={SLOTS}",
        f"hydra.launcher.n_jobs={SLOTS}",
        f"hydra.sweeper.sampler.seed={args.seed}",
        f"step_s={args.step_s}",
        *PARAMS,
    ]
    env = dict(os.environ, PYTHONPATH=str(app / "peer"))  # the stand-in rayflow, nothing else
    wall = _run(argv, app, env)
    best = json.loads(json.dumps(_yaml(sweep / "optimization_results.yaml")))["best_value"]
    return {"wall": wall, "best": float(best)}


def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def hydra_sweeper(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-sweeper-") as tmp:
        app = Path(tmp) / "app"
        (app / "peer" / "rayflow").mkdir(parents=True)
        (app / "app.py").write_text(APP)
        (app / "peer" / "rayflow" / "__init__.py").write_text(STAND_IN)
        fifo = _rayflow(app, args, "fifo")
        asha = _rayflow(app, args, "{name: asha, grace_period: 1, max_t: 16, reduction_factor: 3}")
        peer = None if args.smoke else _optuna(app, args, _peer_venv(Path(args.peer_venv)))
    return {
        "name": "hydra-sweeper",
        "trials": args.trials,
        "step_s": args.step_s,
        "slots": SLOTS,
        "ideal_s": round(fifo["ideal"], 2),
        "search_s": round(fifo["search"], 2),
        "ratio": round(fifo["search"] / fifo["ideal"], 3),
        "wall_s": round(fifo["wall"], 2),
        "command_ratio": round(fifo["wall"] / fifo["ideal"], 3),
        "best": round(fifo["best"], 4),
        "asha_search_s": round(asha["search"], 2),
        "asha_wall_s": round(asha["wall"], 2),
        "asha_wall_ratio": round(asha["search"] / fifo["search"], 3),
        "asha_best": round(asha["best"], 4),
        "batched_wall_s": round(peer["wall"], 2) if peer else None,
        "batched_best": round(peer["best"], 4) if peer else None,
        "fifo_vs_batched": round(fifo["wall"] / peer["wall"], 3) if peer else None,
    }


def hydra_sweeper_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--step-s", type=float, default=0.5, help="one step of a trial's curve")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--peer-venv",
        default=str(Path.home() / ".cache" / "rayflow" / "bench" / "optuna-peer"),
        help="the venv of Hydra's Optuna sweeper and joblib launcher (made on first use)",
    )
    smoke_option(p, skips="the Optuna sweeper's side is left out", trials=4, step_s=0.05)
