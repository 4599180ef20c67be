"""scripts/kube-local.sh: a local Kubernetes to run `python -m rayflow backend=kuberay` against.

    eval "$(sudo scripts/kube-local.sh up)"     # prints export lines, and nothing else on stdout
    python -m rayflow backend=kuberay backend.image=rayproject/ray:2.60.0 backend.job_pip=[] \\
        storage_path=$RAYFLOW_LOCAL_BUCKET/runs
    sudo scripts/kube-local.sh down

`up` starts a supervisor process that holds everything in `with` blocks, the same LocalKube the
tests use plus an S3-compatible server (moto) and an `mlflow server`, both on the bridge's
address so that pods reach them, then prints what a run from this machine needs once all of it
answers. `down` asks the supervisor to stop (SIGTERM), which unwinds those blocks, waits for it,
and then sweeps whatever still carries the local names (a killed supervisor's leftovers).

Its state (the supervisor's PID, its log, the kubeconfigs, the servers' data) lives in
`--state` (default /run/rayflow-kube-local), 0700.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from scripts.kube_local import build, net
from scripts.kube_local.local import REPO, LocalKube

DEFAULT_STATE = Path("/run/rayflow-kube-local")
UP_TIMEOUT_S = 180.0  # a cold machine: the control plane, two servers, the Nodes


def _exports(kube: LocalKube, s3, mlflow_url: str) -> str:
    values = {
        "KUBECONFIG": str(kube.kubeconfig),
        **s3.env(),
        "RAYFLOW_LOCAL_BUCKET": s3.uri().rstrip("/"),
        "MLFLOW_TRACKING_URI": mlflow_url,
    }
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in values.items())


def serve(state: Path, nodes: tuple[str, ...]) -> None:
    """The supervisor: everything up, the exports written, then wait for SIGTERM."""
    from scripts.servers.mlflow import mlflow_server
    from scripts.servers.s3 import S3Server

    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(LocalKube(state / "kube", build.binaries(), nodes))
        s3 = stack.enter_context(S3Server(host=kube.address, bucket="rayflow-local"))
        url, _ = stack.enter_context(mlflow_server(state / "mlflow", host=kube.address))
        ready = state / "exports"
        ready.with_suffix(".tmp").write_text(_exports(kube, s3, url))
        ready.with_suffix(".tmp").rename(ready)
        print("kube-local: up", flush=True)
        signal.pause()


def up(state: Path, nodes: tuple[str, ...]) -> int:
    if (state / "supervisor.pid").exists():
        print(f"kube-local: already up (state in {state}); `down` first", file=sys.stderr)
        return 1
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    log = open(state / "supervisor.log", "wb")  # noqa: SIM115  (the supervisor's own copy stays)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.kube_local.cli", "serve", f"--state={state}"]
        + [f"--nodes={','.join(nodes)}"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    (state / "supervisor.pid").write_text(str(proc.pid))
    while not (state / "exports").exists():
        if proc.poll() is not None or time.monotonic() - started > UP_TIMEOUT_S:
            why = "exited" if proc.poll() is not None else f"not up within {UP_TIMEOUT_S:g} s"
            tail = (state / "supervisor.log").read_text(errors="replace")[-2000:]
            print(f"kube-local: the supervisor {why}; its log:\n{tail}", file=sys.stderr)
            down(state)
            return 1
        time.sleep(0.2)
    sys.stdout.write((state / "exports").read_text())
    print(f"kube-local: up in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


def down(state: Path) -> int:
    pid_file = state / "supervisor.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not net.wait(lambda: not _alive(pid), timeout=120, interval=0.2):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    net.sweep("rfk")
    shutil.rmtree(state, ignore_errors=True)
    print("kube-local: down", file=sys.stderr)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # our child's zombie, when `up` itself is stopping it
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/kube-local.sh", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=["up", "down", "serve"])
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    parser.add_argument("--nodes", default="node-1,node-2")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("kube-local: needs root (network namespaces, a bridge, mounts)", file=sys.stderr)
        return 2
    nodes = tuple(args.nodes.split(","))
    if args.action == "serve":
        serve(args.state, nodes)
        return 0
    return up(args.state, nodes) if args.action == "up" else down(args.state)


if __name__ == "__main__":
    sys.exit(main())
