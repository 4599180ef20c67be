"""backend=vm provider=gcp: Compute Engine VMs, on what the clouds share (providers.cloud).

What differs here: only you can fill in the project (and, outside us-west1, the zone), its
defaults (region us-west1 and zone us-west1-a, n1-standard-2 and n1-standard-4, a T4 per GPU,
Google's Deep Learning VM images), the instance settings (`machineType`, a boot disk, Spot
provisioning, the accelerators and their driver), the nodes' setup (the image's conda, Google's
API client on the head), and the owner tag as a label (merged into the instance's labels). Ray
fills only a TPU pod's head resource at start: a GCP file states its node types' own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rayflow.backends.vm.defaults import placeholder
from rayflow.backends.vm.owner import OWNER_TAG
from rayflow.backends.vm.providers.cloud import Cloud

DEFAULT_ZONE = {"us-west1": "us-west1-a"}  # other regions: the zone is the user's choice
ACCELERATOR = "nvidia-tesla-t4"
IMAGE = {  # Google's Deep Learning VM families (Ray's defaults use common-cpu)
    "cpu": "projects/deeplearning-platform-release/global/images/family/common-cpu",
    "gpu": (
        "projects/deeplearning-platform-release/global/images/family/"
        "common-cu124-ubuntu-2204-nvidia-550"
    ),
}
DISK_GB = 50


class Gcp(Cloud):
    keys = Cloud.keys | {"project_id", "source_image"}
    node_type_keys = Cloud.node_type_keys | {"accelerator_type"}
    user_keys = ("project_id",)
    file_keys = (("project_id", "fill in your GCP project id"),)
    default_region = "us-west1"
    instance_types = {"head": "n1-standard-2", "cpu": "n1-standard-2", "gpu": "n1-standard-4"}
    python_path = (
        "(stat /opt/conda/bin/ &> /dev/null && "
        "echo 'export PATH=\"/opt/conda/bin:$PATH\"' >> ~/.bashrc) || true"
    )
    sdk = "pip install google-api-python-client==1.7.8"

    def zone_region(self, zone: str) -> str:
        return zone.rsplit("-", 1)[0]

    def in_region(self, zone: str, region: str) -> bool:
        return zone.startswith(f"{region}-")

    def zone(self, b: dict) -> str | None:
        return b.get("availability_zone") or DEFAULT_ZONE.get(self.region(b))

    def placeholders(self, b: Mapping) -> list[str]:
        keys = super().placeholders(b)
        if self.zone(dict(b)) is None:
            keys.append("backend.availability_zone")
        return keys

    def _place(self, b: dict) -> dict[str, Any]:
        return {
            "availability_zone": self.zone(b) or placeholder("availability_zone"),
            "project_id": b.get("project_id") or placeholder("project_id"),
        }

    def _node_config(self, b: dict, kind: str) -> dict[str, Any]:
        t = b["worker"].get(kind, {}) if kind != "head" else {}
        image = b.get("source_image") or IMAGE["gpu" if kind == "gpu" else "cpu"]
        config: dict[str, Any] = {
            "machineType": self._instance(b, kind),
            "disks": [
                {
                    "boot": True,
                    "autoDelete": True,
                    "type": "PERSISTENT",
                    "initializeParams": {"diskSizeGb": DISK_GB, "sourceImage": image},
                }
            ],
        }
        if t.get("spot"):  # Spot VMs: deleted when reclaimed, never left stopped (billing disks)
            config["scheduling"] = {
                "provisioningModel": "SPOT",
                "instanceTerminationAction": "DELETE",
            }
        if kind == "gpu":
            config["guestAccelerators"] = [
                {
                    "acceleratorType": t.get("accelerator_type") or ACCELERATOR,
                    "acceleratorCount": int(t["num_gpus"]),
                }
            ]
            # GPU VMs cannot live-migrate
            config.setdefault("scheduling", {})["onHostMaintenance"] = "TERMINATE"
            config["metadata"] = {"items": [{"key": "install-nvidia-driver", "value": "True"}]}
        return config

    def tag_node(self, node_config: dict[str, Any], owner: str) -> None:
        node_config["labels"] = {**(node_config.get("labels") or {}), OWNER_TAG: owner}

    def node_owner(self, node_config: Mapping[str, Any]) -> str | None:
        return (node_config.get("labels") or {}).get(OWNER_TAG)


PROVIDER = Gcp("gcp")
