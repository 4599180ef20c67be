"""What the plots draw, read back from an experiment folder (never from this invocation's memory,
so a resumed run draws the whole history).

Ray Tune keeps a folder per trial with `params.json` (the trial's config) and `result.json`
(one JSON line per report; reopened for appending when a trial is restored, so it holds every
report since the trial first started). Whether a trial finished is not in result.json: a trial whose
function returns is marked done in Tune's memory only (its last logged report says done=false);
Tune's experiment state (`experiment_state-<time>.json`, written at the end of fit() before the
trials are stopped) keeps each trial's status. A single Ray Train run writes no per-epoch file of
its own: rayflow.workloads.presets.ddp.EpochLog, a Train callback on its controller (which Ray
places on the driver's node), appends rank 0's reports to EPOCHS_FILE in the run's folder.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

TUNE_RESULT, TUNE_PARAMS = "result.json", "params.json"
# one per invocation that ran fit(); the newest is the latest
TUNE_STATE_GLOB = "experiment_state-*.json"
EPOCHS_FILE = "rayflow_epochs.jsonl"  # next to rayflow.json, in a Train run's folder
# What Tune adds to every result by itself: not what a trial reports, so neither a "best" line of
# the results table, a metric of a trial's MLflow run, nor a column of RunResult.trials.
# What a trainable may report with its last result to say its trial ran to its end, so that a
# trial without it, ended by the scheduler, counts as stopped early (hydra/sweeper=rayflow's trials
# report it when the task function returns; other trainables are judged by max_t alone).
RAN_TO_END = "ran_to_end"
TUNE_AUTO_KEYS = frozenset(
    {
        "training_iteration",
        RAN_TO_END,
        "time_this_iter_s",
        "time_total_s",
        "timestamp",
        "pid",
        "hostname",
        "node_ip",
        "time_since_restore",
        "iterations_since_restore",
        "timesteps_since_restore",
        "timesteps_total",
        "episodes_total",
        "done",
        "date",
        "experiment_tag",
        "config",
        "trial_id",
        "checkpoint_dir_name",
        "should_checkpoint",
    }
)
# What ASHA optimises in workload=ddp's sweep (workload.tune=true); the plots draw it too.
SWEEP_METRIC, SWEEP_MODE = "val_accuracy", "max"


def read_lines(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file; a line cut short (a run killed mid-write) is
    skipped."""
    rows: list[dict] = []
    try:
        text = path.read_text()
    except OSError:
        return rows
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def lookup(row: dict, key: str):
    """row[key], or the nested value "a/b" names (RLlib's results are nested dicts)."""
    if key in row:
        return row[key]
    value = row
    for part in key.split("/"):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def series(rows: list[dict], x: str, y: str) -> list[tuple[float, float]]:
    """(x, y) points sorted by x; a repeated x (epochs re-run after a restore) keeps its last
    report."""
    points: dict[float, float] = {}
    for row in rows:
        px, py = _number(lookup(row, x)), _number(lookup(row, y))
        if px is not None and py is not None:
            points[px] = py
    return sorted(points.items())


# Tune's trial statuses (ray.tune.experiment.Trial): TERMINATED (finished, or stopped by the
# scheduler or a stop rule), ERROR; anything else is a trial the run left unfinished.
FINISHED, ERRORED = "TERMINATED", "ERROR"


@dataclass
class Trial:
    trial_id: str
    params: dict
    rows: list[dict] = field(default_factory=list)
    status: str | None = None  # from Tune's experiment state; None where it holds none
    folder: Path | None = None  # the trial's folder in the experiment

    @property
    def done(self) -> bool:
        """The trial finished (ran to its end or was stopped by the scheduler); not one that
        errored or that an interrupt left unfinished. Without Tune's state (an old folder), the
        last report's done flag."""
        if self.status is not None:
            return self.status == FINISHED
        return bool(self.rows and self.rows[-1].get("done"))

    @property
    def errored(self) -> bool:
        return self.status == ERRORED


