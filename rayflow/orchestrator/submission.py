"""Submission, the one protocol for everything that runs on a cluster as a Ray Job: a run on a
backend that submits (vm, kuberay: rayflow.orchestrator.remote_run) and a Hydra app's sweep there
(rayflow.launcher.submit).

`submit(handle, ...)` ships rayflow's package with the job (runtime_env `py_modules`), prints the
job id and dashboard URL, streams the job's logs, and decides the outcome from the job's status,
never from the log stream ending, then fetches the job's whole driver log (JobOutcome.log) while
the head is still there. Ctrl-C and SIGTERM stop the job before the cluster is torn down. The job
ends its log with one line, signed with a key made for this submission and handed to it by
environment (rayflow.security.result_channel): `Submitted.data()` is what that line holds, read as
data, never as code.

Nothing of the run's own goes on the job's command line, which `ps` on the head, the Jobs API
(JobInfo.entrypoint) and the dashboard show: the entrypoint is the fixed `python -m
rayflow.job_entry`, and the overrides (a tracking URI with its password among them) travel as a
file, `request.json` in a package of their own shipped with the job (`REQUEST_PACKAGE`, read on the
head by `read_request`). What the job streams back is masked (rayflow.security.redaction.mask_text).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rayflow.backends import ClusterHandle
from rayflow.errors import ClusterError, JobError
from rayflow.orchestrator.job_logs import LogStream, bounded_log, first_line
from rayflow.results.storage import STORAGE_ENV
from rayflow.security import result_channel
from rayflow.security.redaction import mask_text

# What the job's driver and its trials must see as this side does: MLflow's and Databricks'
# credentials, an object store's settings (through the job's runtime_env, which every worker of
# the job inherits, never its command line or logs).
FORWARDED_ENV = (
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_INSECURE_TLS",
    "DATABRICKS_HOST",
    "DATABRICKS_TOKEN",
    *STORAGE_ENV,
)
# Set in a submitted run's environment: the backend that submitted it, its cluster spec (redacted),
# and its start-up figures (for the job that started the cluster).
SUBMITTED_BY, SUBMITTED_SPEC, SUBMITTED_METRICS = (
    "RAYFLOW_SUBMITTED_BY",
    "RAYFLOW_CLUSTER_SPEC",
    "RAYFLOW_CLUSTER_METRICS",
)
# And the backend it was submitted from, as a resume composes it again (its group choice and its
# section, masked): the experiment's state records that one, not the job's own `attach`.
SUBMITTED_FROM = "RAYFLOW_SUBMITTED_FROM"


@dataclass(frozen=True)
class OnHead:
    """A submitted run's job on its cluster's head: what the side that submitted it said, read
    once from the job's environment where the job starts (rayflow.job_entry) and carried in each
    Plan from there."""

    backend: str  # the submitting side's backend (vm, kuberay), not the job's own `attach`
    spec: str  # the cluster's spec, redacted, which the MLflow parent run records
    metrics: dict[str, Any]  # the cluster's start-up figures, for the job that started it
    origin: dict[str, Any]  # the submitting invocation: its folder, what its resume carries, asks


def on_head() -> OnHead | None:
    """This process's OnHead, from the environment the submitting side gave its job; None for a
    run started here."""
    if not os.environ.get(SUBMITTED_BY):
        return None
    return OnHead(
        backend=os.environ[SUBMITTED_BY],
        spec=os.environ.get(SUBMITTED_SPEC, ""),
        metrics=json.loads(os.environ.get(SUBMITTED_METRICS) or "{}"),
        origin=json.loads(os.environ.get(SUBMITTED_FROM) or "{}"),
    )


RAY_UPLOAD_LIMIT = 100 * 2**20  # Ray refuses a runtime_env package larger than this
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
UNREACHABLE_S = 30.0  # a head busy enough to drop connections answers again well within this
# Ray's Jobs client raises RuntimeError("Request failed with status code N: ...") for an error
# status: 502, 503 and 504 are a gateway in between (the kuberay relay, the API server's service
# proxy, an ingress) saying the head did not answer it.
GATEWAY_DOWN = re.compile(r"Request failed with status code 50[234]\b")


def _unreachable(err: BaseException) -> bool:
    """The head did not answer: no connection to it, or a gateway in between said so."""
    from requests.exceptions import ConnectionError as Disconnected

    return isinstance(err, Disconnected) or (
        isinstance(err, RuntimeError) and GATEWAY_DOWN.match(str(err)) is not None
    )


# The job's own package (py_modules) holding its request: the overrides it runs with.
REQUEST_PACKAGE, REQUEST_FILE = "rayflow_job_request", "request.json"


def job_overrides(task_overrides: list[str], absolute: dict[str, str]) -> list[str]:
    """The job's command line: this run's overrides, joining the cluster (`backend=attach`,
    whose address defaults to the job's RAY_ADDRESS) instead of starting one, with the paths
    in `absolute` (tracking.uri, storage_path, ...) as this side resolved them."""

    def local_only(
        override: str,
    ) -> bool:  # hydra.searchpath stays: the user's options ship in working_dir
        key = override.split("=", 1)[0].lstrip("+~")
        return key.split(".", 1)[0] in ("backend", "hydra", "dry_run") and key != "hydra.searchpath"

    kept = [o for o in task_overrides if not local_only(o)]
    kept = [o for o in kept if o.split("=", 1)[0].lstrip("+~") not in absolute]
    return ["backend=attach", *kept, *(f"{k}={v}" for k, v in absolute.items())]


def job_entrypoint(python: str) -> list[str]:
    """A submitted run's command line: the same for every run, so it shows nothing of the run
    (its overrides go in its request: `stage_request`)."""
    return [python, "-m", "rayflow.job_entry"]


def stage_request(folder: Path, request: dict[str, Any]) -> Path:
    """`request` as `REQUEST_PACKAGE/request.json` under `folder` (private to this user while it
    is staged), a package for the job's py_modules: importable on every node of the job."""
    package = folder / REQUEST_PACKAGE
    package.mkdir(mode=0o700)
    (package / "__init__.py").write_text(
        '"""The request of one submitted rayflow job (request.json)."""\n'
    )
    fd = os.open(package / REQUEST_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(request, out)
    return package


def read_request() -> dict[str, Any]:
    """On the head: the request this job was submitted with (stage_request)."""
    import importlib

    package = importlib.import_module(REQUEST_PACKAGE)
    assert package.__file__ is not None  # a package of files, shipped with the job
    request: dict[str, Any] = json.loads((Path(package.__file__).parent / REQUEST_FILE).read_text())
    return request


def stage_package(folder: Path) -> Path:
    """rayflow's package as it is installed, with its configs, under `folder` (for py_modules):
    in a source checkout conf/ and backends/ sit beside the package, in a wheel inside it."""
    source = Path(__file__).resolve().parents[1]  # rayflow/, above orchestrator/
    target = folder / "rayflow"
    shutil.copytree(
        source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True
    )
    for name, beside in (("conf", "conf"), ("cluster_defs", "backends")):
        if (target / name).exists():  # installed from the wheel: already inside the package
            continue
        checkout = source.parent / beside  # a source checkout (editable install)
        found = checkout if checkout.is_dir() else Path(str(resources.files(f"rayflow.{name}")))
        shutil.copytree(found, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    if size > RAY_UPLOAD_LIMIT:
        raise JobError(
            f"rayflow's package is {size / 2**20:.0f} MiB, "
            f"over Ray's {RAY_UPLOAD_LIMIT // 2**20} MiB upload limit"
        )
    return target


@dataclass
class JobOutcome:
    """How a submitted job ended: its status, its last error line, its id and its whole driver
    log (fetched from the head before the cluster can go)."""

    status: str
    error: str
    job_id: str
    log: str
    streamed: list[str] = field(default_factory=list)  # the last lines this terminal was shown


def submission(
    entrypoint: list[str],
    env: dict[str, str],
    package: Path,
    runtime_env: dict[str, Any] | None,
    request: Path | None = None,
) -> dict[str, Any]:
    """The Jobs API's submit_job arguments: the entrypoint as one command line, the runtime_env
    (`env` as its env_vars, rayflow's package and the request's before the caller's py_modules)."""
    import shlex

    modules = [
        str(package),
        *([str(request)] if request is not None else []),
        *(runtime_env or {}).get("py_modules", []),
    ]
    return {
        "entrypoint": shlex.join(entrypoint),
        "runtime_env": {**(runtime_env or {}), "env_vars": env, "py_modules": modules},
        "metadata": {"submitted_by": "rayflow"},
    }


def run_as_job(
    dashboard_url: str,
    entrypoint: list[str],
    env: dict[str, str],
    stop_timeout_s: float = 60,
    agent_timeout_s: float = 120,
    headers: dict[str, str] | None = None,
    runtime_env: dict[str, Any] | None = None,
    on_submitted: Callable[[str], None] | None = None,
    hidden: str | None = None,
    request: dict[str, Any] | None = None,
    verbose: int | bool = 0,
) -> JobOutcome:
    """Submit rayflow to the cluster, stream its logs, wait for a terminal status, fetch its
    log (its end: job_logs.bounded_log). Ctrl-C or SIGTERM stops the job, then re-raises. Lines
    of the log that start with `hidden` are not streamed to this terminal (they stay in
    JobOutcome.log).
    `headers` go with every request (a token the backend holds), `runtime_env` is merged into
    the job's, `request` goes with the job as a file (stage_request: never on its command line),
    `on_submitted(job_id)` is called once the job exists (a RayJob tracks it), and `verbose` (the
    root key) says whether the autoscaler's lines are streamed as they are or summarised."""
    client = jobs_client(dashboard_url, headers)
    with tempfile.TemporaryDirectory(prefix="rayflow-job-") as tmp:
        package = stage_package(Path(tmp))
        staged = stage_request(Path(tmp), request) if request is not None else None
        arguments = submission(entrypoint, env, package, runtime_env, staged)
        job_id = submitted_id(client, arguments, mask_text(dashboard_url), agent_timeout_s)
    print(
        f"[rayflow] submitted job {job_id}; dashboard: {mask_text(dashboard_url)}/#/jobs/{job_id}",
        flush=True,
    )
    if on_submitted is not None:
        try:
            on_submitted(job_id)
        except BaseException:
            client.stop_job(job_id)
            raise
    stream = LogStream(client, job_id, hidden, verbose)
    stream.start()
    try:
        status = wait_for_end(client, job_id)
    except BaseException:  # Ctrl-C, SIGTERM: stop the job before the cluster goes
        print(f"[rayflow] stopping job {job_id}", file=sys.stderr, flush=True)
        _stop(client, job_id, deadline=time.monotonic() + stop_timeout_s)
        raise
    finally:
        stream.join(timeout=10)
    return _outcome(client, job_id, status, stream.lines)


def jobs_client(dashboard_url: str, headers: dict[str, str] | None) -> Any:
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(dashboard_url, headers=dict(headers or {}))
    except (RuntimeError, ConnectionError, AuthenticationError) as err:
        raise JobError(
            f"the Jobs API at {mask_text(dashboard_url)} refused this client: {first_line(err)}"
        ) from None


def submitted_id(client: Any, arguments: dict[str, Any], shown: str, agent_timeout_s: float) -> str:
    """The job's id, once the Jobs API took it: a head whose dashboard answers before its job agent
    registers is asked again until `agent_timeout_s`."""
    from ray.exceptions import AuthenticationError

    deadline = time.monotonic() + agent_timeout_s
    while True:
        try:
            return str(client.submit_job(**arguments))
        except AuthenticationError as err:
            raise JobError(f"the Jobs API at {shown} refused the job: {first_line(err)}") from None
        except RuntimeError as err:
            if "No available agent" not in str(err):
                raise JobError(
                    f"the Jobs API at {shown} refused the job: {first_line(err)}"
                ) from None
            if time.monotonic() > deadline:
                raise JobError(
                    f"the head at {shown} ran no job agent within {agent_timeout_s:g} s"
                ) from None
            time.sleep(2.0)


def _outcome(client: Any, job_id: str, status: str, streamed: list[str]) -> JobOutcome:
    """How the job ended: its error is rayflow's own last error line where it printed one, else
    the last line of what the Jobs API says of it."""
    log = bounded_log(client, job_id, streamed)
    info = client.get_job_info(job_id)
    said = (info.message or "").strip().splitlines()
    errors = [line for line in log.splitlines() if line.startswith("rayflow: error:")]
    return JobOutcome(
        status, errors[-1] if errors else said[-1] if said else "", job_id, log, list(streamed)
    )


def _stop(client: Any, job_id: str, deadline: float) -> None:
    """Stop the job and wait until it has ended, up to `deadline`. The request the signal cut
    into may leave its connection broken, and a head busy stopping the job may drop one: a
    connection error is retried, not raised over the signal being handled."""
    asked = False
    while time.monotonic() < deadline:
        try:
            if not asked:
                client.stop_job(job_id)
                asked = True
            if str(client.get_job_status(job_id).value) in TERMINAL:
                return
        except (OSError, RuntimeError) as err:
            if not _unreachable(err):
                raise
        time.sleep(1.0)
    why = "after being asked to" if asked else "(the head did not answer)"
    print(
        f"rayflow: warning: job {job_id} had not stopped {why} "
        "by the stop deadline; the cluster's teardown ends it",
        file=sys.stderr,
        flush=True,
    )


def wait_for_end(client: Any, job_id: str, deadline: float | None = None) -> str:
    """Poll the job until it ends (or `deadline`). A head that stops answering for
    UNREACHABLE_S fails the run in one line naming it, not with the HTTP client's traceback."""
    unreachable_since: float | None = None
    while True:
        try:
            status = str(client.get_job_status(job_id).value)
            unreachable_since = None
        except (OSError, RuntimeError) as err:
            if not _unreachable(err):
                raise
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > UNREACHABLE_S:
                raise ClusterError(
                    f"the head's dashboard at {mask_text(client.get_address())} stopped answering "
                    f"for {UNREACHABLE_S:g} s while job {job_id} ran: {first_line(err)}"
                ) from None
            status = ""
        if status in TERMINAL or (deadline is not None and time.monotonic() > deadline):
            return status
        time.sleep(1.0)


@dataclass
class Submitted:
    """A submitted job's end: its outcome, and the signed line its driver ended its log with."""

    outcome: JobOutcome
    marker: str
    key: bytes

    @property
    def succeeded(self) -> bool:
        return self.outcome.status == "SUCCEEDED"

    def data(self) -> Any:
        """What the job's signed line holds (None: no line this submission's key verifies)."""
        return result_channel.read(self.outcome.log, self.marker, self.key)

    def log(self) -> str:
        """The job's driver log without its signed line."""
        return result_channel.without(self.outcome.log, self.marker)


def submit(
    handle: ClusterHandle,
    entrypoint: list[str],
    env: dict[str, str],
    marker: str,
    runtime_env: dict[str, Any] | None = None,
    request: dict[str, Any] | None = None,
    verbose: int | bool = 0,
) -> Submitted:
    """Run a job on the cluster behind `handle` (a cluster that runs jobs: its `submission` says
    how), with a result key of its own in its environment; the job's end, its signed line included.
    """
    from rayflow.orchestrator.job_files import merge_runtime_env

    how = handle.submission
    assert how is not None, f"backend {handle.backend} runs no submitted jobs"
    # this submission's: only this process and the job's driver hold it
    key = result_channel.new_key()
    outcome = run_as_job(
        handle.address,
        entrypoint,
        {**env, result_channel.KEY_ENV: key},
        headers=how.headers,
        runtime_env=merge_runtime_env(how.runtime_env, runtime_env or {}),
        on_submitted=how.on_submitted,
        hidden=marker.strip(),
        request=request,
        verbose=verbose,
    )
    return Submitted(outcome, marker, bytes.fromhex(key))
