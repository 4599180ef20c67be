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
file, `request.json` in a package of their own shipped with the job (`REQUEST_PACKAGE`, read on
the head by `read_request`). What the job streams back is masked (rayflow.security.redaction.mask_text).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rayflow.backends import ClusterHandle
from rayflow.errors import ClusterError, JobError
from rayflow.runtime.progress import autoscaler_lines
from rayflow.security import result_channel
from rayflow.security.redaction import mask_text

# What the job's driver must see as this side does: MLflow's and Databricks' credentials
# (through the job's runtime_env, never its command line or logs).
FORWARDED_ENV = (
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_INSECURE_TLS",
    "DATABRICKS_HOST",
    "DATABRICKS_TOKEN",
)
# Set in a submitted run's environment: the backend that submitted it, its cluster spec (redacted),
# and its start-up figures (for the job that started the cluster).
SUBMITTED_BY, SUBMITTED_SPEC, SUBMITTED_METRICS = (
    "RAYFLOW_SUBMITTED_BY",
    "RAYFLOW_CLUSTER_SPEC",
    "RAYFLOW_CLUSTER_METRICS",
)
RAY_UPLOAD_LIMIT = 100 * 2**20  # Ray refuses a runtime_env package larger than this
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
UNREACHABLE_S = 30.0  # a head busy enough to drop connections answers again well within this
# Keys that describe the cluster this side started: the job joins it instead.
LOCAL_ONLY_PREFIXES = ("backend", "+backend", "++backend", "~backend", "hydra", "dry_run")
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


def stage_request(folder: Path, request: dict) -> Path:
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


def read_request() -> dict:
    """On the head: the request this job was submitted with (stage_request)."""
    import importlib

    package = importlib.import_module(REQUEST_PACKAGE)
    return json.loads((Path(package.__file__).parent / REQUEST_FILE).read_text())


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
            f"rayflow's package is {size / 2**20:.0f} MiB, over Ray's {RAY_UPLOAD_LIMIT // 2**20} MiB upload limit"
        )
    return target


class _LogStream(threading.Thread):
    """Follows a job's logs (the Jobs API's websocket) onto this terminal, whole lines at a time,
    leaving out the lines that start with `hidden` (what the job says to this side, not to the user),
    and with the autoscaler's lines summarised unless `verbose` asks for them (progress.autoscaler_lines)."""

    def __init__(self, client, job_id: str, hidden: str | None = None, verbose: int | bool = 0):
        super().__init__(name="rayflow-job-logs", daemon=True)
        self.client, self.job_id, self.hidden, self.verbose = client, job_id, hidden, verbose
        self.lines: list[str] = []

    def _write(self, text: str) -> None:
        # "\n" only: a task's line with \u2028 or \x85 in it is one line, shown as it is (masked)
        *complete, tail = text.split("\n")
        complete = autoscaler_lines(complete, self.verbose)
        shown = [
            mask_text(line)
            for line in complete
            if not (self.hidden and line.startswith(self.hidden))
        ]
        out = "".join(line + "\n" for line in shown)
        if tail and not (
            self.hidden and tail.startswith(self.hidden)
        ):  # the log's end, without its newline
            shown.append(mask_text(tail))
            out += shown[-1]
        sys.stdout.write(out)
        sys.stdout.flush()
        self.lines = (self.lines + shown)[-200:]

    def run(self) -> None:
        async def follow() -> None:
            partial = ""  # a chunk may end mid-line: a hidden line is recognised whole
            async for chunk in self.client.tail_job_logs(self.job_id):
                partial += chunk
                done, _, partial = partial.rpartition("\n")
                if done:
                    self._write(done + "\n")
            if partial:
                self._write(partial)

        try:
            asyncio.run(follow())
        except (
            Exception
        ) as err:  # the stream is a convenience: the job's status decides the outcome
            print(
                f"[rayflow] job log stream ended: {type(err).__name__}", file=sys.stderr, flush=True
            )


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
    runtime_env: dict | None,
    request: Path | None = None,
) -> dict:
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
    runtime_env: dict | None = None,
    on_submitted=None,
    hidden: str | None = None,
    request: dict | None = None,
    verbose: int | bool = 0,
) -> JobOutcome:
    """Submit rayflow to the cluster, stream its logs, wait for a terminal status, fetch its
    whole log. Ctrl-C or SIGTERM stops the job, then re-raises. Lines of the log that start
    with `hidden` are not streamed to this terminal (they stay in JobOutcome.log).
    `headers` go with every request (a token the backend holds), `runtime_env` is merged into
    the job's, `request` goes with the job as a file (stage_request: never on its command line),
    `on_submitted(job_id)` is called once the job exists (a RayJob tracks it), and `verbose` (the
    root key) says whether the autoscaler's lines are streamed as they are or summarised."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    shown = mask_text(dashboard_url)
    try:
        client = JobSubmissionClient(dashboard_url, headers=dict(headers or {}))
    except (RuntimeError, ConnectionError, AuthenticationError) as err:
        raise JobError(f"the Jobs API at {shown} refused this client: {_first_line(err)}") from None
    with tempfile.TemporaryDirectory(prefix="rayflow-job-") as tmp:
        package = stage_package(Path(tmp))
        staged = stage_request(Path(tmp), request) if request is not None else None
        deadline = time.monotonic() + agent_timeout_s
        while True:
            try:
                job_id = client.submit_job(
                    **submission(entrypoint, env, package, runtime_env, staged)
                )
                break
            except AuthenticationError as err:
                raise JobError(
                    f"the Jobs API at {shown} refused the job: {_first_line(err)}"
                ) from None
            except RuntimeError as err:  # a head whose dashboard answers before its agent registers
                if "No available agent" not in str(err):
                    raise JobError(
                        f"the Jobs API at {shown} refused the job: {_first_line(err)}"
                    ) from None
                if time.monotonic() > deadline:
                    raise JobError(
                        f"the head at {shown} ran no job agent within {agent_timeout_s:g} s"
                    ) from None
                time.sleep(2.0)
    print(
        f"[rayflow] submitted job {job_id}; dashboard: {mask_text(dashboard_url)}/#/jobs/{job_id}",
        flush=True,
    )
    stream = _LogStream(client, job_id, hidden, verbose)
    if on_submitted is not None:
        try:
            on_submitted(job_id)
        except BaseException:
            client.stop_job(job_id)
            raise
    stream.start()
    try:
        status = _wait(client, job_id)
    except BaseException:  # Ctrl-C, SIGTERM: stop the job before the cluster goes
        print(f"[rayflow] stopping job {job_id}", file=sys.stderr, flush=True)
        _stop(client, job_id, deadline=time.monotonic() + stop_timeout_s)
        raise
    finally:
        stream.join(timeout=10)
    log = _whole_log(client, job_id, stream.lines)
    info = client.get_job_info(job_id)
    error = (info.message or "").strip().splitlines()
    errors = [line for line in log.splitlines() if line.startswith("rayflow: error:")]
    return JobOutcome(
        status,
        errors[-1] if errors else error[-1] if error else "",
        job_id,
        log,
        list(stream.lines),
    )


def _whole_log(client, job_id: str, streamed: list[str]) -> str:
    """The job's driver log as the head keeps it; what was streamed when the head cannot say."""
    from requests.exceptions import ConnectionError as Disconnected

    for _ in range(3):
        try:
            return client.get_job_logs(job_id)
        except (Disconnected, RuntimeError) as err:  # RuntimeError: the Jobs API answered an error
            last = err
            time.sleep(1.0)
    print(
        f"rayflow: warning: could not fetch job {job_id}'s log ({_first_line(last)}); keeping the streamed lines",
        file=sys.stderr,
        flush=True,
    )
    return "\n".join(streamed) + "\n"


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return mask_text(lines[0] if lines else type(err).__name__)