def _trial_states(experiment_dir: Path) -> list[tuple[dict, dict]]:
    """(the trial, its run metadata) per trial, from the newest experiment state Tune wrote in
    the folder ([] if none)."""
    states = sorted(Path(experiment_dir).glob(TUNE_STATE_GLOB))  # names end in a sortable time
    if not states:
        return []
    try:
        entries = json.loads(states[-1].read_text()).get("trial_data", [])
    except (OSError, ValueError, AttributeError):
        return []
    found = []
    for entry in entries:  # [the trial's JSON, its runtime metadata's JSON]
        try:
            trial, metadata = json.loads(entry[0]), json.loads(entry[1])
        except (ValueError, TypeError, IndexError, KeyError):
            continue
        if isinstance(trial, dict) and trial.get("trial_id"):
            found.append((trial, metadata if isinstance(metadata, dict) else {}))
    return found


def trial_statuses(experiment_dir: Path) -> dict[str, str]:
    """Trial id -> status, from the newest experiment state Tune wrote in the folder ({} if
    none)."""
    return {
        str(trial["trial_id"]): trial["status"]
        for trial, _ in _trial_states(experiment_dir)
        if isinstance(trial.get("status"), str)
    }


def trial_restarts(experiment_dir: Path) -> tuple[int, str | None]:
    """How often Tune restarted a trial from its last checkpoint after a failure (a lost node, an
    error of its own), and the first failure's line ((0, None): never). A trial's last failure,
    the one it ended ERRORED on, is no restart; nor is a trial that saved no checkpoint."""
    restarts = 0
    for trial, metadata in _trial_states(experiment_dir):
        failures = int(metadata.get("num_failures") or 0)
        # A restart goes on from the trial's last checkpoint: a trial that saved none ran again
        # from its start, which the results block must not call a restart from a checkpoint.
        if _has_checkpoint(Path(experiment_dir), trial.get("relative_logdir")):
            restarts += max(0, failures - (trial.get("status") == ERRORED))
    if not restarts:
        return 0, None
    for error in sorted(Path(experiment_dir).glob("*/error.txt")):
        lines = [line.strip() for line in error.read_text(errors="replace").splitlines()]
        # "Failure # 1 (occurred at ...)", then the error's text
        said = [line for line in lines[1:] if line and not line.startswith("Failure #")]
        if said:  # its first sentence (Ray's go on about what may or may not have run)
            first = said[0].split(". ")[0]
            return restarts, first if len(first) <= 160 else first[:159] + "…"
    return restarts, None


def _has_checkpoint(experiment_dir: Path, folder: object) -> bool:
    """Whether the trial's folder (its relative_logdir, a name inside the experiment) holds a
    checkpoint Tune saved."""
    if not isinstance(folder, str) or not folder or "/" in folder or folder.startswith("."):
        return False
    return any((experiment_dir / folder).glob("checkpoint_*"))


def tune_trials(experiment_dir: Path) -> list[Trial]:
    """Every trial folder of a Tune experiment (sorted by trial id), with its reports so far."""
    statuses = trial_statuses(experiment_dir)
    trials = []
    for folder in sorted(p for p in Path(experiment_dir).iterdir() if (p / TUNE_PARAMS).is_file()):
        try:
            params = json.loads((folder / TUNE_PARAMS).read_text())
        except (OSError, ValueError):
            params = {}
        rows = read_lines(folder / TUNE_RESULT)
        ids = [r["trial_id"] for r in rows if r.get("trial_id")]
        trial_id = str(ids[-1]) if ids else _folder_trial_id(folder.name) or folder.name
        trials.append(
            Trial(
                trial_id,
                params if isinstance(params, dict) else {},
                rows,
                statuses.get(trial_id),
                folder,
            )
        )
    return sorted(trials, key=lambda t: t.trial_id)


def _folder_trial_id(name: str) -> str | None:
    """The trial id in a trial folder's name (`<trainable>_<id>_<index>_<tag>`), for a trial
    that never reported (no trial_id in its result.json): `a1b2c_00003` as Tune numbers the
    trials of random search, `a1b2c3d4` as it names those a search algorithm suggests."""
    match = re.search(r"_([0-9a-f]{5}_\d{5}|[0-9a-f]{8})_", name)
    return match.group(1) if match else None


def train_epochs(experiment_dir: Path) -> list[dict]:
    """A Ray Train run's reports (rank 0's): one per epoch where they say their epoch (a re-run
    epoch keeps its last report), else every report in order."""
    rows = read_lines(Path(experiment_dir) / EPOCHS_FILE)
    if not rows or not all(_number(r.get("epoch")) is not None for r in rows):
        return rows
    by_epoch: dict[int, dict] = {int(r["epoch"]): r for r in rows}
    return [by_epoch[e] for e in sorted(by_epoch)]
