"""What a quiet run must not print (issue 44, item 6), counted by kind in a run's output: written
apart from rayflow.runtime.run_log's own patterns, so that a test of them can fail."""

from __future__ import annotations

import re

NOISE = {
    # Ray's per-checkpoint and per-restore INFO lines, logged in the trial processes
    "checkpoint": re.compile(r"Checkpoint successfully created at|Restored on \S+ from checkpoint"),
    # Ray Train's INFO lines in its controller and workers
    "train": re.compile(
        r"Reporting training result|training worker group|Setting up process group|"
        r"Requesting resources|Moving model to device|Wrapping provided model"
    ),
    # the C++ core worker's own lines (glog): "[2026-11-29 01:00:03,786 E 22170 22209] x.cc:1: "
    "core_worker": re.compile(r"\[\d{4}-\d\d-\d\d [\d:,]+ [IWE] \d+ \d+\] \S+\.cc:\d+"),
    # MLflow's and alembic's INFO lines ("INFO  [alembic.runtime.migration] ...")
    "mlflow": re.compile(r"\bINFO\b.*\b(mlflow|alembic)\b"),
    # Ray's driver-side INFO records ("2026-... INFO tune.py:1007 -- Wrote the latest ...")
    "ray_info": re.compile(r"\tINFO \S+\.py:\d+ -- "),
    # a __del__ cut short as a process stops
    "exception_ignored": re.compile(r"Exception ignored in"),
}


def noise(text: str) -> dict[str, int]:
    """The lines of `text` of each kind of NOISE, by kind (kinds with none left out)."""
    counts = {
        kind: sum(1 for line in text.splitlines() if p.search(line)) for kind, p in NOISE.items()
    }
    return {kind: n for kind, n in counts.items() if n}
