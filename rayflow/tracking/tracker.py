"""MLflow from the driver only: a parent run per invocation, a nested run per trial.

Why the driver: Ray's MLflowLoggerCallback cannot nest trial runs under a parent
(ray#19978), MLflow inside a trainable ignores the callback's tracking URI (ray#36257),
and many processes writing one SQLite file hit "database is locked". Here one process
writes everything, through MlflowClient with explicit run ids (no fluent global state).
Secret-named keys are masked before anything is written.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import socket
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig

from rayflow.errors import ConfigError
from rayflow.runtime.environment import scoped_env
from rayflow.schema.values import flatten, safe_yaml, to_container
from rayflow.security.redaction import mask_text, redact
from rayflow.tracking.mlflow_runs import (
    MAX_PARAM_CHARS,
    mlflow_client,
    tracking_errors,
    warn_tracking,
)

# The stores MLflow's tracking registry knows (mlflow.tracking._tracking_service.utils), by URI
# scheme; database schemes may name a driver (postgresql+psycopg2). Plugins add more.
STORE_SCHEMES = {
    "",
    "file",
    "http",
    "https",
    "databricks",
    "databricks-uc",
    "uc",
    "sqlite",
    "postgresql",
    "mysql",
    "mssql",
}
DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}

# Made a training experiment where MLflow 3 lets a client say so (its UI's experiment kinds:
# `custom_model_development` opens on the runs, not on the GenAI overview); older MLflow keeps
# the tag as any other.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
GIT_COMMIT_TAG = "mlflow.source.git.commit"


def _plugin_schemes() -> set[str]:
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group="mlflow.tracking_store")}


def _writable_dir(folder: Path) -> bool:
    """Whether `folder` exists as a writable directory or could be created: tried for real in
    its nearest existing ancestor (root passes every access() check), then removed again."""
    folder = folder.expanduser().resolve()
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rayflow-check-", dir=folder))
    except OSError:
        return False
    return True


def is_local_store(uri: str) -> bool:
    """A store that is a file or folder on this machine (SQLite, a file store)."""
    scheme = urllib.parse.urlparse(str(uri)).scheme.lower().split("+")[0]
    return scheme in ("sqlite", "", "file") or len(scheme) == 1


def check_uri(cfg, local_files_ok: bool = True) -> None:
    """Preflight for tracking.uri: a store MLflow has, a local path rayflow can write, a server
    or database that answers within tracking.timeout_s. Starts nothing, writes nothing."""
    if not cfg.tracking.enabled:
        return
    timeout = float(cfg.tracking.timeout_s)  # its kind: rayflow.schema.root.Mlflow
    uri = str(cfg.tracking.uri).strip()
    shown = mask_text(uri)
    parsed = urllib.parse.urlparse(uri)
    scheme = parsed.scheme.lower()
    base = scheme.split("+")[0]
    if len(scheme) == 1:  # a Windows drive letter: a local path
        base = ""
    if base not in STORE_SCHEMES and scheme not in _plugin_schemes():
        raise ConfigError(
            "tracking.uri",
            f"{shown!r}: {scheme!r} is not an MLflow tracking store; use sqlite:///PATH, a folder, "
            "http(s)://HOST:PORT or databricks",
        )
    if base in ("sqlite", "", "file") and not local_files_ok:
        raise ConfigError(
            "tracking.uri",
            f"{shown!r} is a file on this machine, which the cluster's nodes do not share; use a "
            "tracking server (http(s)://HOST:PORT, databricks)",
        )
    if base == "sqlite":
        path = uri[len(parsed.scheme) + 3 :].split("?")[0]
        if path not in ("", ":memory:"):
            db = Path(path).expanduser()
            if db.is_dir() or not _writable_dir(db.parent):
                raise ConfigError(
                    "tracking.uri",
                    f"{shown!r}: cannot create the SQLite file {db} (its folder is not writable or "
                    f"{'it is a folder' if db.is_dir() else 'cannot be made'})",
                )
    elif base in ("", "file"):
        folder = Path(urllib.parse.unquote(parsed.path) if base == "file" else uri).expanduser()
        if folder.exists() and not folder.is_dir() or not _writable_dir(folder):
            raise ConfigError(
                "tracking.uri", f"{shown!r}: cannot write MLflow's file store to {folder}"
            )
    elif base in ("http", "https"):
        _probe_server(uri, shown, timeout)
    elif base in DB_PORTS:
        host, port = parsed.hostname or "localhost", parsed.port or DB_PORTS[base]
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError as err:
            raise ConfigError(
                "tracking.uri",
                f"{shown!r}: the database at {host}:{port} does not answer "
                f"({err.strerror or type(err).__name__}; waited up to {timeout:g} s, "
                "tracking.timeout_s)",
            ) from None


def _probe_server(uri: str, shown: str, timeout: float) -> None:
    """Any HTTP answer will do (a proxy in front of MLflow may refuse /health); no answer
    within the timeout is the error MLflow would otherwise retry for minutes."""
    parsed = urllib.parse.urlsplit(uri)
    request = urllib.request.Request(
        parsed._replace(
            # no host (`http:///`): urlopen says so, as the error below
            netloc=(parsed.hostname or "") + (f":{parsed.port}" if parsed.port else ""),
            path=parsed.path.rstrip("/") + "/health",
            query="",
        ).geturl()
    )
    if parsed.username:  # credentials in the URI: send them as MLflow would, never print them
        user = urllib.parse.unquote(parsed.username)
        password = urllib.parse.unquote(parsed.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        reason = getattr(reason, "strerror", None) or str(reason) or type(err).__name__
        raise ConfigError(
            "tracking.uri",
            f"no MLflow server answers at {shown} ({mask_text(reason)}; "
            f"waited up to {timeout:g} s, tracking.timeout_s)",
        ) from None


def launch_dir() -> Path:
    """The folder the user ran rayflow from: Hydra's `hydra.runtime.cwd` under the CLI (a job a
    launcher runs may sit in a scratch folder), else this process's working directory."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.cwd)
    return Path.cwd()


