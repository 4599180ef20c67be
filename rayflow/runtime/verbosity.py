"""How much a run prints (the root key `verbose`): its levels, Tune's own `verbose` for each, and
the autoscaler's lines in a run's output, one line per scale event below level 1.

Kept apart from what rayflow prints while it waits (rayflow.runtime.progress): these decide what
of Ray's and Tune's output a run shows, for the orchestrator, the workloads, the launcher and the
sweeper alike.
"""

from __future__ import annotations

import re

from rayflow.runtime.ray_logs import ANSI

QUIET, CLUSTER, TUNE_TABLES, TUNE_RESULTS = 0, 1, 2, 3  # what each level adds: rayflow.schema.root


def level(value) -> int:
    """The `verbose` key as a level: false is 0 (quiet), true is 2 (Tune's tables), an int
    itself."""
    if isinstance(value, bool):
        return TUNE_TABLES if value else QUIET
    return int(value or 0)


def tune_verbose(value) -> int:
    """Tune's own `verbose` for rayflow's level: 0 (silent) below 2, then Tune's 1 (status
    tables, trial start and end boxes) and 2 (a box per reported result)."""
    return max(0, level(value) - 1)


# --- the autoscaler's lines in a run's output ----------------------------------------------------

_AUTOSCALER = re.compile(r"^\(autoscaler \+[^)]*\) (.*)$")
# Ray's event lines (autoscaler v1 and v2): "Adding 1 node(s) of type ray.worker.cpu.",
# "Removing 2 nodes of type ray.worker.cpu (idle).",
# "Restarting 1 nodes of type x (lost contact with raylet)."
_SCALE = re.compile(
    r"^(Adding|Removing|Restarting|Failed to launch) (\d+) nodes?(?:\(s\))? of type (\S+?)\.?"
    r"(?: \(([^)]*)\))?\.?(?:: (.*))?$"
)
# What each says happened: "Adding" is a node the provider created (node_launcher.py), not one
# that joined, so a node launched and stopped between two samples of the peak (rayflow.runtime.
# node_usage) is counted here and not there.
_VERBS = {
    "Adding": "launched",
    "Removing": "stopping",
    "Restarting": "restarting",
    "Failed to launch": "failed to launch",
}


def autoscaler_line(line: str) -> str | None:
    """A line of a run's output as `verbose=0` shows it: not the autoscaler's, as it is; a scale
    event, one line (`[rayflow] autoscaler: launched 1 worker (ray.worker.cpu)`), a failed launch
    with its reason; an error or a warning of the autoscaler's (an infeasible request), as it is:
    it says why a run waits; the rest (`Resized to 8 CPUs.`, Ray's tip on `ray status`), None:
    left out."""
    match = _AUTOSCALER.match(ANSI.sub("", line).rstrip("\r\n"))
    if match is None:
        return line
    text = match.group(1)
    scale = _SCALE.match(text)
    if scale:
        verb, count, node_type, why, reason = scale.groups()
        n = int(count)
        # rayflow's vm types: rayflow_worker_cpu, _gpu
        kind = node_type.removeprefix("rayflow_worker_")
        detail = ", ".join(filter(None, (kind, why)))
        workers = f"{n} worker{'s' if n != 1 else ''}"
        return f"[rayflow] autoscaler: {_VERBS[verb]} {workers} ({detail})" + (
            f": {reason}" if reason else ""
        )
    if text.startswith(("Error:", "Warning:", "No available node types")):
        return line
    return None


def autoscaler_lines(lines, verbose=0) -> list[str]:
    """The lines of a run's output with the autoscaler's summarised (autoscaler_line), unless
    `verbose` (the root key) asks for its own lines."""
    if level(verbose) >= CLUSTER:
        return list(lines)
    return [shown for shown in map(autoscaler_line, lines) if shown is not None]


__all__ = [
    "CLUSTER",
    "QUIET",
    "TUNE_RESULTS",
    "TUNE_TABLES",
    "autoscaler_line",
    "autoscaler_lines",
    "level",
    "tune_verbose",
]
