"""A Ray Tune callback, run in the driver, that mirrors each trial into a nested MLflow run.

It is pickled with the experiment (tuner.pkl) and its trial -> run map is saved in Tune's
experiment state, so `resume=true` keeps writing into the same nested runs.

The MLflow calls run in order on one writer thread, not in Tune's driver loop: a function
trainable's `tune.report` waits until the driver has taken its result and asked for the next,
so every millisecond a callback spends writing (SQLite: ~8 ms per result, ~20 ms per trial
start and end) was added to every report and to every trial's start. A write that fails
because the tracking store failed or went away is one warning line at the next callback, and
the trials are mirrored no further: the experiment goes on, its outcome its own (any other
error, a bug, raises there).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, NamedTuple

from ray.tune import Callback

from rayflow.results.records import RAN_TO_END, TUNE_AUTO_KEYS, lookup
from rayflow.tracking.mlflow_runs import tracking_errors, warn_tracking

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

FLUSH_TIMEOUT_S = 300.0  # queued writes left at the end of the experiment (a slow tracking server)


class TrialSeen(NamedTuple):
    trial_id: str
    name: str
    params: dict


def _flat(result: dict, prefix: str = "") -> dict:
    """A result's numbers, nested dicts as "a/b" (MLflow metric names allow '/')."""
    flat = {}
    for key, value in result.items():
        if key == "config":
            continue
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[f"{prefix}{key}"] = value
    return flat


class TrialRuns(Callback):
    def __init__(
        self,
        uri: str,
        experiment_id: str,
        parent_run_id: str,
        metric_names,
        max_t,
        param_keys=None,
        time_attr: str = "epoch",
    ):
        self.uri = uri
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        # MLflow name -> key in Tune's result; "a/b" reaches into nested results (RLlib's);
        # None: every number the trial reports (a user's trainable), nested ones as "a/b"
        self.metrics = (
            None
            if metric_names is None
            else dict(metric_names)
            if isinstance(metric_names, dict)
            else {n: n for n in metric_names}
        )
        self.max_t = max_t
        self.time_attr = time_attr
        self.param_keys = tuple(param_keys) if param_keys else None  # None: the whole trial config
        self.runs: dict[str, str] = {}  # trial_id -> MLflow run id
        self._client: MlflowClient | None = None
        self._tagged: set[str] = set()
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self.failed = False  # the store failed: nothing more is written

    def __getstate__(self):
        self.flush()  # the trial -> run map is whole when Tune saves the experiment
        return self.__dict__ | {"_client": None, "_tagged": set(), "_writer": None, "_pending": []}

    def _give_up(self, err: BaseException) -> None:
        self.failed = True
        for future in self._pending:
            future.cancel()
        self._pending = []
        warn_tracking(
            "trial runs (the experiment goes on; its trials are no longer mirrored into MLflow)",
            err,
        )

    def _write(self, call, *args, **kwargs) -> None:
        """Queue one MLflow call behind the ones before it; first raise any that failed."""
        self._raise_failed()
        if self.failed:
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="rayflow-mlflow-writer"
            )
        self._pending.append(self._writer.submit(call, *args, **kwargs))

    def _raise_failed(self) -> None:
        """Drop the finished writes; one the store failed gives tracking up (one warning), any
        other error raises here."""
        done = [f for f in self._pending if f.done() and not f.cancelled()]
        self._pending = [f for f in self._pending if not f.done()]
        for future in done:
            try:
                future.result()
            except tracking_errors() as err:
                self._give_up(err)
                return

    def flush(self) -> None:
        """Wait for every queued write, at most FLUSH_TIMEOUT_S for all of them."""
        _, late = wait(self._pending, timeout=FLUSH_TIMEOUT_S)
        if late:
            self._give_up(
                TimeoutError(
                    f"the tracking store {self.uri} took over {FLUSH_TIMEOUT_S:g} s "
                    f"for {len(late)} queued trial result(s)"
                )
            )
        self._raise_failed()

    @property
    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def _seen(self, trial) -> TrialSeen:
        """The trial as the driver loop sees it now (PBT changes a trial's config later)."""
        params = {
            k: v for k, v in trial.config.items() if self.param_keys is None or k in self.param_keys
        }
        return TrialSeen(trial.trial_id, str(trial), params)

    def run_for(self, trial: TrialSeen) -> str:
        run_id = self.runs.get(trial.trial_id)
        if run_id is None:
            from rayflow.tracking.mlflow_runs import create_nested_run

            run_id = create_nested_run(
                self.client,
                self.experiment_id,
                self.parent_run_id,
                trial.name,
                params=trial.params,
                tags={"trial_id": trial.trial_id},
            )
            self.runs[trial.trial_id] = run_id
        return run_id

    def on_trial_start(self, iteration, trials, trial, **info):
        self._write(self._started, self._seen(trial))

    def _started(self, trial: TrialSeen) -> None:
        self.client.update_run(self.run_for(trial), status="RUNNING")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._write(self._log_result, self._seen(trial), result)

    def _log_result(self, trial: TrialSeen, result: dict) -> None:
        from mlflow.entities import Metric

        run_id = self.run_for(trial)
        step = int(result.get(self.time_attr, result.get("training_iteration", 0)) or 0)
        stamp = int(result.get("timestamp", 0) * 1000)
        if self.metrics is None:
            values = {k: v for k, v in _flat(result).items() if k not in TUNE_AUTO_KEYS}
        else:
            values = {name: lookup(result, key) for name, key in self.metrics.items()}
        metrics = [
            Metric(name, float(value), stamp, step)
            for name, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        tags = []
        if run_id not in self._tagged:  # what the trial says about itself, once
            from mlflow.entities import RunTag

            tags = [
                RunTag(k, str(result[k]).lower()) for k in ("device", "synthetic") if k in result
            ]
            # the GPU model as the trial's process saw it, e.g. "NVIDIA H100 80GB HBM3"
            if result.get("device_name"):
                tags.append(RunTag("device_name", str(result["device_name"])))
                self.client.set_tag(self.parent_run_id, "device_name", str(result["device_name"]))
            self._tagged.add(run_id)
        self.client.log_batch(run_id, metrics=metrics, tags=tags)

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        self._write(
            self._completed, self._seen(trial), result.get(self.time_attr), result.get(RAN_TO_END)
        )

    def _completed(self, trial: TrialSeen, last, ran_to_end: bool | None) -> None:
        run_id = self.run_for(trial)
        if ran_to_end:  # the trainable said so
            self.client.set_tag(run_id, "stopped_early", "false")
        elif self.max_t and last is not None:
            self.client.set_tag(run_id, "stopped_early", str(last < self.max_t).lower())
        self.client.set_terminated(run_id, "FINISHED")

    def on_trial_error(self, iteration, trials, trial, **info):
        seen = self._seen(trial)
        self._write(lambda: self.client.set_terminated(self.run_for(seen), "FAILED"))

    def on_experiment_end(self, trials, **info):
        self.flush()
        for trial in trials:  # Ctrl-C: trials Tune will resume stay visibly unfinished
            if (
                trial.status not in ("TERMINATED", "ERROR")
                and trial.trial_id in self.runs
                and not self.failed
            ):
                try:
                    self.client.set_terminated(self.runs[trial.trial_id], "KILLED")
                except tracking_errors() as err:
                    self._give_up(err)
        if self._writer is not None:
            self._writer.shutdown(wait=not self.failed, cancel_futures=self.failed)
            self._writer = None

    def get_state(self):
        self.flush()
        return {"runs": dict(self.runs)}

    def set_state(self, state):
        self.runs.update(state.get("runs", {}))
