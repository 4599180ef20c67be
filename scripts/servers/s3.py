"""A real S3-compatible server here, with credentials it checks, for the object-storage tests.

It is moto's server mode (`python -m moto.server`, the `moto[server]` test extra): one
process, up in about a second, that speaks S3's REST API well enough for pyarrow's
S3 filesystem (Ray Tune's checkpoints to s3://), boto3 and anything else built on an AWS SDK,
and keeps everything in memory (nothing to clean but the process). MinIO would need a binary
from outside the package registries; moto is a wheel.

Credentials are real in the sense that matters to a test: wrong ones are refused. moto checks
no credentials by default; with INITIAL_NO_AUTH_ACTION_COUNT=N it serves the first N
authorizable requests unchecked and checks every one after that against its own IAM: the
access key must exist (else 403 InvalidAccessKeyId), the SigV4 signature must match its secret
(else 403 SignatureDoesNotMatch) and a policy must allow the action (else 403 AccessDenied).
The harness spends exactly that budget on what it needs: an IAM user, an access key for it,
a policy allowing s3:* on *, and the bucket; then it checks that an unknown key is refused, so
a moto that counted otherwise fails here instead of letting every later test pass unchecked.
(Requests without any signature get a 500 from moto 5.2: refused too, if not politely. Its
/moto-api/ endpoints are never checked: whoever reaches the port could turn the checks off,
which is why the server binds to the given host only, loopback by default.)

    from scripts.servers.s3 import s3_server

    with s3_server() as s3:                      # or: with S3Server(host=..., bucket=...) as s3:
        env = {**os.environ, **s3.env()}         # all an AWS SDK needs (or monkeypatch.setenv)
        subprocess.run([..., f"storage_path={s3.uri('runs')}"], env=env, ...)
        assert s3.objects("runs/") == [...]      # the keys that landed, sorted

The server (its process group) is killed and its temporary folder (its log) removed when the
block ends, or when starting fails part way.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REGION = "us-east-1"
# The requests _bootstrap makes before moto starts checking credentials: create_user,
# create_access_key, put_user_policy, create_bucket (only requests moto authorizes count;
# the readiness probe on /moto-api/ does not).
_UNCHECKED_REQUESTS = 4
_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class S3Server:
    """A moto S3 server on `host`, with `bucket` made and an access key allowed s3:* on it."""

    def __init__(
        self, host: str = "127.0.0.1", bucket: str = "rayflow-test", start_timeout: float = 30.0
    ) -> None:
        self.host = host
        self.bucket = bucket
        self.region = REGION
        self.start_timeout = start_timeout
        self.endpoint = ""
        self.access_key = ""
        self.secret_key = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="rayflow-s3-"))
        try:
            port = _free_port(self.host)
            self.endpoint = f"http://{self.host}:{port}"
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(_UNCHECKED_REQUESTS)
            argv = [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(port)]
            with open(self._dir / "moto.log", "wb") as log:  # the child holds its own copy
                self._proc = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            self._wait_ready()
            self._bootstrap()
        except BaseException:
            self.close()
            raise

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        try:
            return (self._dir / "moto.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        probe = f"{self.endpoint}/moto-api/config"  # a request moto serves without credentials
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
        deadline = time.monotonic() + self.start_timeout
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"moto server exited ({self._proc.returncode}) before answering on "
                    f"{self.endpoint}; its log:\n{self._log_tail()}"
                )
            try:
                with opener.open(probe, timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # an answer all the same
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"moto server did not answer GET {probe} within {self.start_timeout:g} s;"
                        f" its log:\n{self._log_tail()}"
                    ) from None
                time.sleep(0.05)

    def _client(self, service: str, access_key: str, secret_key: str) -> Any:
        import boto3
        import botocore.session
        from botocore.config import Config

        # none of this shell's AWS profile or config files: (config key, variable, default, type)
        files = dict.fromkeys(("config_file", "credentials_file"), (None, None, os.devnull, None))
        core = botocore.session.Session(session_vars={"profile": (None, None, None, None), **files})

        config = Config(
            connect_timeout=5,
            read_timeout=30,
            retries={"total_max_attempts": 1},  # a retried bootstrap request would spend budget
            proxies={},
            s3={"addressing_style": "path"},
        )
        session = boto3.session.Session(
            access_key, secret_key, region_name=REGION, botocore_session=core
        )
        return session.client(service, endpoint_url=self.endpoint, config=config)

    def _bootstrap(self) -> None:
        import botocore.exceptions

        iam = self._client("iam", "unchecked", "unchecked")
        user = "rayflow-test"
        iam.create_user(UserName=user)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(_POLICY))
        self._client("s3", "unchecked", "unchecked").create_bucket(Bucket=self.bucket)
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        try:  # the budget is spent: an unknown key must be refused from now on
            self._client("s3", "unchecked", "unchecked").head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as e:
            status = e.response["ResponseMetadata"]["HTTPStatusCode"]
            if status == 403:
                return
            raise RuntimeError(
                f"moto at {self.endpoint}: an unknown key got {status}, not 403"
            ) from e
        raise RuntimeError(f"moto at {self.endpoint} served an unknown access key: no auth")

    @property
    def pid(self) -> int | None:
        """The server's process id (it leads a process group of its own); None once closed."""
        return self._proc.pid if self._proc is not None else None

    def env(self) -> dict[str, str]:
        """The variables an AWS SDK (boto3, pyarrow, Ray) needs to use this server and bucket."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",  # never probe 169.254.169.254 for credentials
        }

    def uri(self, path: str = "") -> str:
        return f"s3://{self.bucket}/{path.lstrip('/')}"

    def objects(self, prefix: str = "") -> list[str]:
        """The keys in the bucket under `prefix`, sorted."""
        s3 = self._client("s3", self.access_key, self.secret_key)
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def read(self, key: str) -> bytes:
        """The object's bytes."""
        s3 = self._client("s3", self.access_key, self.secret_key)
        return s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        folder, self._dir = self._dir, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def s3_server(
    host: str = "127.0.0.1", bucket: str = "rayflow-test", start_timeout: float = 30.0
) -> Iterator[S3Server]:
    """A started S3Server (see the module's docstring), stopped when the block ends."""
    with S3Server(host, bucket, start_timeout) as server:
        yield server