def _stop(client, job_id: str, deadline: float) -> None:
    """Stop the job and wait until it has ended, up to `deadline`. The request the signal cut
    into may leave its connection broken, and a head busy stopping the job may drop one: a
    connection error is retried, not raised over the signal being handled."""
    from requests.exceptions import ConnectionError as Disconnected

    asked = False
    while time.monotonic() < deadline:
        try:
            if not asked:
                client.stop_job(job_id)
                asked = True
            if str(client.get_job_status(job_id).value) in TERMINAL:
                return
        except Disconnected:
            pass
        time.sleep(1.0)
    print(
        f"rayflow: warning: job {job_id} had not stopped {'after being asked to' if asked else '(the head did not answer)'} "
        "by the stop deadline; the cluster's teardown ends it",
        file=sys.stderr,
        flush=True,
    )


def _wait(client, job_id: str, deadline: float | None = None) -> str:
    """Poll the job until it ends (or `deadline`). A head that stops answering for
    UNREACHABLE_S fails the run in one line naming it, not with the HTTP client's traceback."""
    from requests.exceptions import ConnectionError as Disconnected

    unreachable_since = None
    while True:
        try:
            status = str(client.get_job_status(job_id).value)
            unreachable_since = None
        except Disconnected as err:
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > UNREACHABLE_S:
                raise ClusterError(
                    f"the head's dashboard at {mask_text(client.get_address())} stopped answering for "
                    f"{UNREACHABLE_S:g} s while job {job_id} ran: {_first_line(err)}"
                ) from None
            status = ""
        if status in TERMINAL or (deadline is not None and time.monotonic() > deadline):
            return status
        time.sleep(1.0)


LAST_LINES = 25  # of a failed job's log, printed after it


def print_last_lines(log: str, job_id: str, where: str | None = None) -> None:
    """The last lines of a failed job's log on stderr (with where the whole log is, when kept), masked."""
    lines = log.rstrip("\n").split("\n")[-LAST_LINES:]  # "\n" only, as the channel reads it
    whole = f"; the whole log: {where}" if where else ""
    print(f"[rayflow] the last {len(lines)} lines of job {job_id}{whole}:", file=sys.stderr)
    for line in lines:
        print(f"  | {mask_text(line)}", file=sys.stderr)
    sys.stderr.flush()


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
    """Run a job on the cluster behind `handle` (a cluster that runs jobs: its `submission` says how),
    with a result key of its own in its environment; the job's end, its signed line included."""
    from rayflow.orchestrator.job_files import merge_runtime_env

    how = handle.submission
    assert how is not None, f"backend {handle.backend} runs no submitted jobs"
    key = (
        result_channel.new_key()
    )  # this submission's: only this process and the job's driver hold it
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
