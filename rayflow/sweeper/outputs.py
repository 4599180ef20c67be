"""What a search leaves in its sweep dir, as Hydra's sweepers leave it: each trial's job folder
(`<sweep dir>/<subdir>`: .hydra/, the job's log and files), `optimization_results.yaml` (the best
params and value, as Hydra's Optuna sweeper writes it) and `trials.csv`, one row per trial.

Where the trials ran on nodes that do not share this machine's files, each job wrote under its
trial's own folder, which Tune synced to the experiment's storage: those folders come home here,
into the sweep dir, never outside it."""

from __future__ import annotations

import csv
import math
import os
import shutil
from pathlib import Path
from typing import Any

from rayflow.results.records import RAN_TO_END
from rayflow.sweeper.params import Search

RESULTS = "optimization_results.yaml"
TABLE = "trials.csv"


def write_outputs(
    result: Any, search: Search, sweep_dir: str, in_place: bool, metric: str, minimize: bool
) -> None:
    """The sweep dir's outputs from the experiment the search left (also after an interrupt or
    failed trials: what ran is recorded)."""
    from omegaconf import OmegaConf

    from rayflow.results.records import tune_trials
    from rayflow.workloads.hydra_sweep import JOB_FOLDER, JOB_KEY, JOB_NUM

    rows: list[dict] = []
    best: tuple[float, dict] | None = None  # (value, params)
    for trial in tune_trials(_experiment_here(result)):
        if not in_place and trial.folder is not None:
            _bring_home(trial.folder / JOB_FOLDER, Path(sweep_dir))
        last = trial.rows[-1] if trial.rows else {}
        value = last.get(metric)
        params = search.params({k: v for k, v in trial.params.items() if k != JOB_KEY})
        num = trial.params.get(JOB_NUM)
        state = _state(trial, last)
        rows.append(
            {
                "job": num if isinstance(num, int) else None,
                "state": state,
                **params,
                metric: value,
                "reports": last.get("training_iteration"),
            }
        )
        number = _finite(value)
        if state == "failed" or number is None:
            continue
        if best is None or _better(number, best[0], minimize):
            best = (number, params)
    rows.sort(key=lambda r: (r["job"] is None, r["job"] or 0))
    _write_table(Path(sweep_dir, TABLE), rows)
    if best is not None:
        value, params = best
        OmegaConf.save(
            OmegaConf.create({"name": "rayflow", "best_params": params, "best_value": value}),
            Path(sweep_dir, RESULTS),
        )


def _experiment_here(result: Any) -> Path:
    """The search's experiment folder on this machine: on an object store, its mirror pulled
    afresh (a search whose driver was a job on a cluster's head left none here), once verified as
    this user's: a bucket others can write to may hold anything under its name, and the sweep
    dir's outputs (the table, the best params, the job folders) are made from what is read."""
    from rayflow.results import verification
    from rayflow.results.experiment import Experiment
    from rayflow.results.storage import is_uri

    where = getattr(result, "experiment", None)
    if where and is_uri(str(where)):
        verification.verify(str(where), key="hydra.sweeper.storage_path")
        return Experiment(str(where)).pull("hydra.sweeper.storage_path")
    return Path(result.experiment_dir)


def _state(trial: Any, last: dict) -> str:
    """A trial's end: completed (its task returned), stopped early (by the scheduler), failed,
    or unfinished (an interrupt left it for a resume)."""
    if trial.errored:
        return "failed"
    if trial.done:
        return "completed" if last.get(RAN_TO_END) else "stopped early"
    return "unfinished"


def _finite(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _better(value: float, than: float, minimize: bool) -> bool:
    return value < than if minimize else value > than


def _bring_home(source: Path, sweep_dir: Path) -> None:
    """A trial's job folder from its Tune folder into the sweep dir: plain files and folders
    only (a link there is not followed), nothing outside the sweep dir."""
    if source.is_symlink() or not source.is_dir():
        return
    root = sweep_dir.resolve()
    # os.walk, told not to: a linked folder in the trial's is neither entered nor copied
    for folder, dirs, files in os.walk(source, followlinks=False):
        here = Path(folder)
        for name in [*dirs, *files]:
            item = here / name
            if item.is_symlink() or not (item.is_file() or item.is_dir()):
                continue
            target = (root / item.relative_to(source)).resolve()
            if root not in target.parents:
                continue
            if item.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(item, target)


def _write_table(path: Path, rows: list[dict]) -> None:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
