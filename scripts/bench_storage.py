"""object-storage: the same workload=cifar run (backend=local, synthetic data, --trials trials of
--epochs epochs, a checkpoint every epoch) with storage_path a local folder and with storage_path
on an S3-compatible store, each the whole command a user runs, alternating, the median of
--repeats. `ratio` = the store's wall / the folder's wall; both include Ray's start and stop.

The store is `--store s3://BUCKET/PATH` with the AWS settings of the environment (a real one, to
measure it), or by default a moto server (`moto[server]`, the test extra) started here on
loopback with a bucket of its own: what the store's protocol costs, without a network's latency.

--smoke: 2 trials of 1 epoch on 300 images, once."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench_common import log, smoke_option, wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _moto(folder: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A moto S3 server on loopback with one bucket: (its URI, the environment that reaches it)."""
    import boto3
    from botocore.exceptions import EndpointConnectionError

    port = _free_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench-secret",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    with open(folder / "moto.log", "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        client = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            region_name=env["AWS_REGION"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )

        def made() -> bool:
            try:
                client.create_bucket(Bucket="rayflow-bench")
            except EndpointConnectionError:  # not listening yet
                return False
            return True

        wait_for(made, 30, "moto S3 server answering", interval=0.2)
        yield "s3://rayflow-bench/runs", env
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _run(folder: Path, storage: str, env: dict[str, str], args) -> float:
    argv = [
        sys.executable,
        "-m",
        "rayflow",
        f"storage_path={storage}",
        f"data.root={folder / 'data'}",
        "data.synthetic=true",
        f"data.synthetic_train_size={args.images}",
        "data.synthetic_test_size=100",
        f"workload.num_samples={args.trials}",
        f"workload.max_epochs={args.epochs}",
        f"workload.scheduler.grace_period={args.epochs}",  # every trial runs every epoch
        "tracking=none",
        "backend.include_dashboard=false",
    ]
    started = time.monotonic()
    out = subprocess.run(argv, cwd=folder, env=env, stdout=sys.stderr, stderr=sys.stderr)
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"bench: the run with storage_path={storage} failed")
    return wall


def object_storage(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
        folder = Path(tmp)
        base = dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "token"))
        with contextlib.ExitStack() as stack:
            if args.store:
                store, env = args.store, base
            else:
                store, extra = stack.enter_context(_moto(folder))
                env = {**base, **extra}
            if not args.smoke:  # only measures: the data made once, caches warm
                _run(folder, str(folder / "warm"), env, args)
            local, remote = [], []
            for _ in range(args.repeats):
                local.append(_run(folder, str(folder / "runs"), env, args))
                remote.append(_run(folder, store, env, args))
                log(f"local folder {local[-1]:.1f} s, object store {remote[-1]:.1f} s")
    local_s, remote_s = statistics.median(local), statistics.median(remote)
    return {
        "name": "object-storage",
        "store": "moto on loopback" if not args.store else "given",
        "trials": args.trials,
        "epochs": args.epochs,
        "local_wall_s": round(local_s, 2),
        "store_wall_s": round(remote_s, 2),
        "ratio": round(remote_s / local_s, 3),
        "repeats": args.repeats,
    }


def object_storage_args(parser) -> None:
    parser.add_argument("--store", default=None, help="s3://BUCKET/PATH (default: moto here)")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--images", type=int, default=2000, help="synthetic training images")
    parser.add_argument("--repeats", type=int, default=3)
    smoke_option(parser, "no warm-up run", trials=2, epochs=1, images=300, repeats=1)
