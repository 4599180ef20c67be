"""The backend contract, split by capability. Subclass per backend:

    class TestMine(LifecycleSuite, DriverConnectionSuite):
        name = "mine"
        owns_cluster = True
        teardown_faults = [("step one",), ("step two",)]
        def overrides(self): return ["backend=mine", ...]

A backend renders its spec as YAML, checks its config without starting anything, and, run by
the one cluster lifecycle (rayflow.orchestrator.cluster.running), stops what it started, and only
that, on success, on an exception, on SIGINT and SIGTERM, and when a step of its own teardown
fails; stop(handle) may be called again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from rayflow.backends import ClusterBackend, backend_for, backends
from rayflow.orchestrator.cluster import running
from rayflow.orchestrator.compose import compose_config
from rayflow.testing.processes import ray_daemon_pids, wait_until


class BackendSuite:
    name: str
    owns_cluster: bool  # True: start() starts a cluster and stop() must stop it
    # Teardown steps to make fail (by the start of their on_stop description), one start and
    # stop per tuple: whatever fails, the other steps still run and nothing is left behind.
    teardown_faults: list[tuple[str, ...]] = []
    start_timeout_s: float = 180
    # how long a started process may take to tear down and exit after SIGINT or SIGTERM
    stop_timeout_s: float = 60
    # None: the two starts of the signal and teardown-fault tests go side by side. Else the
    # second waits until the first has printed this, for engines that pick their ports at random
    # and bind them seconds later (two starts at once could pick the same port): their "ports
    # are bound" line.
    second_start_after: str | None = None

    def overrides(self) -> list[str]:
        return [f"backend={self.name}"]

    def check_started(self, handle) -> None:
        """What a started cluster of this kind of backend gives its caller (the kind's suite)."""

    @pytest.fixture
    def backend(self) -> ClusterBackend:
        return backend_for(compose_config(*self.overrides()))

    def _script_env(self) -> dict:
        return dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p),
        )


def _kill_with_descendants(proc: subprocess.Popen) -> None:
    """A process still running when the test gives up, and what it started: killed alone, it
    left its cluster's head (Ray on Spark's `ray start --block`) running with no owner."""
    import psutil

    if proc.poll() is not None:
        return
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    proc.kill()
    for child in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


