"""backend=vm provider=aws (providers.aws): what `ray up` asks the EC2 API before it creates
anything, asked here first, so that a file `ray up` accepts is accepted and a wrong account is one
line.

- `check_region`: the region against the ones botocore knows (offline: its endpoint data).
- `fill_resources`: every node type gets its `resources` as `ray up` fills them, by Ray's own
  `AWSNodeProvider.fillout_available_node_types_resources` (CPUs, memory, GPUs of the instance
  type, from `describe_instance_types`, with the file's own values winning). Where the API does
  not answer (a dry run on a machine without credentials) the types stay as they are and the
  reason comes back: `ray up` fills them at start, after `probe` has checked that it can.
- `probe`: one bounded call (`describe_instance_types` of the file's instance types, one attempt,
  5 s to connect) that says in one line why the account cannot start the cluster: no
  credentials, credentials refused, no answer at the endpoint, an instance type the region does
  not offer. Credentials come from the standard AWS settings (`AWS_*`, a profile, an instance
  role); rayflow passes none of them on.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
from collections.abc import Mapping
from typing import Any

from rayflow.backends.vm import internals

CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 15
# What EC2 and IAM answer to keys they do not know or whose signature does not match.
REFUSED = {
    "AuthFailure",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "UnrecognizedClientException",
    "InvalidAccessKeyId",
    "ExpiredToken",
    "RequestExpired",
}


class AwsError(Exception):
    """Why the EC2 API cannot serve this cluster, in one line without credentials."""


def known_regions() -> set[str]:
    import boto3

    session = boto3.session.Session()
    return {
        region
        for partition in session.get_available_partitions()
        for region in session.get_available_regions("ec2", partition_name=partition)
    }


def check_region(region: str) -> str | None:
    """Why `region` is no EC2 region, or None."""
    if region in known_regions():
        return None
    return f"{region!r} is not an EC2 region (e.g. us-west-2, eu-central-1)"


def _client(region: str) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"max_attempts": 1, "mode": "standard"},
    )
    return boto3.client("ec2", region_name=region, config=config)


def instance_types(doc: Mapping) -> list[str]:
    types = doc.get("available_node_types") or {}
    return sorted(
        {
            str(t["node_config"]["InstanceType"])
            for t in types.values()
            if isinstance(t, Mapping) and (t.get("node_config") or {}).get("InstanceType")
        }
    )


def probe(region: str, wanted: list[str]) -> None:
    """One bounded call the cluster's start depends on; AwsError says why it failed."""
    import botocore.exceptions as bx

    from rayflow.security.redaction import mask_text

    try:
        client = _client(region)
        client.describe_instance_types(InstanceTypes=wanted)
    except bx.NoCredentialsError:
        raise AwsError(
            "no AWS credentials here (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
            "or an instance role)"
        ) from None
    except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError) as err:
        raise AwsError(f"the EC2 API does not answer: {mask_text(str(err))}") from None
    except bx.ClientError as err:
        raise AwsError(_answer(err, region, wanted)) from None


def _answer(err: Any, region: str, wanted: list[str]) -> str:
    from rayflow.security.redaction import mask_text

    code = str(err.response.get("Error", {}).get("Code", ""))
    message = mask_text(" ".join(str(err.response.get("Error", {}).get("Message", "")).split()))
    if code in REFUSED:
        return f"AWS refused the credentials ({code}): check AWS_ACCESS_KEY_ID / AWS_PROFILE"
    if code == "UnauthorizedOperation":
        return f"the credentials may not call ec2:DescribeInstanceTypes ({code})"
    if code.startswith("InvalidInstanceType"):
        return f"region {region} does not offer {', '.join(wanted)}: {message}"
    return f"EC2 answered {code or 'an error'}: {message}"


def unfilled(doc: Mapping) -> list[str]:
    """The node types whose `resources` `ray up` fills from the instance type: every type with an
    instance type. Ray fills each, its file's own values winning (`resources: {}`, Ray's own
    files' way of saying "detect it", gets everything; `{Custom1: 1}` gets CPUs and memory too)."""
    types = doc.get("available_node_types") or {}
    return sorted(
        n
        for n, t in types.items()
        if isinstance(t, Mapping)
        and isinstance(t.get("node_config"), Mapping)
        and t["node_config"].get("InstanceType")
    )


def fill_resources(doc: dict, region: str) -> str | None:
    """Fill `resources` of every node type, in place, as `ray up` does (what the instance type
    has, then the file's own values over it); None when done (or nothing to do), else why the
    API could not be asked (the types stay as the file has them)."""
    names = unfilled(doc)
    if not names:
        return None
    # only the types with an instance type: Ray's function stops at the first without one (a
    # launch template's), filling none; the others are filled as it would fill them
    typed = {name: doc["available_node_types"][name] for name in names}
    types = json.dumps(typed, sort_keys=True, default=str)
    try:
        # a run renders its config several times (check, probe, start): EC2 is asked once
        provider = json.dumps(doc.get("provider") or {}, sort_keys=True, default=str)
        filled = _filled(types, str(doc.get("head_node_type")), provider, region, _account())
    except AwsError as err:
        return str(err)
    for name in names:
        resources = filled[name].get("resources")
        if resources is not None:
            doc["available_node_types"][name]["resources"] = copy.deepcopy(resources)
    return None


def _account() -> tuple[str | None, ...]:
    """What decides which account and endpoint the SDK asks (a notebook may change them)."""
    import os

    names = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_DEFAULT_REGION")
    return tuple(os.environ.get(name) for name in names)


@functools.lru_cache(maxsize=16)
def _filled(types: str, head: str, provider: str, region: str, account: tuple) -> dict[str, Any]:
    """The node types with Ray's fill; an AwsError (not cached) where the API cannot be asked."""
    doc = {
        "available_node_types": json.loads(types),
        "head_node_type": head,
        "provider": {**json.loads(provider), "region": region},
    }
    probe(region, instance_types(doc))
    # Ray's launcher says what it does on stdout ("Creating AWS resource ec2"): a dry run's
    # stdout is the cluster YAML alone
    with contextlib.redirect_stdout(io.StringIO()):
        filled = internals.fill_aws_node_resources(doc)
    return copy.deepcopy(filled["available_node_types"])
