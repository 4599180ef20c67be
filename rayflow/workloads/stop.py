"""What a stop mapping (Tune's `stop`: a trial stops at the first result whose key reaches the
value) may hold: keys a trial reports, numbers for values. Tune itself only warns about a key no
result has, then runs on without the stop, and fails mid-run on a value it cannot compare: both
are refused here, before anything starts, naming the key and the nearest known one."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any

from rayflow.schema.kinds import KeyedError

# Counters Tune adds to every result: a stop at 0 or below stops a trial before it runs
TUNE_COUNTERS = (
    "training_iteration",
    "time_total_s",
    "time_this_iter_s",
    "time_since_restore",
    "iterations_since_restore",
    "timesteps_total",
    "timesteps_since_restore",
    "episodes_total",
)
DONE = "done"
VALUE_MAX = 1e12  # a threshold beyond any real result: a typo (an extra digit, 1e100)


def check_stop(
    stop: Mapping[Any, Any] | None, reported: Iterable[str], declare: str | None = None
) -> None:
    """Raise KeyedError (`stop.KEY`) for a key no trial reports, or a value Tune cannot stop at.
    `reported`: the keys besides Tune's own a trial is known to report (the metric, the keys the
    user declares); `declare`: the key where the user may declare more, or None where the keys
    are not checked (RLlib's nested results)."""
    for key, value in (stop or {}).items():
        if not isinstance(key, str):
            raise KeyedError("stop", f"keys must be the names of reported results; got {key!r}")
        if declare is not None:
            _known(key, {*TUNE_COUNTERS, DONE, *reported}, declare)
        _value(key, value)


def _known(key: str, known: set[str], declare: str) -> None:
    if key in known:
        return
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    mean = f"did you mean {close[0]}? " if close else ""
    raise KeyedError(
        f"stop.{key}",
        f"no trial reports it; {mean}a stop takes Tune's counters ({', '.join(TUNE_COUNTERS[:3])}, "
        f"...), `done`, workload.metric, or a key listed in {declare}",
    )


def _value(key: str, value: Any) -> None:
    if key == DONE:
        if not isinstance(value, bool):
            raise KeyedError(f"stop.{key}", f"must be true or false; got {value!r}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise KeyedError(
            f"stop.{key}", f"must be a number (a trial stops once it reaches it); got {value!r}"
        )
    if key in TUNE_COUNTERS and value <= 0:
        raise KeyedError(f"stop.{key}", f"must be > 0 (a count a trial reaches); got {value!r}")
    if abs(value) > VALUE_MAX:
        raise KeyedError(f"stop.{key}", f"must be at most {VALUE_MAX:g} in size; got {value!r}")
