"""A container of the process kubelet: its environment as the kubelet builds it, its process, and
its probes.

- **Environment** (`environment`): each `env` entry in order, a `value` with `$(VAR)` expanded
  from the entries before it (`$$(VAR)` stays literal, an unknown `$(VAR)` is left as written, as
  the kubelet does), or a `valueFrom`: `fieldRef` (the pod's name, namespace, uid, labels and
  annotations, node, service account, IPs), `resourceFieldRef`, `secretKeyRef` and
  `configMapKeyRef` (read by the caller's `lookup`, `optional` honoured). `envFrom` is not
  supported (MissingEnv). `command` and `args` get the same `$(VAR)` expansion.
- **Process** (`Process`): the container's PID 1 (tini) is the child of `unshare`; signals go to
  it, so a SIGTERM reaches the whole process group and a SIGKILL ends the PID namespace.
- **Probes** (`probe`): exec (in the container's namespaces), httpGet (to the pod's IP; 200-399
  passes) and tcpSocket, each bounded by its timeoutSeconds.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from scripts.kube_local.podfs import enter_argv

_VAR = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


class MissingEnv(RuntimeError):
    """A referenced Secret, ConfigMap or key is missing (the kubelet's CreateContainerConfigError)."""


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names replaced, `$$` an escaped `$`, others as written."""

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR.sub(one, text)


def field(pod: dict[str, Any], path: str) -> str:
    """A fieldRef's value from the pod as the API server has it."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    keyed = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if keyed:
        return (meta.get(keyed.group(1)) or {}).get(keyed.group(2), "")
    values = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs") or []),
    }
    if path not in values:
        raise MissingEnv(f"fieldRef {path} is not supported by this kubelet")
    return values[path] or ""


def _resource(container: dict[str, Any], ref: dict[str, Any]) -> str:
    kind, _, name = ref["resource"].partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None:
        return "0"
    divisor = str(ref.get("divisor") or "1")
    if name == "cpu":  # whole cores, rounded up, as the kubelet does for the default divisor
        millis = float(value[:-1]) / 1000 if str(value).endswith("m") else float(value)
        per = float(divisor[:-1]) / 1000 if divisor.endswith("m") else float(divisor)
        return str(max(1, -(-int(millis * 1000) // int(per * 1000))))
    return str(value)


def environment(
    pod: dict[str, Any],
    container: dict[str, Any],
    lookup: Callable[[str, str, str], str | None],
    base: dict[str, str],
) -> dict[str, str]:
    """`base` (what every container gets) then the container's `env`, in order.
    lookup(kind, name, key): a Secret's or ConfigMap's value, None when either is missing."""
    if container.get("envFrom"):
        raise MissingEnv("envFrom is not supported by this kubelet")
    env = dict(base)
    for entry in container.get("env") or []:
        name = entry["name"]
        source = entry.get("valueFrom")
        if source is None:
            env[name] = expand(entry.get("value") or "", env)
        elif "fieldRef" in source:
            env[name] = field(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = _resource(container, source["resourceFieldRef"])
        else:
            kind, ref = (
                ("Secret", source["secretKeyRef"])
                if "secretKeyRef" in source
                else ("ConfigMap", source["configMapKeyRef"])
            )
            value = lookup(kind, ref["name"], ref["key"])
            if value is None:
                if ref.get("optional"):
                    continue
                raise MissingEnv(
                    f'{kind.lower()} "{ref["name"]}" or its key "{ref["key"]}" not found'
                )
            env[name] = value
    return env


def argv(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The container's command and args, expanded. No image, so no entrypoint: one is needed."""
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    if not words:
        raise MissingEnv("no command: this kubelet has no image to take an entrypoint from")
    return [expand(w, env) for w in words]


class Process:
    """A started container: `pid1` is tini's PID on this machine once it has started."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log = open(log, "ab")  # noqa: SIM115  (the container's, closed when it ends)
        self.started_at = time.time()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid1: int | None = None

    def find_pid1(self, timeout: float = 10.0) -> int | None:
        deadline = time.monotonic() + timeout
        while self.pid1 is None and time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                children = psutil.Process(self.proc.pid).children()
                if children:
                    self.pid1 = children[0].pid
                    break
            time.sleep(0.05)
        return self.pid1

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and not self.log.closed:
            self.log.close()
        return code

    def signal(self, sig: int) -> None:
        """To tini (it passes SIGTERM on to the process group); before it exists, to unshare."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid1 or self.proc.pid, sig)

    def stop(self, grace: float) -> int:
        """SIGTERM, then SIGKILL after `grace` seconds: its exit code."""
        if self.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=max(grace, 0.1))
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        return self.poll()  # type: ignore[return-value]


def probe(spec: dict[str, Any], pod_ip: str, process: Process, env: dict[str, str]) -> str | None:
    """Run one probe: None when it passes, else what failed, worded as the kubelet's Event."""
    timeout = float(spec.get("timeoutSeconds") or 1)
    if "exec" in spec:
        if process.pid1 is None:
            return "the container has not started"
        try:
            done = subprocess.run(
                enter_argv(process.pid1, spec["exec"]["command"]),
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return f"command timed out after {timeout:g}s"
        return None if done.returncode == 0 else (done.stdout + done.stderr).strip()[-300:]
    port = spec.get("httpGet", spec.get("tcpSocket", {})).get("port")
    if not isinstance(port, int):
        return f"port {port!r}: only numbers are supported by this kubelet"
    if "tcpSocket" in spec:
        try:
            socket.create_connection((pod_ip, port), timeout=timeout).close()
            return None
        except OSError as err:
            return f"dial tcp {pod_ip}:{port}: {err}"
    path = spec["httpGet"].get("path") or "/"
    try:
        connection = http.client.HTTPConnection(pod_ip, port, timeout=timeout)
        connection.request("GET", path)
        status = connection.getresponse().status
        connection.close()
    except OSError as err:
        return f'Get "http://{pod_ip}:{port}{path}": {err}'
    return None if 200 <= status < 400 else f"HTTP probe failed with statuscode: {status}"
