"""A pod's volumes as files in its folder, as the kubelet's volume plugins lay them out.

emptyDir (a folder, `medium: Memory` too: this kubelet has no tmpfs per volume), secret and
configMap (one file per key, or per `items` entry, at `defaultMode`), downwardAPI, and projected
(serviceAccountToken from the TokenRequest API, bound to the pod; configMap; secret;
downwardAPI). Secrets and ConfigMaps are read with the Node's own identity, which the Node
authorizer allows only for those the node's pods name. A missing one, or any other volume type,
is a VolumeError: the pod waits, with the kubelet's FailedMount Event.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scripts.kube_local.containers import MissingEnv, field

if TYPE_CHECKING:
    from scripts.kube_local.kubelet import NodeAgent
    from scripts.kube_local.podfs import PodFolder

TOKEN_SECONDS = 3607  # what the ServiceAccount admission plugin asks for


class VolumeError(RuntimeError):
    pass


def _write(folder: Path, relative: str, data: bytes, mode: int) -> None:
    path = folder / relative
    if ".." in Path(relative).parts or Path(relative).is_absolute():
        raise VolumeError(f"volume path {relative!r} leaves the volume")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _keyed(
    agent: NodeAgent, namespace: str, kind: str, source: dict[str, Any], folder: Path, mode: int
) -> None:
    """A Secret's or ConfigMap's keys as files (all, or its `items`)."""
    name = source.get("name") or source.get("secretName")
    data = agent.read_keyed(kind, namespace, name)
    if data is None:
        if source.get("optional"):
            return
        raise VolumeError(f'MountVolume.SetUp failed: {kind.lower()} "{name}" not found')
    items = source.get("items") or [{"key": k, "path": k} for k in data]
    for item in items:
        if item["key"] not in data:
            raise VolumeError(f'{kind.lower()} "{name}": no key "{item["key"]}"')
        _write(folder, item["path"], data[item["key"]], item.get("mode", mode))


def _downward(pod: dict[str, Any], items: list[dict[str, Any]], folder: Path, mode: int) -> None:
    for item in items:
        if "fieldRef" not in item:
            raise VolumeError("downwardAPI: only fieldRef items are supported by this kubelet")
        try:
            value = field(pod, item["fieldRef"]["fieldPath"])
        except MissingEnv as err:
            raise VolumeError(str(err)) from None
        _write(folder, item["path"], value.encode(), item.get("mode", mode))


def _projected(agent: NodeAgent, pod: dict[str, Any], source: dict[str, Any], folder: Path):
    mode = source.get("defaultMode", 0o644)
    namespace = pod["metadata"]["namespace"]
    for part in source.get("sources") or []:
        if "serviceAccountToken" in part:
            spec = part["serviceAccountToken"]
            token = agent.service_account_token(
                pod, spec.get("audience"), spec.get("expirationSeconds", TOKEN_SECONDS)
            )
            _write(folder, spec["path"], token.encode(), mode)
        elif "configMap" in part:
            _keyed(agent, namespace, "ConfigMap", part["configMap"], folder, mode)
        elif "secret" in part:
            _keyed(agent, namespace, "Secret", part["secret"], folder, mode)
        elif "downwardAPI" in part:
            _downward(pod, part["downwardAPI"].get("items") or [], folder, mode)
        else:
            raise VolumeError(f"projected source {sorted(part)} is not supported by this kubelet")


def materialise(agent: NodeAgent, pod: dict[str, Any], pod_folder: PodFolder) -> dict[str, Path]:
    """Each volume of the pod, written in its folder: {volume name: its folder}."""
    found = {}
    namespace = pod["metadata"]["namespace"]
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        folder = pod_folder.volume(name)
        if "emptyDir" in volume:
            pass
        elif "secret" in volume:
            source = volume["secret"]
            _keyed(agent, namespace, "Secret", source, folder, source.get("defaultMode", 0o644))
        elif "configMap" in volume:
            source = volume["configMap"]
            _keyed(agent, namespace, "ConfigMap", source, folder, source.get("defaultMode", 0o644))
        elif "downwardAPI" in volume:
            source = volume["downwardAPI"]
            _downward(pod, source.get("items") or [], folder, source.get("defaultMode", 0o644))
        elif "projected" in volume:
            _projected(agent, pod, volume["projected"], folder)
        else:
            kinds = sorted(k for k in volume if k != "name")
            raise VolumeError(f"volume {name}: {kinds} is not supported by this kubelet")
        found[name] = folder
    return found


def decode(data: dict[str, str] | None, binary: bool) -> dict[str, bytes]:
    """A Secret's `data` (base64) or a ConfigMap's `data` as bytes."""
    if binary:
        return {k: base64.b64decode(v) for k, v in (data or {}).items()}
    return {k: v.encode() for k, v in (data or {}).items()}
