"""backend=attach: join a Ray cluster that is already running. Never stops it."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import yaml

from rayflow.backends.base import ClusterBackend
from rayflow.errors import ConfigError
from rayflow.redaction import mask_text


def _host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    host = host.rpartition("@")[2]  # ray://user:token@host:port
    if not sep or not host or not port.isdigit():
        raise ConfigError("backend.address", f"expected ray://HOST:PORT, HOST:PORT or auto; got {mask_text(address)!r}")
    return host.strip("[]"), int(port)


def _local_cluster_address() -> str | None:
    """The GCS address of the cluster `ray start --head` left on this machine, if any."""
    current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        return current.read_text().strip() or None
    except OSError:
        return None


class AttachedCluster(ClusterBackend):
    owns_cluster = False

    def target(self) -> str:
        address = str(self.section.address or "").strip()
        if not address:
            raise ConfigError("backend.address", "is empty; give ray://HOST:PORT, HOST:PORT or auto")
        if address == "auto":
            found = _local_cluster_address()
            if not found:
                raise ConfigError("backend.address", "auto found no running Ray cluster on this machine (ray start --head)")
            return found
        return address

    def check(self) -> None:
        timeout = float(self.section.connect_timeout_s)  # its kind: rayflow.schema.backends.Attach
        address = self.target()
        host, port = _host_port(address.removeprefix("ray://"))
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError as err:
            reason = err.strerror or type(err).__name__
            raise ConfigError("backend.address", f"cannot reach {mask_text(address)} ({reason}; waited up to {timeout:g} s, backend.connect_timeout_s)") from None

    def render(self) -> str:
        spec = {
            "backend": "attach",
            "address": mask_text(str(self.section.address)),
            "auth_mode": os.environ.get("RAY_AUTH_MODE", self.auth_mode),
            "lifecycle": "joined, never stopped by rayflow",
        }
        return yaml.safe_dump(spec, sort_keys=False)

    def start(self) -> str:
        import ray

        address = self.target()
        ray.init(address=address, log_to_driver=True)
        self.on_stop("disconnect from the attached cluster (it keeps running)", ray.shutdown)
        return address
