"""The projects of examples/ as a user's own: copied into a test's work folder (outside the
repository) and run from there, by one command line each test module shares."""

from __future__ import annotations

import shutil
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# examples/tune-pbt, small: 2 trials of 3 iterations; its train.py goes with a submitted job
# (workload.working_dir defaults to the folder rayflow runs from).
USER_TUNE = [
    "workload=tune",
    "workload.trainable=train:objective",
    "workload.metric=loss",
    "workload.mode=min",
    "workload.search_space={lr: {loguniform: [1e-3, 1e-1]}}",
    "workload.num_samples=2",
    "workload.stop={training_iteration: 3}",
]


def copy_example(name: str, folder: Path) -> Path:
    shutil.copytree(EXAMPLES / name, folder, dirs_exist_ok=True)
    return folder