class LifecycleSuite(BackendSuite):
    """Every backend: check and render start nothing; stop is idempotent; an exception, SIGINT,
    SIGTERM or a failing teardown step leaves nothing behind."""

    def test_is_registered_under_its_config_name(self, backend):
        assert isinstance(backend, ClusterBackend)
        # rayflow's own, or a plugin's (an entry point of the group rayflow.backends)
        assert backend.name == self.name and self.name in backends()

    def test_check_and_render_start_nothing(self, backend):
        before = ray_daemon_pids()
        backend.check()
        spec = yaml.safe_load(backend.render().text)
        # the backend's own document (vm: the cluster YAML, kuberay: the manifest), a mapping
        assert isinstance(spec, dict) and spec
        assert ray_daemon_pids() == before

    # The kind's own start test (DriverConnectionSuite's or JobSubmissionSuite's) runs inside the
    # exception test below, on the same start: one cluster start fewer per backend.
    test_start_connects_the_driver = None
    test_start_gives_a_jobs_api_that_runs_a_job = None

    def test_an_exception_stops_what_it_started_and_stop_is_idempotent(self, backend):
        """Started, it does what its kind promises (check_started); then an exception in the
        block stops what it started, and stop() again is a no-op."""
        import ray

        before = ray_daemon_pids()
        with pytest.raises(RuntimeError, match="boom"):
            with running(backend) as handle:
                started = ray_daemon_pids() - before
                self.check_started(handle)
                raise RuntimeError("boom")
        assert not ray.is_initialized()
        if self.owns_cluster:
            assert started, "start() should have started Ray daemons"
            assert wait_until(lambda: not (ray_daemon_pids() & started), timeout=20)
        else:
            assert ray_daemon_pids() >= before, "attach must never stop the cluster it joined"
        backend.stop(handle)  # stopped already: each undo step ran once, these are no-ops
        backend.stop(handle)
        assert not ray.is_initialized()

    # The processes of the two tests below run side by side, one per signal or per set of faults:
    # a start waits on the engine much of the time (JVMs, Ray on Spark's fixed 20 s wait for its
    # head, autoscalers), so two at once take far less than two in turn. Every check is per
    # process, but for what is left: the union of what they started must be gone. (A backend
    # with second_start_after starts the second once the first has bound its ports.)

    def test_signals_stop_what_it_started(self, tmp_path):
        script = textwrap.dedent(
            f"""
            import os, signal, sys, time
            # as in a terminal, even if the runner ignores it
            signal.signal(signal.SIGINT, signal.default_int_handler)
            from rayflow.orchestrator.compose import compose_config
            from rayflow.orchestrator.cluster import running
            from rayflow.backends import backend_for
            cfg = compose_config(*{self.overrides()!r})
            with running(backend_for(cfg)):
                print("ready", flush=True)
                time.sleep(240)
            """
        )
        before = ray_daemon_pids()
        runs = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            out = tmp_path / f"{signum.name}.log"  # a file, not a pipe: Ray's launchers print a lot
            with open(out, "w") as log:  # the child holds its own copy
                proc = subprocess.Popen(
                    [sys.executable, "-c", script],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=tmp_path,
                    env=self._script_env(),
                )
            runs[signum] = (proc, out)
            if self.second_start_after:
                self._wait_for_text([out], self.second_start_after, proc)
        try:
            for signum, (proc, out) in runs.items():
                ready = self._wait_for_text([out], "ready\n", proc)
                assert ready, f"{signum.name}: " + out.read_text()[-3000:]
            started = ray_daemon_pids() - before
            for signum, (proc, _) in runs.items():
                proc.send_signal(signum)
            for signum, (proc, out) in runs.items():
                self._exits_as_signalled(signum, proc, out)
        finally:
            for proc, _ in runs.values():
                _kill_with_descendants(proc)
        if self.owns_cluster:
            assert started
            assert wait_until(lambda: not (ray_daemon_pids() & started), timeout=20), sorted(
                ray_daemon_pids() & started
            )
        else:
            assert ray_daemon_pids() >= before

    def _exits_as_signalled(self, signum: int, proc: subprocess.Popen, out: Path) -> None:
        try:
            code = proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"{signal.Signals(signum).name}: still running {self.stop_timeout_s} s after the "
                "signal: " + out.read_text()[-3000:]
            )
        if signum == signal.SIGTERM:
            assert code == 128 + signum, (code, out.read_text()[-2000:])
        else:
            # KeyboardInterrupt unwinds the with-block; Python then exits by SIGINT or with 1
            assert code in (-signal.SIGINT, 1) and "KeyboardInterrupt" in out.read_text(), (
                code,
                out.read_text()[-2000:],
            )

    def _wait_for_text(self, outs: list[Path], text: str, proc: subprocess.Popen) -> bool:
        """Until `proc` printed `text` (a line of its own if it ends in a newline) to one of
        `outs` (True), or ended or took too long (False)."""

        def printed() -> bool:
            if text.endswith("\n"):
                return any(text in o.read_text().splitlines(keepends=True) for o in outs)
            return any(text in o.read_text() for o in outs)

        wait_until(lambda: proc.poll() is not None or printed(), timeout=self.start_timeout_s)
        return printed()

    def _fault_script(self, faults: tuple[str, ...]) -> str:
        """A start and stop in a process of its own, the teardown steps named by `faults` made to
        fail; it prints the steps registered and the teardown errors."""
        return textwrap.dedent(
            f"""
            import json
            from rayflow.backends import backend_for, handle
            from rayflow.orchestrator.cluster import running
            from rayflow.orchestrator.compose import compose_config
            registered, original = [], handle.ClusterHandle.on_stop
            def on_stop(self, what, undo, *args, **kwargs):
                registered.append(what)
                if what.startswith({faults!r}):  # the step fails before doing anything
                    def undo(*args, **kwargs):
                        raise RuntimeError("injected teardown failure")
                original(self, what, undo, *args, **kwargs)
            handle.ClusterHandle.on_stop = on_stop
            backend = backend_for(compose_config(*{self.overrides()!r}))
            with running(backend) as started:
                print("STARTED", flush=True)
            backend.stop(started)  # again, after the failures: a no-op
            print("REGISTERED", json.dumps(registered))
            print("ERRORS", json.dumps(started.teardown_errors))
            """
        )

    @staticmethod
    def _check_fault_run(faults: tuple[str, ...], code: int, stdout: str, stderr: str) -> None:
        """Every step named ran and failed alone, each failure reported once and warned about."""
        assert code == 0, (faults, stderr[-3000:])
        lines = {
            line.split(" ", 1)[0]: line.split(" ", 1)[1]
            for line in stdout.splitlines()
            if line.startswith(("REGISTERED", "ERRORS"))
        }
        registered, errors = json.loads(lines["REGISTERED"]), json.loads(lines["ERRORS"])
        failed = [step for step in registered if step.startswith(faults)]
        assert all(any(step.startswith(f) for step in registered) for f in faults), (
            faults,
            registered,
        )
        assert len(errors) == len(failed) and all(
            "injected teardown failure" in e for e in errors
        ), (faults, errors)
        assert stderr.count("rayflow: warning: teardown step failed, going on") == len(failed), (
            faults,
            stderr[-3000:],
        )

    def test_a_failing_teardown_step_leaves_nothing_behind(self, tmp_path):
        assert self.teardown_faults, "name the teardown steps to fail"
        before = ray_daemon_pids()
        runs: list[tuple[tuple[str, ...], subprocess.Popen[bytes], Path, Path]] = []
        for faults in self.teardown_faults:
            # files, not pipes: a full pipe would stall one process while the other is waited for
            out, err = tmp_path / f"faults-{len(runs)}.out", tmp_path / f"faults-{len(runs)}.err"
            with open(out, "w") as stdout, open(err, "w") as stderr:  # the child has its own copies
                proc = subprocess.Popen(
                    [sys.executable, "-c", self._fault_script(faults)],
                    stdout=stdout,
                    stderr=stderr,
                    cwd=tmp_path,
                    env=self._script_env(),
                )
            runs.append((faults, proc, out, err))
            if self.second_start_after:
                self._wait_for_text([out, err], self.second_start_after, proc)
        try:
            codes = [proc.wait(timeout=300) for _, proc, _, _ in runs]
        finally:
            for _, proc, _, _ in runs:
                if proc.poll() is None:
                    proc.kill()
        for (faults, _, out, err), code in zip(runs, codes, strict=True):
            self._check_fault_run(faults, code, out.read_text(), err.read_text())
        if self.owns_cluster:
            assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=30), (
                f"left behind after {self.teardown_faults} failed"
            )
        else:
            assert ray_daemon_pids() >= before, "attach must never stop the cluster it joined"


