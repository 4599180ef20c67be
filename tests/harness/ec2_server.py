"""An EC2 API here, in a network namespace that has nothing but its loopback interface.

moto's server mode (the `moto[server]` test extra) speaks EC2, IAM and STS over HTTP well enough
for Ray's AWS node provider and bootstrap (boto3) to create a cluster's IAM role, key pair,
security group and instances. The instances it hands out have addresses that are neither this
machine's nor the project's test hosts': anything that tries them (Ray's launcher waiting for
SSH on the head) must fail here, not send a packet out. So the server, and every process the
tests point at it, run inside a namespace of their own (`ip netns add`) whose only interface is
`lo`: an SSH or HTTP attempt at an instance address fails at once ("Network is unreachable").
Nothing talks to the server from the host's network: `call` runs boto3 inside the namespace too.

The server is moto's, started by `python -m tests.harness.ec2_moto` (a region that offers a few
instance types, so that `describe_instance_types`, which Ray's launcher pages through at each
`ray up`, answers in one page), with AWS's managed policies loaded (Ray's bootstrap attaches
AmazonEC2FullAccess and AmazonS3FullAccess to its role) and credentials checked: with
INITIAL_NO_AUTH_ACTION_COUNT=3 moto serves the harness's own first three requests (a user, its
key, a policy allowing everything) unchecked and checks every later one against its IAM, so a
wrong key is refused as AWS refuses it.

    with Ec2Namespace() as ec2:
        subprocess.run(ec2.argv(sys.executable, "-m", "rayflow", ...), env={**env, **ec2.env()})
        assert ec2.instances("rayflow", running_only=True) == []

Leaving the block kills every process in the namespace and deletes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

REGION = "us-west-2"
PORT = 5000  # the namespace's own loopback: no other process of this machine shares it
# What the namespace's region offers: the types of rayflow's defaults and of the tests' files.
OFFERED = ("m5.large", "m5.xlarge", "g4dn.xlarge", "t3.medium")
_UNCHECKED_REQUESTS = 3


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60, **kwargs)


class Ec2Namespace:
    def __init__(self) -> None:
        self.name = f"rf-ec2-{uuid.uuid4().hex[:8]}"
        self.folder = Path(tempfile.mkdtemp(prefix="rayflow-ec2-"))
        self.endpoint = f"http://127.0.0.1:{PORT}"
        self.server: subprocess.Popen | None = None
        self.access_key = self.secret_key = ""

    # --- the namespace -------------------------------------------------------------------

    def argv(self, *command: str) -> list[str]:
        """`command` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *command]

    def env(self) -> dict[str, str]:
        """What an AWS SDK inside the namespace needs: the endpoint, checked keys, a region;
        no instance metadata service (there is none to ask)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def call(self, service: str, method: str, env: dict | None = None, **kwargs: Any) -> Any:
        """One boto3 call, made inside the namespace; its answer as JSON data."""
        code = textwrap.dedent(f"""
            import json, sys, boto3
            client = boto3.client({service!r}, region_name={REGION!r})
            answer = getattr(client, {method!r})(**json.loads(sys.stdin.read()))
            answer.pop("ResponseMetadata", None)
            print(json.dumps(answer, default=str))
        """)
        out = _run(
            self.argv(sys.executable, "-c", code),
            input=json.dumps(kwargs),
            env={**os.environ, **self.env(), **(env or {})},
        )
        return json.loads(out.stdout)

    def instances(self, cluster: str, running_only: bool = False) -> list[dict]:
        """The instances tagged with Ray's cluster name (`ray-cluster-name`), as EC2 lists them."""
        filters = [{"Name": "tag:ray-cluster-name", "Values": [cluster]}]
        if running_only:
            states = ["pending", "running", "stopping", "stopped"]
            filters.append({"Name": "instance-state-name", "Values": states})
        answer = self.call("ec2", "describe_instances", Filters=filters)
        return [i for r in answer["Reservations"] for i in r["Instances"]]

    # --- life ------------------------------------------------------------------------------

    def __enter__(self) -> Ec2Namespace:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        _run(["ip", "netns", "add", self.name])
        _run(self.argv("ip", "link", "set", "lo", "up"))
        env = {
            **os.environ,
            "MOTO_IAM_LOAD_MANAGED_POLICIES": "true",
            "INITIAL_NO_AUTH_ACTION_COUNT": str(_UNCHECKED_REQUESTS),
        }
        server = [sys.executable, "-m", "tests.harness.ec2_moto", ",".join(OFFERED), str(PORT)]
        with open(self.folder / "moto.log", "w") as log:  # the server holds its own copy
            self.server = subprocess.Popen(
                self.argv(*server),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=Path(__file__).resolve().parents[2],
                start_new_session=True,
            )
        self._wait_ready()
        self._bootstrap()

    def _wait_ready(self, timeout_s: float = 60) -> None:
        probe = f"import urllib.request; urllib.request.urlopen('{self.endpoint}/moto-api/')"
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.server is not None
            if self.server.poll() is not None:
                raise RuntimeError((self.folder / "moto.log").read_text()[-3000:])
            if (
                subprocess.run(
                    self.argv(sys.executable, "-c", probe), capture_output=True
                ).returncode
                == 0
            ):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"moto did not answer in the namespace within {timeout_s} s")
            time.sleep(0.3)

    def _bootstrap(self) -> None:
        """The three requests moto serves unchecked: a user, its key, a policy allowing all."""
        anyone = {"AWS_ACCESS_KEY_ID": "bootstrap", "AWS_SECRET_ACCESS_KEY": "bootstrap"}
        self.call("iam", "create_user", env=anyone, UserName="rayflow-tests")
        key = self.call("iam", "create_access_key", env=anyone, UserName="rayflow-tests")
        self.access_key = key["AccessKey"]["AccessKeyId"]
        self.secret_key = key["AccessKey"]["SecretAccessKey"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
        self.call(
            "iam",
            "put_user_policy",
            env=anyone,
            UserName="rayflow-tests",
            PolicyName="all",
            PolicyDocument=json.dumps(policy),
        )

    def close(self) -> None:
        pids = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True)
        for pid in pids.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.server is not None:
            self.server.wait(timeout=30)
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True)
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)
