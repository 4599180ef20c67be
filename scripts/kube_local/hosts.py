"""The cluster's names in each pod's /etc/hosts: this kubelet's stand-in for cluster DNS.

A Service `S` of namespace `N` is named `S.N.svc.cluster.local`, `S.N.svc` and `S.N` in every
pod, and `S` in the pods of `N` (what a pod's DNS search path gives). Its addresses are its
endpoints' (EndpointSlices labelled with its name), ready ones only unless the Service publishes
not-ready addresses, as cluster DNS answers for a headless Service. There is no kube-proxy here,
so a Service with a cluster IP is named with its endpoints' addresses too (docs/testing.md).
Each pod also names itself (its hostname, its IP).

The watcher reads Services and EndpointSlices with its own identity (`local-dns`, bound to a
ClusterRole allowing only that, as CoreDNS's is) every POLL_S, or at once when a pod is added, and
rewrites a pod's file in place only when its text changes.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scripts.kube_local.pod import PodWorker

POLL_S = 1.0


def addresses(services: list[dict[str, Any]], slices: list[dict[str, Any]]) -> dict[tuple, list]:
    """{(namespace, service): [IP, ...]} from the Services and their EndpointSlices."""
    publish = {
        (s["metadata"]["namespace"], s["metadata"]["name"]): bool(
            s["spec"].get("publishNotReadyAddresses")
        )
        for s in services
    }
    found: dict[tuple, list] = defaultdict(list)
    for piece in slices:
        labels = piece["metadata"].get("labels") or {}
        key = (piece["metadata"]["namespace"], labels.get("kubernetes.io/service-name"))
        if key not in publish:
            continue
        for endpoint in piece.get("endpoints") or []:
            ready = (endpoint.get("conditions") or {}).get("ready") is not False
            if ready or publish[key]:
                found[key] += [a for a in endpoint.get("addresses") or [] if a not in found[key]]
    return found


def hosts_text(namespace: str, hostname: str, ip: str | None, found: dict[tuple, list]) -> str:
    lines = ["127.0.0.1\tlocalhost"]
    if ip:
        lines.append(f"{ip}\t{hostname}")
    for (ns, service), ips in sorted(found.items()):
        names = [f"{service}.{ns}.svc.cluster.local", f"{service}.{ns}.svc", f"{service}.{ns}"]
        if ns == namespace:
            names.append(service)
        lines += [f"{address}\t{' '.join(names)}" for address in ips]
    return "\n".join(lines) + "\n"


class HostsWatcher:
    def __init__(self, kubeconfig: Path, stopping: threading.Event, extra: Path | None = None):
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core, self.discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
        self.stopping = stopping
        self.changed = threading.Event()
        self.extra = extra  # a process of the machine's that needs the names (the operator)

    def _read(self) -> dict[tuple, list]:
        services = json.loads(
            self.core.list_service_for_all_namespaces(_preload_content=False).data
        )["items"]
        slices = json.loads(
            self.discovery.list_endpoint_slice_for_all_namespaces(_preload_content=False).data
        )["items"]
        return addresses(services, slices)

    def run(self, pods: Callable[[], list[PodWorker]]) -> None:
        written: dict[str, str] = {}
        while not self.stopping.is_set():
            self.changed.wait(POLL_S)
            self.changed.clear()
            found = self._read()
            if self.extra is not None:
                text = hosts_text("", "", None, found)
                if written.get("extra") != text:
                    _rewrite(self.extra, text)
                    written["extra"] = text
            for worker in pods():
                if worker.folder is None:
                    continue
                text = hosts_text(worker.namespace, worker.hostname(), worker.ip, found)
                if written.get(worker.uid) != text:
                    worker.folder.write_hosts(text)
                    written[worker.uid] = text


def _rewrite(path: Path, text: str) -> None:
    """In place: a bind mount of the file keeps its inode."""
    with open(path, "r+") as f:
        f.write(text)
        f.truncate()
