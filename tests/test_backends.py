"""The backend contract: one test class that every backend passes (like fsspec's abstract suites).

A backend renders its spec as YAML, checks its config without starting anything,
connects the driver on start, and stops what it started, and only that, on success,
on an exception and on SIGTERM; stop() may be called again.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from rayflow.backends import REGISTRY, ClusterBackend, backend_for
from tests.conftest import compose_config, ray_daemon_pids, wait_until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ClusterBackendContract:
    name: str
    owns_cluster: bool  # True: start() starts a cluster and stop() must stop it
    # Teardown steps to make fail (by the start of their on_stop description), one start and
    # stop per tuple: whatever fails, the other steps still run and nothing is left behind.
    teardown_faults: list[tuple[str, ...]] = []

    def overrides(self) -> list[str]:
        return [f"backend={self.name}"]

    @pytest.fixture
    def backend(self, monkeypatch) -> ClusterBackend:
        cfg = compose_config(*self.overrides())
        return backend_for(cfg)

    def test_is_registered_under_its_config_name(self, backend):
        assert isinstance(backend, ClusterBackend)
        assert backend.name == self.name and self.name in REGISTRY

    def test_check_and_render_start_nothing(self, backend):
        before = ray_daemon_pids()
        backend.check()
        spec = yaml.safe_load(backend.render())
        assert spec["backend"] == self.name
        assert ray_daemon_pids() == before

    def test_start_connects_the_driver(self, backend):
        import ray

        with backend as started:
            assert started.address
            assert ray.is_initialized()
            assert ray.get(ray.remote(lambda x: x * 2).remote(21)) == 42
        assert not ray.is_initialized()

    def test_stop_is_idempotent(self, backend):
        import ray

        backend.__enter__()
        backend.stop()
        backend.stop()
        backend.__exit__(None, None, None)
        assert not ray.is_initialized()

    def test_exception_stops_what_it_started(self, backend):
        import ray

        before = ray_daemon_pids()
        with pytest.raises(RuntimeError, match="boom"):
            with backend:
                started = ray_daemon_pids() - before
                raise RuntimeError("boom")
        assert not ray.is_initialized()
        if self.owns_cluster:
            assert started, "start() should have started Ray daemons"
            assert wait_until(lambda: not (ray_daemon_pids() & started), timeout=20)
        else:
            assert ray_daemon_pids() >= before, "attach must never stop the cluster it joined"

    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
    def test_signals_stop_what_it_started(self, tmp_path, signum):
        script = textwrap.dedent(
            f"""
            import os, sys, time
            from tests.conftest import compose_config
            from rayflow.backends import backend_for
            cfg = compose_config(*{self.overrides()!r})
            with backend_for(cfg):
                print("ready", flush=True)
                time.sleep(120)
            """
        )
        before = ray_daemon_pids()
        out = tmp_path / "out.log"  # a file, not a pipe: Ray's launchers print a lot there too
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=open(out, "w"), stderr=subprocess.STDOUT,
                                cwd=tmp_path, env=dict(os.environ, PYTHONPATH=os.getcwd()))
        assert wait_until(lambda: "ready\n" in out.read_text().splitlines(keepends=True), timeout=180), out.read_text()[-3000:]
        started = ray_daemon_pids() - before
        proc.send_signal(signum)
        code = proc.wait(timeout=60)
        # SIGINT: KeyboardInterrupt unwinds, then Python ends the process by SIGINT itself
        assert code == (128 + signum if signum == signal.SIGTERM else -signal.SIGINT)
        if self.owns_cluster:
            assert started
            assert wait_until(lambda: not (ray_daemon_pids() & started), timeout=20)
        else:
            assert ray_daemon_pids() >= before


    def test_a_failing_teardown_step_leaves_nothing_behind(self, tmp_path):
        assert self.teardown_faults, "name the teardown steps to fail"
        for faults in self.teardown_faults:
            script = textwrap.dedent(
                f"""
                import json
                from rayflow.backends import backend_for, base
                from tests.conftest import compose_config
                registered, original = [], base.ClusterBackend.on_stop
                def on_stop(self, what, undo, *args, **kwargs):
                    registered.append(what)
                    if what.startswith({faults!r}):  # the step fails before doing anything
                        def undo(*args, **kwargs):
                            raise RuntimeError("injected teardown failure")
                    original(self, what, undo, *args, **kwargs)
                base.ClusterBackend.on_stop = on_stop
                backend = backend_for(compose_config(*{self.overrides()!r}))
                with backend:
                    print("STARTED", flush=True)
                backend.stop()  # again, after the failures: a no-op
                print("REGISTERED", json.dumps(registered))
                print("ERRORS", json.dumps(backend.teardown_errors))
                """
            )
            before = ray_daemon_pids()
            out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                                 cwd=tmp_path, env=dict(os.environ, PYTHONPATH=os.getcwd()))
            assert out.returncode == 0, out.stderr[-3000:]
            lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith(("REGISTERED", "ERRORS"))}
            registered, errors = json.loads(lines["REGISTERED"]), json.loads(lines["ERRORS"])
            failed = [step for step in registered if step.startswith(faults)]
            assert all(any(step.startswith(f) for step in registered) for f in faults), (faults, registered)
            assert len(errors) == len(failed) and all("injected teardown failure" in e for e in errors)
            assert out.stderr.count("rayflow: warning: teardown step failed, going on") == len(failed)
            if self.owns_cluster:
                assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=30), f"left behind after {faults} failed"
            else:
                assert ray_daemon_pids() >= before, "attach must never stop the cluster it joined"


def test_a_signal_is_forgotten_by_the_next_job(tmp_path):
    """A SIGTERM one job of a process received (a multirun, a notebook) is not the next job's."""
    from rayflow.backends import base
    from rayflow.session import run_job

    with pytest.raises(base.Terminated):
        base._raise_terminated(signal.SIGTERM, None)
    assert base.termination_exit_code() == 143
    run_job(compose_config("dry_run=true", f"storage_path={tmp_path}"))
    assert base.termination_exit_code() is None


