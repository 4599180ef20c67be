"""MLflow runs written through MlflowClient with explicit run ids, from any process: the nested
runs of trials and Ray Train runs under an invocation's parent run, and their metrics.

Below both the driver's Tracker (rayflow.tracking) and the Tune callback that mirrors trials
(rayflow.trial_runs), which import it; it imports neither.
"""

from __future__ import annotations

from rayflow.config import flatten
from rayflow.redaction import redact

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value


def mlflow_client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def create_nested_run(client, experiment_id: str, parent_run_id: str, name: str, params: dict, tags: dict | None = None) -> str:
    """A run under the invocation's parent (a Tune trial, a Ray Train run); returns its id."""
    from mlflow.entities import Param

    all_tags = {"mlflow.parentRunId": parent_run_id, "mlflow.runName": name, **(tags or {})}
    run_id = client.create_run(experiment_id, tags=all_tags).info.run_id
    flat = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in flatten(redact(params))]
    for i in range(0, len(flat), 100):  # log_batch takes at most 100 params
        client.log_batch(run_id, params=flat[i : i + 100])
    return run_id


def log_step(uri: str, run_id: str, metrics: dict, step: int) -> None:
    """Numeric `metrics` at `step` into a run, from any process (a Ray Train worker)."""
    import time

    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    batch = [Metric(k, float(v), stamp, step) for k, v in metrics.items() if isinstance(v, (int, float))]
    mlflow_client(uri).log_batch(run_id, metrics=batch)
