"""backend=vm provider=aws: EC2 instances, on what the clouds share (providers.cloud).

What differs here: its defaults (region us-west-2, m5.large and g4dn.xlarge, Ray's Deep Learning
AMI for the region), the instance settings (`InstanceType`, `ImageId`, spot market options), the
nodes' setup (the AMI's conda env, boto3 on the head), the owner tag as an instance tag
(`TagSpecifications`, merged by Ray's AWSNodeProvider into its own tags), and what the EC2 API is
asked before `ray up` asks it (providers.ec2): the region, the node types' resources as `ray up`
fills them, and whether the account can start the cluster. A job on its nodes gets no AWS keys of
this machine: the nodes have the instance profile of Ray's role.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rayflow.backends.vm.owner import OWNER_TAG
from rayflow.backends.vm.providers import ec2
from rayflow.backends.vm.providers.base import refuse
from rayflow.backends.vm.providers.cloud import Cloud
from rayflow.errors import ConfigError


class Aws(Cloud):
    keys = Cloud.keys | {"ami"}
    fills_resources = True
    withheld = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    default_region = "us-west-2"
    # g4dn.xlarge: 4 vCPU, 1 T4
    instance_types = {"head": "m5.large", "cpu": "m5.large", "gpu": "g4dn.xlarge"}
    python_path = (
        "(stat $HOME/anaconda3/envs/tensorflow2_p310/ &> /dev/null && "
        "echo 'export PATH=\"$HOME/anaconda3/envs/tensorflow2_p310/bin:$PATH\"' "
        ">> ~/.bashrc) || true"
    )
    sdk = "pip install 'boto3>=1.4.8'"

    def zone_region(self, zone: str) -> str:
        return zone[:-1]

    def in_region(self, zone: str, region: str) -> bool:
        return zone.startswith(region)

    def check_here(self, b: dict) -> None:
        problem = ec2.check_region(self.region(b))  # botocore's endpoint data: offline
        if problem:
            raise ConfigError("backend.region", problem)

    def _place(self, b: dict) -> dict[str, Any]:
        zone = b.get("availability_zone")
        return {"availability_zone": str(zone)} if zone else {}

    def _node_config(self, b: dict, kind: str) -> dict[str, Any]:
        t = b["worker"].get(kind, {}) if kind != "head" else {}
        config: dict[str, Any] = {"InstanceType": self._instance(b, kind)}
        if b.get("ami"):
            # else Ray's Deep Learning AMI for the region (NVIDIA drivers included)
            config["ImageId"] = b["ami"]
        if t.get("spot"):  # EC2 reclaims it with two minutes' notice
            config["InstanceMarketOptions"] = {"MarketType": "spot"}
        return config

    def fill_resources(self, doc: dict, path: str) -> str | None:
        """Every node type's `resources` from the EC2 API as `ray up` fills them, the file's own
        values winning; where it does not answer, the note a dry run prints: `ray up` fills them
        at start, and the start's probe checks first that it can."""
        region = str((doc.get("provider") or {}).get("region") or "")
        problem = ec2.check_region(region)
        if problem:
            raise refuse(path, "provider.region", problem)
        why = ec2.fill_resources(doc, region)
        if why is None:
            return None
        return (
            f"rayflow: backend.cluster_yaml: `ray up` fills the resources of "
            f"{', '.join(ec2.unfilled(doc))} from EC2's instance types at start (not asked now: "
            f"{why})"
        )

    def probe(self, config_of: Callable[[], dict[str, Any]]) -> str | None:
        """Credentials EC2 takes, an endpoint that answers, the instance types offered in the
        region (providers.ec2)."""
        config = config_of()
        try:
            ec2.probe(str(config["provider"]["region"]), ec2.instance_types(config))
        except ec2.AwsError as err:
            return str(err)
        return None

    def tag_node(self, node_config: dict[str, Any], owner: str) -> None:
        specs = node_config.setdefault("TagSpecifications", [])
        instance = next((s for s in specs if s.get("ResourceType") == "instance"), None)
        if instance is None:
            instance = {"ResourceType": "instance", "Tags": []}
            specs.append(instance)
        tags = [t for t in instance.get("Tags") or [] if t.get("Key") != OWNER_TAG]
        instance["Tags"] = [*tags, {"Key": OWNER_TAG, "Value": owner}]

    def node_owner(self, node_config: Mapping[str, Any]) -> str | None:
        for spec in node_config.get("TagSpecifications") or []:
            if spec.get("ResourceType") == "instance":
                for pair in spec.get("Tags") or []:
                    if pair.get("Key") == OWNER_TAG:
                        return str(pair.get("Value"))
        return None


PROVIDER = Aws("aws")