def _module_dir(trainable: str | None) -> Path | None:
    """The folder of the file of a `module:function` trainable's module, unless it is rayflow's
    own (a built-in workload's trainable: rayflow's commit is not the user's project's)."""
    module = str(trainable or "").partition(":")[0].strip()
    if not module or module.split(".")[0] == "rayflow":
        return None
    try:
        spec = importlib.util.find_spec(module)
    # What find_spec raises for a module that is not there or a broken parent package: no
    # commit to tag (the run itself reports a trainable it cannot import).
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec else None
    return Path(origin).resolve().parent if origin and os.path.isfile(origin) else None


def _head(folder: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or one that hangs
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def git_commit(trainable: str | None = None) -> str | None:
    """The commit of the user's project: of the git checkout holding the folder rayflow runs from,
    else of the one holding the trainable's module file; None when neither is in one. Never
    rayflow's own checkout (where an editable install's code lies) unless the user runs from it."""
    for where in (launch_dir(), _module_dir(trainable)):
        commit = _head(where) if where is not None else None
        if commit:
            return commit
    return None


class Tracker:
    """The invocation's parent run. Every method is a no-op when tracking is off.

    `start` raises what the store raises: nothing of the run has happened yet. Every call after
    it goes through `write`: a store that fails or went away meanwhile costs one warning line,
    and the calls after it are skipped, so the run's own outcome, exit code and result line
    stand (the preflight vouched for the store; what it does later is not the run's doing)."""

    def __init__(self, cfg: DictConfig) -> None:
        self.enabled = bool(cfg.tracking.enabled)
        self.uri = str(cfg.tracking.uri) if self.enabled else ""
        self.experiment = str(cfg.tracking.experiment) if self.enabled else ""
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self._client = None
        self.failed = False  # the store failed after the start: nothing more is written

    @property
    def libraries(self) -> tuple[str, ...]:
        """What a run's log imports before it quiets their loggers (rayflow.runtime.run_log)."""
        return ("mlflow",) if self.enabled else ()

    @property
    def client(self):
        if self._client is None:
            self._client = mlflow_client(self.uri)
        return self._client

    def start(
        self, cfg, spec_yaml: str, tags: dict[str, Any], resume_run_id: str | None = None
    ) -> None:
        if not self.enabled:
            return
        client = self.client
        found = client.get_experiment_by_name(self.experiment)
        self.experiment_id = (
            found.experiment_id
            if found
            else client.create_experiment(self.experiment, tags=EXPERIMENT_TAGS)
        )
        if resume_run_id:
            self.run_id = resume_run_id
            client.update_run(resume_run_id, status="RUNNING")
            client.set_tag(resume_run_id, "resumed", "true")
            return
        all_tags = {
            "mlflow.runName": str(cfg.experiment_name),
            **{k: str(v) for k, v in tags.items() if v is not None},
        }
        if "git_commit" in all_tags:  # the UI's "Source" column reads MLflow's own tag
            all_tags[GIT_COMMIT_TAG] = all_tags["git_commit"]
        self.run_id = client.create_run(self.experiment_id, tags=redact(all_tags)).info.run_id
        self.log_params(to_container(cfg))
        client.log_text(self.run_id, safe_yaml(cfg), "config.yaml")
        specs = [redact(d or {}) for d in yaml.safe_load_all(spec_yaml)] or [{}]
        client.log_text(
            self.run_id, yaml.safe_dump_all(specs, sort_keys=False), "cluster/spec.yaml"
        )

    def log_params(self, config: dict) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in flatten(redact(config))]
        client = self.client
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params
            client.log_batch(self.run_id, params=params[i : i + 100])

    def write(self, what: str, call) -> None:
        """`call(client, run_id)` into the parent run once it started: a store that fails is one
        warning line (`rayflow: warning: MLflow <what>: ...`) and ends tracking for this run."""
        if not self.run_id or self.failed:
            return
        try:
            call(self.client, self.run_id)
        except tracking_errors() as err:
            self.failed = True
            warn_tracking(
                f"{what} (the run goes on; nothing more is logged to {mask_text(self.uri)})", err
            )

    def set_tags(self, tags: dict[str, Any]) -> None:
        def tag(client, run_id):
            for key, value in redact(tags).items():
                client.set_tag(run_id, key, str(value))

        self.write("tags", tag)

    def log_metrics(self, metrics: dict[str, float]) -> None:
        def log(client, run_id):
            for key, value in metrics.items():
                if value is not None:
                    client.log_metric(run_id, key, float(value))

        self.write("metrics", log)

    def log_artifacts(self, local_dir: str, artifact_path: str) -> None:
        self.write(
            f"artifacts {artifact_path}",
            lambda client, run_id: client.log_artifacts(run_id, local_dir, artifact_path),
        )

    def log_artifact(self, local_file: str) -> None:
        self.write(
            f"artifact {Path(local_file).name}",
            lambda client, run_id: client.log_artifact(run_id, local_file),
        )

    def end(self, status: str) -> None:
        self.write(
            f"ending the run as {status}",
            lambda client, run_id: client.set_terminated(run_id, status),
        )

    def trial_callback(
        self, metric_names, max_t: int | None, param_keys=None, time_attr: str = "epoch"
    ):
        """The Tune callback mirroring each trial into a nested run (None with tracking off).
        `metric_names`: MLflow name -> result key, or None for every number a trial reports."""
        # the run is created in its experiment (start): both are set, or neither
        if not self.run_id or self.experiment_id is None or self.failed:
            return None
        from rayflow.tracking.trial_runs import TrialRuns  # imports ray.tune

        return TrialRuns(
            self.uri, self.experiment_id, self.run_id, metric_names, max_t, param_keys, time_attr
        )

    @property
    def absolute_uri(self) -> str:
        """The URI with a relative SQLite path made absolute (valid from any directory)."""
        uri = self.uri
        if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
            uri = "sqlite:///" + os.path.abspath(uri[len("sqlite:///") :])
        return uri

    def runs_route(self) -> str:
        """The UI's route (MLflow's hash router) to the experiment's training runs: MLflow 3
        otherwise opens on its GenAI overview, where a Tune user's runs are not."""
        return f"/#/experiments/{self.experiment_id}/runs" if self.experiment_id else "/"

    def ui_hint(self) -> str:
        if not self.enabled:
            return "tracking is off (tracking=none)"
        uri = mask_text(self.absolute_uri)
        if uri.startswith(("http://", "https://")):
            return f"{uri.rstrip('/')}{self.runs_route()}   (the tracking server's UI)"
        return (
            f"mlflow ui --backend-store-uri {uri}   "
            f"(then open http://127.0.0.1:5000{self.runs_route()})"
        )


def missing_run(cfg, run_id: str) -> str | None:
    """Why the store of `tracking.uri` does not hold the run `run_id` (a resumed experiment's
    parent run), or None when it does (or cannot say). Creates nothing: an SQLite file or file
    store that does not exist is not opened (MLflow would create it)."""
    from mlflow.exceptions import MlflowException

    uri = Tracker(cfg).absolute_uri
    shown = mask_text(uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).exists():
        return f"the SQLite store {shown} does not exist here"
    if is_local_store(uri) and not uri.startswith("sqlite:"):
        folder = Path(urllib.parse.urlparse(uri).path if uri.startswith("file:") else uri)
        if not folder.exists():
            return f"the file store {shown} does not exist here"
    timeout = str(int(max(1.0, float(cfg.tracking.timeout_s))))
    with scoped_env(
        {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": timeout}
    ):
        try:
            mlflow_client(uri).get_run(run_id)
        except MlflowException as err:
            if err.error_code == "RESOURCE_DOES_NOT_EXIST":
                return f"the store {shown} holds no run {run_id}"
            # the store answered otherwise (check_uri vouched for it): the run will say more
            return None
    return None
