"""The process kubelet: Nodes of a real API server whose pods run as processes of this machine.

    python -m scripts.kube_local.kubelet --root DIR --kubeconfigs DIR --nodes a,b ...

For each Node it registers the Node (with its own client certificate, `system:node:NAME`, as the
Node authorizer and NodeRestriction expect), reports capacity (cpu, memory, pods, optionally a
made-up `nvidia.com/gpu`) and a Ready condition, renews its Lease every LEASE_RENEW_S, and
watches the pods the scheduler binds to it: each runs in a PodWorker (scripts/kube_local/pod.py)
with its own network namespace and address on the bridge (scripts/kube_local/net.py) and its own
folder (podfs.py). Names of Services reach the pods through their /etc/hosts (hosts.py).

What it does not do: pull or run images (a container's own command runs with this machine's Ray
first on PATH; an image outside `--images` fails as ErrImagePull), cgroups and resource limits,
the exec, logs, attach and port-forward APIs (a container's output is in its pod folder's
logs/), startup probes and lifecycle hooks, envFrom, and rotating service-account tokens.

SIGTERM or SIGINT stops every container at once (no grace: the control plane goes with it) and
removes every namespace it made.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import ipaddress
import json
import os
import secrets
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from scripts.kube_local import net
from scripts.kube_local.hosts import HostsWatcher
from scripts.kube_local.pod import PodWorker, now
from scripts.kube_local.volumes import decode

LEASE_RENEW_S, LEASE_S = 10, 40
WATCH_S = 60  # each watch is re-made after this, from a fresh list
DEFAULT_IMAGES = ("rayproject/ray*", "docker.io/rayproject/ray*", "quay.io/kuberay/*")


def _client(kubeconfig: Path):
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))
    return client.CoreV1Api(api), client.CoordinationV1Api(api)


def _raw(response) -> dict[str, Any]:
    return json.loads(response.data)


class Network:
    """Addresses and namespace names for pods, shared by every node of this kubelet."""

    def __init__(self, bridge: str, cidr: str, prefix: str):
        self.bridge, self.prefix = bridge, prefix
        self.network = ipaddress.ip_network(cidr)
        self.gateway = str(self.network[1])
        self.lock = threading.Lock()
        self.free = [str(a) for a in list(self.network.hosts())[19:]]
        self.count = 0

    def take(self) -> tuple[str, str, str]:
        with self.lock:
            if not self.free:
                raise net.NetError(f"no address left on {self.network} for another pod")
            self.count += 1
            ip = self.free.pop(0)
            ns, veth = f"{self.prefix}-p{self.count}", f"{self.prefix}-v{self.count}"
        net.add_netns(ns, veth, self.bridge, ip, self.network.prefixlen, self.gateway)
        return ip, ns, veth

    def give_back(self, ip: str, ns: str, veth: str) -> None:
        net.del_netns(ns)
        net.del_link(veth)
        with self.lock:
            self.free.append(ip)


class NodeAgent:
    """One Node: registration, Lease, pod watch, and what its pods ask of the API server."""

    def __init__(self, kubelet: Kubelet, name: str, kubeconfig: Path):
        self.kubelet, self.name = kubelet, name
        self.core, self.coordination = _client(kubeconfig)
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.Lock()
        self.stopping = kubelet.stopping
        self.root = kubelet.root / "pods"
        self.venv_bin = kubelet.venv_bin
        self.images = kubelet.images
        self.host_ip = kubelet.network.gateway
        self.sandboxes: dict[str, tuple[str, str, str]] = {}

    # --- the node itself ------------------------------------------------------------------------

    def register(self) -> None:
        from kubernetes.client.rest import ApiException

        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "rayflow.io/process-kubelet": "true",
        }
        try:
            self.core.create_node({"metadata": {"name": self.name, "labels": labels}})
        except ApiException as err:
            if err.status != 409:
                raise
        capacity = dict(self.kubelet.capacity)
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [
                {"type": "InternalIP", "address": self.host_ip},
                {"type": "Hostname", "address": self.name},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.36.3-process",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "process://rayflow",
                "kernelVersion": os.uname().release,
                "osImage": "this machine",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": "",
            },
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now(),
                    "lastTransitionTime": now(),
                }
            ],
        }
        self.core.patch_node_status(self.name, {"status": status})

    def renew_lease(self) -> None:
        from kubernetes.client.rest import ApiException

        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_S, "renewTime": stamp}
        try:
            self.coordination.patch_namespaced_lease(self.name, "kube-node-lease", {"spec": spec})
        except ApiException as err:
            if err.status != 404:
                raise
            self.coordination.create_namespaced_lease(
                "kube-node-lease", {"metadata": {"name": self.name}, "spec": spec}
            )

    # --- its pods -------------------------------------------------------------------------------

    def watch_pods(self) -> None:
        from kubernetes import watch

        selector = f"spec.nodeName={self.name}"
        while not self.stopping.is_set():
            listed = _raw(
                self.core.list_pod_for_all_namespaces(
                    field_selector=selector, _preload_content=False
                )
            )
            seen = {p["metadata"]["uid"] for p in listed["items"]}
            for pod in listed["items"]:
                self._seen(pod)
            with self.lock:
                gone = [w for uid, w in self.workers.items() if uid not in seen]
            for worker in gone:
                worker.deleted = True
            stream = watch.Watch().stream(
                self.core.list_pod_for_all_namespaces,
                field_selector=selector,
                resource_version=listed["metadata"]["resourceVersion"],
                timeout_seconds=WATCH_S,
            )
            for event in stream:
                if self.stopping.is_set():
                    break
                pod = event["raw_object"]
                if event["type"] == "DELETED":
                    with self.lock:
                        worker = self.workers.get(pod["metadata"]["uid"])
                    if worker:
                        worker.deleted = True
                elif event["type"] in ("ADDED", "MODIFIED"):
                    self._seen(pod)

    def _seen(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            worker = self.workers.get(uid)
            if worker is None:
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    return  # finished before this kubelet started
                worker = self.workers[uid] = PodWorker(self, pod)
                worker.thread.start()
                return
        worker.update(pod)

    def release(self, worker: PodWorker) -> None:
        """The worker has ended: its sandbox goes."""
        sandbox = self.sandboxes.pop(worker.uid, None)
        if sandbox:
            self.kubelet.network.give_back(*sandbox)
        if worker.folder:
            worker.folder.remove()
        with self.lock:
            self.workers.pop(worker.uid, None)
        self.kubelet.hosts_changed()

    def network_for(self, worker: PodWorker) -> tuple[str, str]:
        ip, ns, veth = self.kubelet.network.take()
        self.sandboxes[worker.uid] = (ip, ns, veth)
        return ip, ns

    def hosts_changed(self) -> None:
        self.kubelet.hosts_changed()

    def image_allowed(self, image: str) -> bool:
        return any(fnmatch.fnmatchcase(image, pattern) for pattern in self.images)

    def service_env(self) -> dict[str, str]:
        return self.kubelet.service_env

    def patch_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        scheduled = [
            c
            for c in (pod.get("status") or {}).get("conditions") or []
            if c["type"] == "PodScheduled"
        ]
        body = {"status": {**status, "conditions": scheduled + status["conditions"]}}
        try:
            self.core.patch_namespaced_pod_status(
                pod["metadata"]["name"], pod["metadata"]["namespace"], body
            )
        except ApiException as err:
            if err.status != 404:
                raise

    def event(
        self, pod: dict[str, Any], kind: str, reason: str, message: str, container: str = ""
    ) -> None:
        from kubernetes.client.rest import ApiException

        meta = pod["metadata"]
        stamp = now()
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        }
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        body = {
            "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}"},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "kubelet", "host": self.name},
            "reportingComponent": "kubelet",
            "reportingInstance": self.name,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(meta["namespace"], body)
        except ApiException as err:
            if err.status not in (403, 404):  # its namespace is going away
                raise

    def confirm_deletion(self, pod: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        meta = pod["metadata"]
        try:
            self.core.delete_namespaced_pod(
                meta["name"],
                meta["namespace"],
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            )
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    def read_keyed(self, kind: str, namespace: str, name: str) -> dict[str, bytes] | None:
        """A Secret's or ConfigMap's data (binaryData too), None when it does not exist."""
        from kubernetes.client.rest import ApiException

        read = (
            self.core.read_namespaced_secret
            if kind == "Secret"
            else self.core.read_namespaced_config_map
        )
        try:
            obj = _raw(read(name, namespace, _preload_content=False))
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        if kind == "Secret":
            return decode(obj.get("data"), binary=True)
        return {**decode(obj.get("data"), False), **decode(obj.get("binaryData"), True)}

    def service_account_token(self, pod: dict[str, Any], audience: str | None, seconds: int) -> str:
        meta = pod["metadata"]
        spec: dict[str, Any] = {
            "expirationSeconds": seconds,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            },
        }
        if audience:
            spec["audiences"] = [audience]
        answer = self.core.create_namespaced_service_account_token(
            pod["spec"].get("serviceAccountName") or "default", meta["namespace"], {"spec": spec}
        )
        return answer.status.token


class Kubelet:
    def __init__(self, args: argparse.Namespace):
        self.root = Path(args.root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.venv_bin = Path(sys.executable).parent
        self.images = tuple(args.images.split(",")) if args.images else DEFAULT_IMAGES
        self.capacity = {"cpu": args.cpu, "memory": args.memory, "pods": "110"}
        if args.gpus:
            self.capacity["nvidia.com/gpu"] = str(args.gpus)
        self.network = Network(args.bridge, args.network, args.prefix)
        self.service_env = {
            "KUBERNETES_SERVICE_HOST": args.api_host,
            "KUBERNETES_SERVICE_PORT": str(args.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(args.api_port),
            "KUBERNETES_PORT": f"tcp://{args.api_host}:{args.api_port}",
        }
        self.stopping = threading.Event()
        self.nodes = [
            NodeAgent(self, n, Path(args.kubeconfigs) / f"node-{n}.kubeconfig")
            for n in args.nodes.split(",")
        ]
        self.hosts = HostsWatcher(
            Path(args.kubeconfigs) / "local-dns.kubeconfig",
            self.stopping,
            Path(args.extra_hosts) if args.extra_hosts else None,
        )

    def hosts_changed(self) -> None:
        self.hosts.changed.set()

    def pods(self) -> list[PodWorker]:
        return [w for node in self.nodes for w in list(node.workers.values())]

    def run(self) -> None:
        for node in self.nodes:
            node.register()
            node.renew_lease()
        threads = [threading.Thread(target=n.watch_pods, daemon=True) for n in self.nodes]
        threads.append(threading.Thread(target=self.hosts.run, args=(self.pods,), daemon=True))
        for thread in threads:
            thread.start()
        print(f"kubelet: nodes {', '.join(n.name for n in self.nodes)} ready", flush=True)
        while not self.stopping.wait(LEASE_RENEW_S):
            for node in self.nodes:
                node.renew_lease()

    def stop(self) -> None:
        self.stopping.set()
        for worker in self.pods():
            worker.thread.join(timeout=30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="the kubelet's folder (pods' disks)")
    parser.add_argument("--kubeconfigs", required=True, help="folder of node-NAME.kubeconfig")
    parser.add_argument("--nodes", default="node-1")
    parser.add_argument("--bridge", required=True)
    parser.add_argument("--network", required=True, help="the bridge's subnet, e.g. 10.214.0.0/24")
    parser.add_argument("--prefix", default="rfk", help="of its namespaces' and links' names")
    parser.add_argument("--api-host", required=True)
    parser.add_argument("--api-port", type=int, required=True)
    parser.add_argument("--images", default="", help="comma-separated glob patterns")
    parser.add_argument("--cpu", default="4")
    parser.add_argument("--memory", default="8Gi")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument(
        "--extra-hosts", default="", help="a hosts file of the machine's to keep (the operator's)"
    )
    kubelet = Kubelet(parser.parse_args(argv))

    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        kubelet.run()
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        kubelet.stop()
        net.sweep(kubelet.network.prefix)


if __name__ == "__main__":
    main()