class DriverConnectionSuite(BackendSuite):
    """Backends that leave this process connected to the cluster (ray.init)."""

    def check_started(self, handle) -> None:
        import ray

        def double(x: int) -> int:  # a nested function: pickled by value, as a lambda is
            return x * 2

        assert handle.address
        assert ray.is_initialized()
        assert ray.get(ray.remote(double).remote(21)) == 42

    def test_start_connects_the_driver(self, backend):
        import ray

        with running(backend) as started:
            self.check_started(started)
        assert not ray.is_initialized()


class JobSubmissionSuite(BackendSuite):
    """Backends that run the workload on the cluster as a Ray Job (vm, kuberay): start() leaves
    this process unconnected and returns the dashboard URL whose Jobs API runs a job."""

    job_timeout_s: float = 120

    def check_started(self, handle) -> None:
        import ray
        from ray.job_submission import JobStatus, JobSubmissionClient

        assert handle.address.startswith(("http://", "https://"))
        assert not ray.is_initialized(), "a submitting backend must not connect this process"
        assert handle.submission is not None
        client = JobSubmissionClient(handle.address, headers=handle.submission.headers)
        job = client.submit_job(
            entrypoint="python -c \"import ray; ray.init(); print('nodes', len(ray.nodes()))\""
        )
        status = wait_until(
            lambda: (
                client.get_job_status(job)
                in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)
                and client.get_job_status(job)
            ),
            timeout=self.job_timeout_s,
            interval=1.0,
        )
        assert status == JobStatus.SUCCEEDED, client.get_job_logs(job)[-3000:]
        assert "nodes " in client.get_job_logs(job)

    def test_start_gives_a_jobs_api_that_runs_a_job(self, backend):
        import ray

        with running(backend) as started:
            self.check_started(started)
        assert not ray.is_initialized()
