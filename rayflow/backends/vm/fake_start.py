"""backend=vm provider=fake_multinode: the head on this machine, worker nodes started by its
autoscaler as processes here.

rayflow starts the head itself (`RAY_FAKE_CLUSTER=1 ray start --head`, with an autoscaling config
it writes completely) in a temp dir of its own, on ports it chooses, and stops exactly the
processes that name that dir (its provider's stop, rayflow.backends.vm.providers.fake_multinode).
A cluster not kept is this run's alone and needs no record; a kept one is recorded (vm.state), so
a later run that names it joins it, and never stops it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from rayflow.backends.vm import kept as vm_kept
from rayflow.backends.vm import owned, providers, state
from rayflow.backends.vm.commands import head_args
from rayflow.backends.vm.config import launcher_env
from rayflow.backends.vm.providers.base import Stop
from rayflow.backends.vm.start import (
    Start,
    Starting,
    kept_note,
    teardown_is,
    token_file,
    wait_for_dashboard,
)
from rayflow.errors import ClusterError
from rayflow.runtime.processes import pids_mentioning
from rayflow.runtime.progress import phase
from rayflow.security.redaction import mask_text

# The head's ports beside its GCS and dashboard that rayflow chooses (`ray start --head` flags)
OWN_PORTS = (
    "dashboard-agent-listen-port",
    "ray-client-server-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports free now: held open together while they are chosen, since a port
    closed at once may be handed out again by the next bind (Ray refuses one port given to two
    of its components). Ray binds them later, so another user may take one in between: Ray's
    components fail on a port they cannot bind, and the dashboard's listener is checked to be
    this user's before anything is sent to it (`wait_for_dashboard`)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def start(vm: Starting, run: Start) -> str:
    """The dashboard URL of the fake cluster this run starts, or of the kept one it joins."""

    # A cluster rayflow starts here is its own temp dir: one not kept is this run's alone and
    # needs no record; a kept one is recorded, so a later run that names it can join it.
    def running(kept: dict[str, Any] | None) -> bool:
        return bool(kept and kept.get("temp_dir") and pids_mentioning(kept["temp_dir"]))

    kept = state.claim(
        run.name,
        run.run_id,
        vm.provider,
        vm.keeps_cluster,
        running,
        record_new=vm.keeps_cluster,
    )
    run.handle.on_stop("let go of the cluster's name", state.release, run.name, run.run_id)
    if kept:
        return _join(run, kept)
    # a short name: Ray's socket paths in it stay < 108 chars; 0700 (mkdtemp), holding the
    # autoscaling config and Ray's own temp dir, which Ray makes 0777 (vm.owned.RAY_TEMP)
    run.temp_dir = tempfile.mkdtemp(prefix="rf-vm-")
    teardown_is(run, run.temp_dir)
    _register_teardown(vm, run)
    url = _head(vm, run)
    run.handle.where = vm_kept.where_fake(vm.provider, run.temp_dir, url)
    run.handle.autostop = vm_kept.autostop_fake(run.temp_dir, url)
    if vm.keeps_cluster:
        state.update(run.name, run.run_id, temp_dir=run.temp_dir, url=url, stop=run.temp_dir)
        kept_note(run)
    return url


def _join(run: Start, kept: dict[str, Any]) -> str:
    """The dashboard URL of the kept fake cluster this run now holds (it never stops it)."""
    run.temp_dir, url = kept["temp_dir"], kept.get("url")
    teardown_is(run, run.temp_dir)
    run.handle.kept = run.handle.joined = True
    run.handle.owner_run = kept.get("owner_run") or run.handle.owner_run
    run.handle.where = vm_kept.where_fake(str(kept["provider"]), run.temp_dir, str(url or ""))
    try:
        if not url:  # the run that kept it died before its head answered
            raise ClusterError("no dashboard recorded")
        wait_for_dashboard(url, 10, "backend=vm")
    except ClusterError:
        raise ClusterError(
            f"backend=vm: the kept cluster {run.name} does not answer at {url}: stop it with "
            f"python -m rayflow.backends.vm.teardown {run.temp_dir}"
        ) from None
    print(
        f"[rayflow] vm: joining the kept cluster {run.name} ({mask_text(run.temp_dir)}); "
        "it keeps running after this run",
        flush=True,
    )
    kept_note(run)
    return str(url)


def _register_teardown(vm: Starting, run: Start) -> None:
    """Its provider's stop, each step on the undo stack (the first runs first, and a step that
    fails keeps none of the others from running)."""
    if not vm.keeps_cluster:  # keep_cluster=true leaves it for a later run that names it
        steps = providers.get(vm.provider).stop_steps(Stop(path=run.temp_dir))
        for what, step in reversed(steps):
            run.handle.on_stop(what, step)


def _head(vm: Starting, run: Start) -> str:
    """`ray start --head` of a fake_multinode cluster in its temp dir; its dashboard URL once it
    answers."""
    from ray.util import get_node_ip_address

    port, dashboard, *others = _free_ports(6)
    config = vm.cluster_config(gcs_address=f"{get_node_ip_address()}:{port}")
    run.config_file = os.path.join(run.temp_dir, "autoscaling.yaml")
    Path(run.config_file).write_text(yaml.safe_dump(config))
    command = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        f"--port={port}",
        f"--dashboard-port={dashboard}",
        "--dashboard-host=127.0.0.1",
        f"--temp-dir={os.path.join(run.temp_dir, owned.RAY_TEMP)}",
        *head_args(config),
        f"--autoscaling-config={run.config_file}",
        # every port of its own: other Ray clusters on this machine keep theirs
        *(f"--{flag}={free}" for flag, free in zip(OWN_PORTS, others, strict=True)),
        "--disable-usage-stats",
    ]
    env = dict(
        os.environ,
        **launcher_env(vm.section, vm.auth_mode, token_file(), provider=vm.provider),
    )
    # jobs on this head run `python`: this venv's, as the fake nodes do
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    # Ray processes asking the state API with no address (Ray Train's placement-group
    # cleaner) would ask the machine's latest cluster, not this one (see backends/local.py)
    env["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{dashboard}"
    timeout = float(vm.section.start_timeout_s)
    with phase(f"starting a fake_multinode head in {run.temp_dir} (ray start --head)", "vm"):
        try:
            subprocess.run(
                command,
                env=env,
                check=True,
                timeout=timeout,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        except subprocess.CalledProcessError as err:
            last = (err.stderr or "").strip().splitlines()[-1:] or [f"exit code {err.returncode}"]
            raise ClusterError(
                f"backend=vm: ray start --head failed: {mask_text(last[0])}"
            ) from None
    url = f"http://127.0.0.1:{dashboard}"
    with phase(f"waiting for the head's dashboard at {url}", "vm"):
        wait_for_dashboard(url, timeout, "backend=vm")
    return url
