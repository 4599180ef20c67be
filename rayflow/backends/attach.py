"""backend=attach: join a Ray cluster that is already running. Never stops it."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
from pathlib import Path

import yaml

from rayflow.backends.base import ClusterBackend, Rendered, Traits, WorkerPreload
from rayflow.backends.handle import ClusterHandle
from rayflow.errors import ConfigError
from rayflow.runtime.ray_logs import shutdown_ray
from rayflow.security.auth import NODE_SERVERS, is_loopback, owned_privately, refuse_auth_off
from rayflow.security.redaction import mask_text


def _host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    host = host.rpartition("@")[2]  # ray://user:token@host:port
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            "backend.address",
            f"expected ray://HOST:PORT, HOST:PORT or auto; got {mask_text(address)!r}",
        )
    return host.strip("[]"), int(port)


def _local_cluster_address() -> str | None:
    """The GCS address of the cluster `ray start --head` left on this machine, if any, from
    Ray's `ray_current_cluster` file. Its folder (/tmp/ray) is anyone's to create, so the file
    is believed only if this user wrote it: refused (naming backend.address) when it is a
    symlink, another user's or writable by others, or its folder another user's symlink."""
    folder = Path(tempfile.gettempdir()) / "ray"
    current = folder / "ray_current_cluster"
    try:
        fd = os.open(current, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:  # ELOOP: a symlink, planted to point elsewhere; or not readable
        raise ConfigError(
            "backend.address",
            f"auto: {current} is a symlink or unreadable: not followed; "
            "give the cluster's address (HOST:PORT)",
        ) from None
    with os.fdopen(fd) as file:
        info = os.fstat(file.fileno())
        trusted = stat.S_ISREG(info.st_mode) and owned_privately(info) and _own_folder(folder)
        if not trusted:
            raise ConfigError(
                "backend.address",
                f"auto: {current} is not this user's own file (owner uid {info.st_uid}, "
                f"mode {stat.S_IMODE(info.st_mode):o}, or its folder another "
                "user's symlink): not followed; give the cluster's address (HOST:PORT)",
            )
        return file.read().strip() or None


def _own_folder(folder: Path) -> bool:
    """The folder holding ray_current_cluster is not a symlink someone else planted. (Ray makes
    /tmp/ray 0777 for every user; a file swapped in it is caught by the file's own owner.)"""
    info = folder.lstat()
    return not stat.S_ISLNK(info.st_mode) or info.st_uid == os.getuid()


class AttachedCluster(ClusterBackend):
    """Joins a running cluster; its stop() disconnects this process and leaves the cluster
    running."""

    def target(self) -> str:
        address = str(self.section.address or "").strip()
        if not address:
            raise ConfigError(
                "backend.address", "is empty; give ray://HOST:PORT, HOST:PORT or auto"
            )
        if address == "auto":
            found = _local_cluster_address()
            if not found:
                raise ConfigError(
                    "backend.address",
                    "auto found no running Ray cluster on this machine (ray start --head)",
                )
            return found
        return address

    # A property here: a cluster reached on loopback (or `auto`, the one `ray start` left here)
    # is taken as this machine's processes; one at another address, as separate machines.
    @property
    def traits(self) -> Traits:  # type: ignore[override]
        address = str(self.section.address or "").strip()
        here = address == "auto" or is_loopback(_host_port(address.removeprefix("ray://"))[0])
        return Traits(single_machine=here, joins_running=True)

    def check(self) -> None:
        # Refused wherever the cluster is, its address on loopback too: rayflow started none of
        # it, and every Ray cluster's nodes listen beyond loopback; this run's job, and the
        # secrets it forwards, would go to a cluster anyone who reaches it can run code on.
        refuse_auth_off(
            self.auth_mode,
            f"the cluster backend=attach joins ({mask_text(str(self.section.address))}) is Ray's: "
            f"its {NODE_SERVERS} listen on all interfaces or their node's address, even where it "
            "is reached on 127.0.0.1",
        )
        timeout = float(self.section.connect_timeout_s)  # its kind: rayflow.backends.keys.Attach
        address = self.target()
        host, port = _host_port(address.removeprefix("ray://"))
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError as err:
            reason = err.strerror or type(err).__name__
            raise ConfigError(
                "backend.address",
                f"cannot reach {mask_text(address)} "
                f"({reason}; waited up to {timeout:g} s, backend.connect_timeout_s)",
            ) from None

    def render(self, preload: WorkerPreload | None = None) -> Rendered:
        spec = {
            "backend": "attach",
            "address": mask_text(str(self.section.address)),
            "auth_mode": os.environ.get("RAY_AUTH_MODE", self.auth_mode),
            "lifecycle": "joined, never stopped by rayflow",
        }
        return Rendered(yaml.safe_dump(spec, sort_keys=False))

    def start(self, preload: WorkerPreload | None = None) -> ClusterHandle:
        import ray

        handle = ClusterHandle(self.name, address=self.target())
        with handle.unwound_on_error():
            ray.init(address=handle.address, log_to_driver=True)
            handle.on_stop("disconnect from the attached cluster (it keeps running)", shutdown_ray)
        return handle