def test_missing_extra_gets_an_install_hint(monkeypatch):
    from rayflow.backends import REGISTRY
    from rayflow.config import ConfigError

    monkeypatch.setitem(REGISTRY, "local", ("rayflow_missing_module_for_test", "Cluster", "spark"))
    with pytest.raises(ConfigError, match=r"needs rayflow_missing_module_for_test: pip install 'rayflow\[spark\]'"):
        backend_for(compose_config())


class TestLocal(ClusterBackendContract):
    name = "local"
    owns_cluster = True
    teardown_faults = [("ray.shutdown()",), ("kill what is left",)]

    def overrides(self):
        return ["backend=local", "backend.num_cpus=1"]

    def test_render_shows_the_ray_init_arguments(self, backend):
        spec = yaml.safe_load(backend.render())
        assert spec["ray.init"]["num_cpus"] == 1 and spec["ray.init"]["address"] == "local"


@pytest.fixture(scope="class")
def head_node(tmp_path_factory):
    """A real cluster started with `ray start --head`, as a user's existing cluster would be."""
    ray_cli = str(Path(sys.executable).parent / "ray")
    port = _free_port()
    env = dict(os.environ, RAY_AUTH_MODE="token")
    before = ray_daemon_pids()
    subprocess.run(
        [ray_cli, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1",
         "--include-dashboard=false", "--disable-usage-stats"],
        check=True, env=env, capture_output=True, timeout=120,
    )
    yield f"127.0.0.1:{port}"
    for pid in ray_daemon_pids() - before:
        os.kill(pid, signal.SIGTERM)
    subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=120)


@pytest.mark.usefixtures("head_node")
class TestAttach(ClusterBackendContract):
    name = "attach"
    owns_cluster = False
    teardown_faults = [("disconnect",)]

    @pytest.fixture(autouse=True)
    def _address(self, head_node):
        self.address = head_node

    def overrides(self):
        return ["backend=attach", f"backend.address={self.address}", "ray_auth_mode=token"]

    def test_unreachable_address_is_refused_by_check(self):
        from rayflow.config import ConfigError

        with pytest.raises(ConfigError, match="backend.address: cannot reach 127.0.0.1:1"):
            backend_for(compose_config("backend=attach", "backend.address=127.0.0.1:1")).check()
