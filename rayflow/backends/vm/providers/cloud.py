"""backend=vm provider=aws, gcp: what the two clouds share, each cloud's own in its module.

A cloud cluster is VMs the launcher creates with your credentials, in a region (`backend.region`,
else the first zone's, else the cloud's default) and its zones; stopped VMs keep billing for their
disks, so they are terminated unless `cache_stopped_nodes` asks otherwise. Every VM carries the
owner tag of the run that started it (rayflow.backends.vm.owner: where a node's config carries it
is the cloud's, `tag_node`), so the cluster's name is refused while another party's VMs run
under it, the tunnel goes to the head that carries it, and only VMs that carry it are terminated:
by a run's teardown (rayflow.backends.vm.cloud_up), `rayflow down`, `python -m
rayflow.backends.vm.teardown` and the autostop watcher on the head alike. The nodes' setup keeps
the image's Python on PATH and installs this machine's versions, the head the cloud's SDK.
"""

from __future__ import annotations

import functools
from typing import Any

from rayflow.backends.vm import owner
from rayflow.backends.vm.commands import pin_command
from rayflow.backends.vm.providers.base import Provider, Step, Stop
from rayflow.errors import ClusterError
from rayflow.schema.kinds import KeyedError


class Cloud(Provider):
    tagged = True
    keys = frozenset(
        {
            "region",
            "availability_zone",
            "head_instance_type",
            "cache_stopped_nodes",
            "ssh_user",
            "ssh_private_key",
        }
    )
    node_type_keys = frozenset({"instance_type", "spot", "min_workers", "max_workers"})
    default_region = ""
    instance_types: dict[str, str] = {}  # the head's and each worker kind's, where left null
    python_path = ""  # the setup command that puts the image's Python first on PATH
    sdk = ""  # the install of the cloud's SDK on the head: its autoscaler talks to the cloud API

    def zone_region(self, zone: str) -> str:
        """The region an availability zone is in."""
        raise NotImplementedError

    def in_region(self, zone: str, region: str) -> bool:
        raise NotImplementedError

    def region(self, b: dict) -> str:
        """backend.region, else the region of the first availability zone, else the default."""
        if b.get("region"):
            return str(b["region"])
        zone = str(b.get("availability_zone") or "").split(",")[0].strip()
        return self.zone_region(zone) if zone else self.default_region

    def check(self, b: dict) -> None:
        region = self.region(b)
        for zone in str(b["availability_zone"] or "").split(","):
            if zone.strip() and not self.in_region(zone.strip(), region):
                raise KeyedError(
                    "availability_zone", f"{zone.strip()!r} is not in backend.region {region!r}"
                )

    def _section(self, b: dict, gcs_address: str | None) -> dict[str, Any]:
        section = {"type": self.name, "region": self.region(b), **self._place(b)}
        # Stopped instances keep their disks, and the disks keep billing: terminate unless asked.
        section["cache_stopped_nodes"] = bool(b["cache_stopped_nodes"])
        return section

    def _place(self, b: dict) -> dict[str, Any]:
        """Its `provider:` keys beside the region: the zone, the project."""
        return {}

    def _auth(self, b: dict) -> dict[str, Any]:
        auth = {"ssh_user": b.get("ssh_user") or "ubuntu"}
        if b.get("ssh_private_key"):
            auth["ssh_private_key"] = str(b["ssh_private_key"])
        return auth

    def _instance(self, b: dict, kind: str) -> str | None:
        t = b["worker"].get(kind, {}) if kind != "head" else {}
        chosen = b.get("head_instance_type") if kind == "head" else t.get("instance_type")
        return chosen or self.instance_types.get(kind)

    def setup_commands(self, ray_version: str) -> dict[str, list[str]]:
        # Ray's defaults put the image's conda env on PATH, then install a nightly wheel: keep
        # the first, replace the second with this machine's versions.
        return {
            "setup_commands": [self.python_path, pin_command(ray_version)],
            "head_setup_commands": [self.sdk],
            "worker_setup_commands": [],
        }

    def running(self, config: dict[str, Any], recorded: dict[str, Any] | None) -> bool | None:
        """Refused in one line while a VM of the name runs that the kept cluster of `recorded`
        did not start (vm.owner); else whether its head runs."""
        stop = (recorded or {}).get("stop")
        hint = f", or stop yours: python -m rayflow.backends.vm.teardown {stop}" if stop else ""
        return owner.check_name_free(config, recorded, hint)

    def head_ip(self, config: dict[str, Any], run_owner: str | None) -> str | None:
        """Only among the VMs that carry the cluster's owner tag: never another party's head of
        the same name; None where none does."""
        if not run_owner:  # its VMs are known by name only: another party's head would pass
            raise ClusterError(
                f"cluster {config['cluster_name']}: its cluster YAML carries no "
                f"{owner.OWNER_TAG} tag (kept by an older rayflow): not asked"
            )
        return owner.head_ip(config, run_owner)

    def stop_steps(self, stop: Stop) -> list[Step]:
        name = stop.config["cluster_name"]
        return [
            (
                f"terminate the VMs of cluster {name} that carry its owner tag",
                functools.partial(_terminate, stop),
            )
        ]


def _terminate(stop: Stop) -> None:
    """Every VM of the cluster that carries `stop.owner`, the head last, until none is left and
    no create call is in flight; stopped instead only where the file asks for stopping and the
    cluster came up (Ray's aws default, where the file does not say, stops VMs, their disks
    billing on)."""
    config = stop.config
    if not stop.owner:
        name = config["cluster_name"]
        raise ClusterError(
            f"cluster {name}: its cluster YAML carries no {owner.OWNER_TAG} tag (started by a "
            "rayflow before owner tags, or not by rayflow): nothing terminated; terminate its VMs "
            f"by hand (`ray down` of the file terminates every VM named {name} in the account, "
            "another user's too)"
        )
    cached = stop.came_up and config["provider"].get("cache_stopped_nodes") is True
    owner.terminate(config, stop.owner, stop_cached=cached, busy=stop.busy)
