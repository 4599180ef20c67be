"""`python -m rayflow.autostop`: the watcher that tears an idle cluster down, running on the
cluster itself, so a kept cluster stops when the laptop that kept it is closed.

rayflow submits it as a Ray Job of the cluster it watches (rayflow.orchestrator.autostop: its
submission id starts with `rayflow-autostop-`, it asks for no CPU, and it counts as no activity).
Every POLL_S it asks the head's own dashboard (found through the GCS: `dashboard_url`) whether
the cluster is in use (rayflow.runtime.activity: a job pending or running, a driver connected,
demand waiting); after
`idle_minutes` of none it starts the teardown its spec names, in a process of its own session
(Ray kills a job's process group when its supervisor dies, which the teardown makes happen):

- `processes` (vm fake_multinode): every process naming the cluster's temp dir, then the folder;
- `ssh_hosts` (vm SSH hosts): `ray stop` on each worker host over SSH, then on the head, from the
  config and key Ray's launcher left on the head;
- `node_provider` (vm aws/gcp): the cluster's nodes that carry its owner tag (`owner` in the spec)
  terminated through Ray's node provider, with the head's own instance role or service account;
- `raycluster` (kuberay): the RayCluster deleted through the Kubernetes API as the head pod's
  service account, whose Role allows that one object (rayflow.backends.kuberay.kept).

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
from pathlib import Path
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


def _stop_processes(spec: dict[str, Any]) -> None:
    from rayflow.backends.vm.kept import not_rayflows, stop_fake

    # never stop processes by, or remove, a path that is not this user's fake cluster's
    problem = not_rayflows(spec["temp_dir"], fake=True)
    if problem:
        print(f"[autostop] {problem}", flush=True)
        return
    stop_fake(spec["temp_dir"])


def _stop_ssh_hosts(spec: dict[str, Any]) -> None:
    """`ray stop` on each worker host over SSH, the hosts' keys pinned per cluster in the head
    user's own cache (rayflow.security.ssh, as from the client), then on the head, which stops
    even where a worker could not be reached."""
    import yaml

    from rayflow.backends.vm.kept import stop_local_workers

    config = yaml.safe_load((Path.home() / "ray_bootstrap_config.yaml").read_text())
    try:
        stop_local_workers(config)  # its auth names the key the launcher copied to the head
    except ClusterError as err:  # a worker address that is not a host: never passed to ssh
        print(f"[autostop] {err}", flush=True)
    subprocess.run(["ray", "stop"], timeout=300, check=False)


def _stop_node_provider(spec: dict[str, Any]) -> None:
    """The cluster's VMs that carry its owner tag (rayflow.backends.vm.owner), workers first,
    then the head itself; another party's VMs of the same name are never selected."""
    import yaml
    from ray.autoscaler.tags import NODE_KIND_HEAD

    from rayflow.backends.vm import owner

    run_owner = str(spec.get("owner") or "")
    if not run_owner:
        print(f"[autostop] no {owner.OWNER_TAG} in the spec: nothing terminated", flush=True)
        return
    config = yaml.safe_load((Path.home() / "ray_bootstrap_config.yaml").read_text())
    provider = owner.provider_of(config)
    found = owner.nodes(provider, run_owner)
    heads = set(owner.nodes(provider, run_owner, NODE_KIND_HEAD))
    workers = [node for node in found if node not in heads]
    if workers:
        provider.terminate_nodes(workers)
    if heads:  # itself last
        provider.terminate_nodes(sorted(heads))


# Where Kubernetes mounts a pod's service account (its token, the API server's CA)
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def _delete_raycluster(spec: dict[str, Any]) -> None:
    """DELETE this RayCluster (by uid) as the head pod's service account, the way in-cluster
    clients reach the API server; its Role allows exactly that."""
    import ssl
    import urllib.request

    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    host = f"[{host}]" if ":" in host else host
    url = (
        f"https://{host}:{port}/apis/ray.io/v1/namespaces/{spec['namespace']}"
        f"/rayclusters/{spec['name']}"
    )
    options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
    options.update(propagationPolicy="Background", preconditions={"uid": spec["uid"]})
    request = urllib.request.Request(
        url,
        data=json.dumps(options).encode(),
        method="DELETE",
        headers={
            "Authorization": f"Bearer {(SERVICE_ACCOUNT / 'token').read_text().strip()}",
            "Content-Type": "application/json",
        },
    )
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            print(f"[autostop] deleted RayCluster {spec['name']} ({answer.status})", flush=True)
    except urllib.error.HTTPError as err:  # 404: gone already; 409: another of the name
        print(f"[autostop] the API server answered {err.code}: {err.read()[:300]!r}", flush=True)


TEARDOWNS = {
    "processes": _stop_processes,
    "ssh_hosts": _stop_ssh_hosts,
    "node_provider": _stop_node_provider,
    "raycluster": _delete_raycluster,
}


def main(argv: list[str]) -> int:
    spec = json.loads(os.environ[SPEC_ENV])
    if argv[:1] == ["--now"]:  # the teardown, in a session of its own
        TEARDOWNS[spec["kind"]](spec)
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
