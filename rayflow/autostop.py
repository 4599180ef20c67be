"""`python -m rayflow.autostop`: the watcher that tears an idle cluster down, running on the
cluster itself, so a kept cluster stops when the laptop that kept it is closed.

rayflow submits it as a Ray Job of the cluster it watches (rayflow.orchestrator.autostop: its
submission id starts with `rayflow-autostop-`, it asks for no CPU, and it counts as no activity).
Every POLL_S it asks the head's own dashboard (found through the GCS: `dashboard_url`) whether
the cluster is in use (rayflow.runtime.activity: a job pending or running, a driver connected,
demand waiting); after
`idle_minutes` of none it starts the teardown, in a process of its own session (Ray kills a
job's process group when its supervisor dies, which the teardown makes happen). The teardown is
the engine's: its spec names its backend, whose registry entry names the function that stops
its clusters from their head (rayflow.backends.idle_stop: vm's `kept.stop_idle`, kuberay's), so
this watcher knows no engine.

The spec comes in the environment (RAYFLOW_AUTOSTOP, JSON), never on the command line, which names
only the cluster (so `rayflow down` of a fake cluster finds the watcher among its processes).
A dashboard that stops answering for UNREACHABLE_S means the cluster went another way: it exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
from typing import Any

from rayflow.errors import ClusterError

SPEC_ENV = "RAYFLOW_AUTOSTOP"
POLL_S = 10.0
UNREACHABLE_S = 120.0


def _headers() -> dict[str, str]:
    from rayflow.security.auth import auth_token

    token = auth_token() if os.environ.get("RAY_AUTH_MODE", "token") == "token" else None
    return {"Authorization": f"Bearer {token}"} if token else {}


def dashboard_url(spec: dict[str, Any]) -> str:
    """The dashboard of the cluster this job runs on, as its GCS records it (the head's own port,
    whatever a user's manifest or cluster YAML made it), else the spec's guess. A GCS client is
    not a driver: asking counts as no activity."""
    from rayflow.runtime import ray_internals

    address = os.environ.get(ray_internals.ray_address_env_var())
    if not address or "://" in address:
        return str(spec["dashboard"])
    found = ray_internals.dashboard_address_from_gcs(address, timeout_s=30)
    if not found:
        return str(spec["dashboard"])
    host, _, port = found.decode().rpartition(":")
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]", "") else host  # all interfaces: ours
    return f"http://{host}:{port}"


def _asked(url: str) -> Any:
    """The cluster's activity, asked with the token only once the dashboard's port is known to
    be held by this user (rayflow.security.ports; a dashboard that died frees it for anyone)."""
    from rayflow.runtime.activity import activity
    from rayflow.security.ports import url_held

    if not url_held(url, "the dashboard"):
        raise OSError(f"nothing listens at {url}")
    return activity(url, _headers())


def watch(spec: dict[str, Any]) -> bool:
    """Until the cluster has been idle for spec["idle_minutes"]: True; False when its dashboard
    stopped answering (the cluster is going or gone)."""
    url, idle_s = dashboard_url(spec), float(spec["idle_minutes"]) * 60
    print(
        f"[autostop] watching {url}: idle {idle_s / 60:g} min tears this cluster down", flush=True
    )
    idle_since = seen = time.time()
    said = ""
    while True:
        now = time.time()
        try:
            found = _asked(url)
        except ClusterError as err:  # another user's process holds the port: nothing was sent
            print(f"[autostop] {err}: not watching", flush=True)
            return False
        except (urllib.error.URLError, OSError, ValueError) as err:
            if now - seen > UNREACHABLE_S:
                print(f"[autostop] the dashboard at {url} is gone ({err}): nothing to stop")
                return False
            time.sleep(POLL_S)
            continue
        seen = now
        if found.busy:
            idle_since = now
        elif found.last_active:
            idle_since = max(idle_since, found.last_active)
        line = "; ".join(found.busy) or "idle"
        if line != said:  # each change once: the job's log stays short
            print(f"[autostop] {line}", flush=True)
            said = line
        if not found.busy and now - idle_since >= idle_s:
            print(f"[autostop] idle for {idle_s / 60:g} min: tearing the cluster down", flush=True)
            return True
        time.sleep(POLL_S)


def main(argv: list[str]) -> int:
    spec = json.loads(os.environ[SPEC_ENV])
    if argv[:1] == ["--now"]:  # the teardown, in a session of its own
        from rayflow.backends import idle_stop

        idle_stop(spec["backend"])(spec)  # the engine's own, found in the registry
        return 0
    if not watch(spec):
        return 0
    subprocess.Popen(
        [sys.executable, "-m", "rayflow.autostop", "--now", *argv],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
