"""MLflow runs written through MlflowClient with explicit run ids, from any process: the nested
runs of trials and Ray Train runs under an invocation's parent run, and their metrics.

Below both the driver's Tracker (rayflow.tracking.tracker) and the Tune callback that mirrors trials
(rayflow.tracking.trial_runs), which import it; it imports neither.
"""

from __future__ import annotations

import sys

from rayflow.schema.values import flatten
from rayflow.security.redaction import mask_text, redact

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value


def tracking_errors() -> tuple[type[BaseException], ...]:
    """What a tracking store that fails or went away raises through MlflowClient: MLflow's own
    error (its REST client wraps requests' errors in it once its retries are spent, its database
    stores SQLAlchemy's), requests' and the OS's. A bug in rayflow's calls is none of these."""
    import requests
    from mlflow.exceptions import MlflowException

    return (MlflowException, requests.RequestException, OSError)


def warn_tracking(what: str, err: BaseException) -> None:
    """One line on stderr for a tracking call that failed after the run started: the run goes on,
    and its outcome is its own (`rayflow: warning: MLflow <what>: <the error's first line>`)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    print(f"rayflow: warning: MLflow {what}: {mask_text(text)[:500]}", file=sys.stderr, flush=True)


def mlflow_client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def create_nested_run(
    client,
    experiment_id: str,
    parent_run_id: str,
    name: str,
    params: dict,
    tags: dict | None = None,
) -> str:
    """A run under the invocation's parent (a Tune trial, a Ray Train run); returns its id."""
    from mlflow.entities import Param

    all_tags = {"mlflow.parentRunId": parent_run_id, "mlflow.runName": name, **(tags or {})}
    run_id = client.create_run(experiment_id, tags=all_tags).info.run_id
    flat = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in flatten(redact(params))]
    for i in range(0, len(flat), 100):  # log_batch takes at most 100 params
        client.log_batch(run_id, params=flat[i : i + 100])
    return run_id


class _FailedSteps:
    """The runs whose store failed in this process: their steps are skipped. Process-wide:
    `log_step` is called from any process (a Ray Train worker) with the run's id alone, and what
    it skips is what this process saw fail; its one instance is `_FAILED_STEPS`."""

    def __init__(self) -> None:
        self.runs: set[str] = set()


_FAILED_STEPS = _FailedSteps()


def log_step(uri: str, run_id: str, metrics: dict, step: int) -> None:
    """Numeric `metrics` at `step` into a run, from any process (a Ray Train worker). A store
    that fails costs one warning line per run and process, never the worker's training."""
    import time

    from mlflow.entities import Metric

    if run_id in _FAILED_STEPS.runs:
        return
    stamp = int(time.time() * 1000)
    batch = [
        Metric(k, float(v), stamp, step) for k, v in metrics.items() if isinstance(v, (int, float))
    ]
    try:
        mlflow_client(uri).log_batch(run_id, metrics=batch)
    except tracking_errors() as err:
        _FAILED_STEPS.runs.add(run_id)
        warn_tracking(f"metrics of run {run_id} (no more are logged from this process)", err)
