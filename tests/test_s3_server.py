"""scripts/servers/s3.py: a moto S3 server that pyarrow reaches through the standard AWS
variables only, that refuses wrong credentials, and that leaves no process or file behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import psutil
import pytest

from scripts.servers.s3 import S3Server, s3_server

# What a Ray worker does with storage_path=s3://...: pyarrow finds the endpoint, the key and the
# region in its environment and nowhere else. It writes the object its argument names, then
# prints the bucket's keys.
PYARROW = """
import sys
import pyarrow.fs as pafs

fs, path = pafs.FileSystem.from_uri(sys.argv[1])
try:
    with fs.open_output_stream(path) as f:
        f.write(b"checkpoint")
except OSError as e:
    sys.exit(str(e))
bucket = path.split("/")[0]
print(" ".join(i.path for i in fs.get_file_info(pafs.FileSelector(bucket, recursive=True))))
"""


def _pyarrow(s3: S3Server, uri: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3.env(), **settings)
    argv = [sys.executable, "-c", PYARROW, uri]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def _moto_children() -> set[int]:
    """This process's moto servers (a session's, e.g. the local Kubernetes stack's, among them)."""
    return {
        p.pid for p in psutil.Process().children(recursive=True) if "moto.server" in p.cmdline()
    }


def test_pyarrow_through_the_environment_and_wrong_credentials_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the server's log folder goes
    before = _moto_children()
    with s3_server() as s3:
        pid = s3.pid
        assert pid is not None and s3.endpoint.startswith("http://127.0.0.1:")
        assert list(tmp_path.iterdir())  # its log folder

        good = _pyarrow(s3, s3.uri("ckpt/a"))
        assert good.returncode == 0, good.stderr
        assert sorted(good.stdout.split()) == ["rayflow-test/ckpt", "rayflow-test/ckpt/a"]
        assert s3.objects() == ["ckpt/a"] and s3.objects("ckpt/") == ["ckpt/a"]

        wrong_secret = _pyarrow(s3, s3.uri("ckpt/b"), AWS_SECRET_ACCESS_KEY="wrong" + s3.secret_key)
        assert "SIGNATURE_DOES_NOT_MATCH" in wrong_secret.stderr, wrong_secret.stderr
        unknown_key = _pyarrow(s3, s3.uri("ckpt/b"), AWS_ACCESS_KEY_ID="AKIA0000000000000000")
        assert "INVALID_ACCESS_KEY_ID" in unknown_key.stderr, unknown_key.stderr
        assert s3.objects() == ["ckpt/a"]  # nothing landed

    assert s3.pid is None
    assert not psutil.pid_exists(pid) and _moto_children() <= before
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nothing left in its process group
    with pytest.raises(OSError):
        socket.create_connection((s3.host, int(s3.endpoint.rsplit(":", 1)[1])), timeout=2).close()
    assert not list(tmp_path.iterdir())
    s3.close()  # again: nothing to do


def test_a_start_that_fails_part_way_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = _moto_children()
    # moto refuses a name of 2 characters (boto3 does not): the server was up, then the start failed
    with pytest.raises(Exception, match="InvalidBucketName"):
        with S3Server(bucket="ab"):
            pass
    assert _moto_children() <= before and not list(tmp_path.iterdir())
