"""`rayflow.report(**metrics)`: a Hydra task function's intermediate results, for the schedulers of
`hydra/sweeper=rayflow` to stop a bad trial before its end.

Inside a trial of that sweeper it is Ray Tune's `tune.report` (rayflow.workloads.hydra_sweep binds
it around the task). Anywhere else it does nothing, so the same task function runs unchanged as a
plain `python app.py` and under any other sweeper; under another sweeper's multirun, where a user
may expect early stopping, it says once that nothing listens.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

# the running trial's tune.report, in the thread Tune runs the task function in
_SINK: ContextVar[Callable[[dict], None] | None] = ContextVar("rayflow_report_sink", default=None)


class NothingListens(UserWarning):
    """rayflow.report under a sweeper whose schedulers cannot see intermediate results."""


@contextmanager
def reporting_to(sink: Callable[[dict], None]) -> Iterator[None]:
    """Route rayflow.report into `sink` while a trial's task function runs."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


def report(**metrics: Any) -> None:
    """Report intermediate results of the running trial (e.g. `rayflow.report(loss=0.3)` once an
    epoch): under `hydra/sweeper=rayflow` the scheduler sees each (ASHA stops a bad trial early);
    elsewhere nothing happens."""
    sink = _SINK.get()
    if sink is not None:
        sink(metrics)
    elif _in_other_multirun():
        # Python shows a warning once per place that reports (its default filter)
        warnings.warn(
            "rayflow.report does nothing under this sweeper: no scheduler sees intermediate "
            "results (hydra/sweeper=rayflow stops bad trials early)",
            NothingListens,
            stacklevel=2,
        )


def _in_other_multirun() -> bool:
    hydra = sys.modules.get("hydra.core.hydra_config")
    if hydra is None:
        return False
    config = hydra.HydraConfig.instance().cfg
    if config is None:
        return False
    mode = config.hydra.get("mode")
    return str(getattr(mode, "name", mode)) == "MULTIRUN"
