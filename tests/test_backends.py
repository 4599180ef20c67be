"""The backend contract (rayflow.testing.backends) for local and attach, and what all backends share."""

from __future__ import annotations

import signal

import pytest
import yaml

from rayflow.backends import backend_for
from rayflow.orchestrator.compose import compose_config
from rayflow.testing.backends import DriverConnectionSuite, LifecycleSuite


def test_a_signal_is_forgotten_by_the_next_job(tmp_path):
    """A SIGTERM one job of a process received (a multirun, a notebook) is not the next job's."""
    from rayflow.errors import Terminated
    from rayflow.orchestrator.preflight import plan_job
    from rayflow.orchestrator.session import run_jobs
    from rayflow.runtime import signals as process_state

    with pytest.raises(Terminated):
        process_state.raise_terminated(signal.SIGTERM, None)
    assert process_state.termination_exit_code() == 143
    run_jobs([plan_job(compose_config("dry_run=true", f"storage_path={tmp_path}"), [])])
    assert process_state.termination_exit_code() is None


def test_missing_extra_gets_an_install_hint(monkeypatch):
    from rayflow.backends import REGISTRY, Entry
    from rayflow.errors import ConfigError

    monkeypatch.setitem(
        REGISTRY,
        "local",
        Entry("rayflow_missing_module_for_test:Cluster", "rayflow.backends.keys:Local", "spark"),
    )
    with pytest.raises(
        ConfigError, match=r"needs rayflow_missing_module_for_test: pip install 'rayflow\[spark\]'"
    ):
        backend_for(compose_config())


class TestLocal(LifecycleSuite, DriverConnectionSuite):
    name = "local"
    owns_cluster = True
    teardown_faults = [("ray.shutdown()",), ("kill what is left",)]

    def overrides(self):
        return ["backend=local", "backend.num_cpus=1"]

    def test_render_shows_the_ray_init_arguments(self, backend):
        spec = yaml.safe_load(backend.render().text)
        assert spec["ray.init"]["num_cpus"] == 1 and spec["ray.init"]["address"] == "local"

    def test_its_workers_ask_its_own_dashboard_for_state(self, backend):
        """Ray Train's placement-group cleaner asks Ray's state API with no address, which
        otherwise finds the machine's most recently started cluster: another run's, whose
        "no such actor" had Train remove this run's placement group mid-training."""
        import os

        import ray
        from ray.dashboard.utils import (
            get_address_for_submission_client,
            ray_address_to_api_server_url,
        )

        from rayflow.orchestrator.cluster import running

        before = os.environ.get("RAY_API_SERVER_ADDRESS")
        with running(backend):
            # what the GCS says
            own = ray_address_to_api_server_url(ray.get_runtime_context().gcs_address)
            asked = ray.get(
                ray.remote(
                    lambda: (
                        os.environ.get("RAY_API_SERVER_ADDRESS"),
                        get_address_for_submission_client(None),
                    )
                ).remote()
            )
        assert asked == (own, own)
        # the driver's environment put back
        assert os.environ.get("RAY_API_SERVER_ADDRESS") == before


@pytest.mark.usefixtures("head_node")
class TestAttach(LifecycleSuite, DriverConnectionSuite):
    name = "attach"
    owns_cluster = False
    teardown_faults = [("disconnect",)]

    @pytest.fixture(autouse=True)
    def _address(self, head_node):
        self.address = head_node

    def overrides(self):
        return ["backend=attach", f"backend.address={self.address}", "ray_auth_mode=token"]

    def test_unreachable_address_is_refused_by_check(self):
        from rayflow.errors import ConfigError

        with pytest.raises(ConfigError, match="backend.address: cannot reach 127.0.0.1:1"):
            backend_for(compose_config("backend=attach", "backend.address=127.0.0.1:1")).check()


def test_the_backend_contract_is_small():
    """What every backend answers (render, check, probe, capacity, start -> handle, stop), and
    what it does that shapes a run (its traits: the job submitted or driven here, whether its
    nodes see this machine's files or are one machine's, whether it starts nothing); the rest is
    its config. Keeping clusters for later runs is a capability beside it (KeepsClusters: reach
    and down, from the kept cluster's record), which the engines that can add. A cluster's run
    state is the handle's, not the backend's."""
    import dataclasses

    from rayflow.backends import REGISTRY, ClusterBackend, ClusterHandle, KeepsClusters, Traits

    members = {name for name in dir(ClusterBackend) if not name.startswith("_")}
    assert members == {"check", "probe", "render", "capacity", "start", "stop", "traits", "name"}
    assert len(members) <= 8
    assert {f.name for f in dataclasses.fields(Traits)} == {
        "submits_jobs",
        "shares_filesystem",
        "single_machine",
        "joins_running",
    }
    assert {name for name in dir(KeepsClusters) if not name.startswith("_")} == {"reach", "down"}
    keepers = {
        name
        for name in REGISTRY
        if isinstance(backend_for(compose_config(f"backend={name}")), KeepsClusters)
    }
    assert keepers == {"spark", "vm", "kuberay"}
    backend = backend_for(compose_config())
    assert set(vars(backend)) == {"section", "auth_mode"}

    held = {f.name for f in dataclasses.fields(ClusterHandle)}
    assert {
        "address",
        "submission",
        "teardown_command",
        "metrics",
        "tags",
        "owner_run",
        "kept",
    } <= held
