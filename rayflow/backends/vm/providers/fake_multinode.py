"""backend=vm provider=fake_multinode: Ray's fake multinode provider, whose worker nodes are
processes of this machine, started by its head's autoscaler; rayflow starts the head itself
(rayflow.backends.vm.fake_start), in a temp dir of its own.

What differs here: a node type must say its CPUs (nothing to detect), the autoscaling config has
no SSH, no `ray start` for the launcher to run and no setup (this machine's venv), and names its
head as Ray's fake provider does; the launcher's environment turns the fake cluster on; and the
cluster is stopped by its temp dir: every process naming it, then the dir.
"""

from __future__ import annotations

import functools
import os
import shutil
from typing import Any

from rayflow.backends.vm.providers.base import Provider, Step, Stop
from rayflow.runtime.processes import kill_processes_mentioning, stop_processes_mentioning
from rayflow.schema.kinds import KeyedError


class FakeMultinode(Provider):
    in_place = True
    autoscaler = "v1"
    # FAKE_HEAD_NODE_TYPE in Ray's fake_multi_node/node_provider.py: it names its head so
    head_type = "ray.head.default"
    node_type_keys = frozenset({"min_workers", "max_workers"})

    def check_node_type(self, b: dict, kind: str) -> None:
        if b["worker"][kind]["num_cpus"] is None:
            raise KeyedError(
                f"worker.{kind}.num_cpus",
                f"must be set with provider={self.name} (its worker nodes are processes here: "
                "nothing to detect)",
            )

    def _section(self, b: dict, gcs_address: str | None) -> dict[str, Any]:
        section: dict[str, Any] = {
            "type": self.name,
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        }
        if gcs_address:  # where the head's GCS listens, when not at this machine's address:6379
            section["gcs_address"] = gcs_address
        return section

    def setup_commands(self, ray_version: str) -> dict[str, list[str]]:
        # this machine's venv
        return {"setup_commands": [], "head_setup_commands": [], "worker_setup_commands": []}

    def start_commands(self, b: dict, gpu: bool, auth_mode: str) -> dict[str, list[str]]:
        # the launcher starts the head; the provider starts workers
        return {"head_start_ray_commands": [], "worker_start_ray_commands": []}

    def launcher_env(self, auth_mode: str, token_file: str | None = None) -> dict[str, str]:
        env = super().launcher_env(auth_mode, token_file)
        env["RAY_FAKE_CLUSTER"] = "1"  # the head's monitor builds FakeMultiNodeProvider only then
        # v2 would run prepare_config, which needs Ray's example.yaml (not in the wheel)
        env["RAY_enable_autoscaler_v2"] = "0"
        if auth_mode == "token" and token_file:
            # worker processes start from the head's monitor
            env["RAY_AUTH_TOKEN_PATH"] = str(token_file)
        return env

    def stop_steps(self, stop: Stop) -> list[Step]:
        """Every process naming the temp dir (`stop.path`, checked by the caller to be this
        user's fake cluster's), the graceful stop then the SIGKILL sweep behind it; then the temp
        dir, where it is still there (where a reboot or a tmp cleaner took it, its processes go
        by the name and nothing is removed by the path)."""
        steps: list[Step] = [
            (
                "stop the fake cluster's processes",
                functools.partial(stop_processes_mentioning, stop.path),
            ),
            (
                "kill what is left of the fake cluster",
                functools.partial(kill_processes_mentioning, stop.path),
            ),
        ]
        if os.path.lexists(stop.path):
            remove = functools.partial(shutil.rmtree, stop.path, ignore_errors=True)
            steps.append(("remove the fake cluster's temp dir", remove))
        return steps


PROVIDER = FakeMultinode("fake_multinode")
