"""backend=local: an in-process Ray cluster on this machine, started with ray.init."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from rayflow.backends.base import ClusterBackend, Rendered, Traits, WorkerPreload
from rayflow.backends.handle import ClusterHandle
from rayflow.errors import ClusterError
from rayflow.runtime import ray_internals
from rayflow.runtime.environment import scoped_env
from rayflow.runtime.progress import phase
from rayflow.runtime.ray_logs import shutdown_ray
from rayflow.security import ports
from rayflow.security.auth import (
    NO_LOOPBACK,
    NODE_SERVERS,
    cache_dir,
    private_folder,
    private_token_folder,
    refuse_auth_off,
    secure_token_file,
)

DASHBOARD_PORT = 8265  # Ray's default; taken, the next free one (as Ray itself does)
# several runs starting at once on a loaded machine each hold it for a ray.init
PORT_LOCK_TIMEOUT_S = 300


DASHBOARD = "backend=local: the Ray dashboard"


def client_host(host: str) -> str:
    """Where this machine's clients reach a dashboard bound to `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def free_dashboard_port(host: str, first: int = DASHBOARD_PORT, tries: int = 100) -> int:
    """The first port from `first` on that `host` lets this process bind and nothing listens on
    where its clients connect (a listener on another address of the port, [::1] for localhost,
    could take their requests). Ray binds it later: `_start` then checks that the listener is
    this user's (rayflow.security.ports) before anything sends the token there."""
    for port in range(first, first + tries):
        if ports.listeners(client_host(host), port):
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port for the Ray dashboard on {host} in {first}-{first + tries - 1}")


def lock_dir() -> Path:
    """A folder for this user's locks that no one else can plant files in: $XDG_RUNTIME_DIR/rayflow,
    else ~/.cache/rayflow/locks ($XDG_CACHE_HOME's where set), else (a home that cannot be written)
    `rayflow-UID` in the temp dir; each made 0700 and refused if it is a symlink or another user's.
    A fixed name in a shared /tmp is anyone's: another user's file there crashed the run
    (PermissionError), or was followed."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    candidates = [Path(runtime) / "rayflow"] if runtime else []
    candidates += [
        cache_dir() / "locks",
        Path(tempfile.gettempdir()) / f"rayflow-{os.getuid()}",
    ]
    for candidate in candidates[:-1]:
        try:
            return private_folder(candidate)
        except (OSError, ClusterError):  # unwritable, or not ours: the next place
            continue
    return private_folder(candidates[-1])  # refused with a reason if planted by someone else


def local_cuda_devices() -> int:
    import torch  # only when a GPU is asked for

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class LocalCluster(ClusterBackend):
    traits = Traits(shares_filesystem=True, single_machine=True)  # its one node is this machine

    def check(self) -> None:
        # whatever backend.dashboard_host says: the node's own servers listen beyond loopback
        refuse_auth_off(
            self.auth_mode,
            f"with backend=local the {NODE_SERVERS} of Ray on this machine listen on all "
            f"interfaces or its address, whatever backend.dashboard_host says ({NO_LOOPBACK})",
        )

    def _gpus(self) -> float:
        b = self.section
        if b.num_gpus is not None:
            return float(b.num_gpus) if local_cuda_devices() else 0.0
        return float(local_cuda_devices())

    def capacity(self, resources: set[str]) -> list[dict[str, float]]:
        """One node: this machine, or what backend.num_cpus / num_gpus give Ray of it."""
        b = self.section
        node = {
            "CPU": float(b.num_cpus if b.num_cpus is not None else os.cpu_count() or 1),
            "memory": float(total_memory_bytes()),
        }
        if "GPU" in resources:  # counting GPUs imports torch: only when asked for
            node["GPU"] = self._gpus()
        return [node]

    def init_kwargs(self, preload: WorkerPreload | None = None) -> dict[str, Any]:
        b = self.section
        kwargs: dict[str, Any] = {
            "address": "local",  # always a new cluster, even when RAY_ADDRESS points elsewhere
            "num_cpus": b.num_cpus if b.num_cpus is not None else os.cpu_count(),
            "num_gpus": b.num_gpus,
            "object_store_memory": b.object_store_memory,
            "include_dashboard": bool(b.include_dashboard),
        }
        if self._preloads(preload):
            assert preload is not None
            # Ray's raylet starts one idle worker per CPU as it starts; with Ray's
            # preload_python_modules each imports the modules right away, while the driver still
            # sets up Tune, so a trial and its env runners start in warm processes. Ray's default
            # soft limit follows the CPUs left free, so a trial's placement group that takes them
            # all gets the idle workers killed before its actors can use them; keep as many as the
            # trials that run at once have processes (each holds its imports: ~0.45 GB for ppo).
            kwargs["_system_config"] = {
                "preload_python_modules": list(preload.modules),
                "num_workers_soft_limit": max(1, preload.processes),
            }
        if b.include_dashboard:
            kwargs["dashboard_host"] = b.dashboard_host
            if b.dashboard_port is not None:
                kwargs["dashboard_port"] = int(b.dashboard_port)
        return kwargs

    def _preloads(self, preload: WorkerPreload | None) -> bool:
        return bool(self.section.preload_worker_imports and preload is not None and preload.modules)

    def render(self, preload: WorkerPreload | None = None) -> Rendered:
        spec = {
            "backend": "local",
            "ray.init": self.init_kwargs(preload),
            "auth_mode": os.environ.get("RAY_AUTH_MODE", self.auth_mode),
        }
        return Rendered(yaml.safe_dump(spec, sort_keys=False))

    @contextlib.contextmanager
    def _own_dashboard(self, kwargs: dict[str, Any], handle: ClusterHandle) -> Iterator[None]:
        """Point every process of the cluster about to start at its own dashboard.

        A Ray process asking the state API with no address (Ray Train's placement-group cleaner
        and run-state actor do, to see whether the run's controller is alive) finds the
        machine's most recently started cluster, which need not be this one: another run's on
        the same machine, and Train then removes this run's placement group as if its
        controller were dead. RAY_API_SERVER_ADDRESS, set before the raylet starts, is inherited
        by every worker. So the dashboard's port is chosen here, not by Ray: under a lock, held
        until ray.init has bound it, so that two rayflow runs starting at once do not both
        choose the same free port."""
        if not kwargs["include_dashboard"]:
            yield
            return
        from filelock import FileLock, Timeout

        host = kwargs["dashboard_host"]
        lock = FileLock(str(lock_dir() / "dashboard-port.lock"))
        try:
            lock.acquire(timeout=PORT_LOCK_TIMEOUT_S)
        except Timeout:
            raise ClusterError(
                f"another Ray start of yours on this machine held {lock.lock_file} "
                f"for {PORT_LOCK_TIMEOUT_S} s "
                "(rayflow waits for it to choose a dashboard port)"
            ) from None
        try:
            kwargs.setdefault("dashboard_port", free_dashboard_port(host))
            url_host = client_host(host)
            # one another user holds already (backend.dashboard_port): refused before Ray starts
            ports.held(url_host, int(kwargs["dashboard_port"]), DASHBOARD)
            own_api = scoped_env(
                {"RAY_API_SERVER_ADDRESS": f"http://{url_host}:{kwargs['dashboard_port']}"}
            )
            own_api.__enter__()
            handle.on_stop("put back RAY_API_SERVER_ADDRESS", own_api.__exit__, None, None, None)
            yield
        finally:
            lock.release()

    def start(self, preload: WorkerPreload | None = None) -> ClusterHandle:
        handle = ClusterHandle(self.name)
        with handle.unwound_on_error():
            handle.address = self._start(handle, preload)
        return handle

    def _start(self, handle: ClusterHandle, preload: WorkerPreload | None) -> str:
        import ray

        kwargs = self.init_kwargs(preload)
        gpus = f", num_gpus={kwargs['num_gpus']:g}" if kwargs["num_gpus"] is not None else ""
        if self._preloads(preload):
            assert preload is not None
            self._warm_workers_env(handle, preload)
        token = os.environ.get("RAY_AUTH_MODE", self.auth_mode) == "token"
        if token:
            # ray.init writes a token it generates 0644: into a folder only this user can enter
            private_token_folder()
        with phase(
            f"starting Ray on this machine (ray.init, num_cpus={kwargs['num_cpus']}{gpus})", "local"
        ):
            with self._own_dashboard(kwargs, handle):
                context = ray.init(**kwargs, log_to_driver=True)
        if token:
            secure_token_file()  # and the file itself 0600
        # the GCS, raylet and dashboard this call started
        node = ray_internals.local_node()
        # Undo steps run newest first: a clean shutdown, then whatever of the node it left.
        handle.on_stop(
            "kill what is left of the local Ray node",
            node.kill_all_processes,
            check_alive=False,
            allow_graceful=False,
        )
        handle.on_stop("ray.shutdown() of the local cluster", shutdown_ray)
        if kwargs["include_dashboard"]:
            # the port was chosen before Ray bound it: the listener must be this user's before
            # anything sends the token there (Ray Train's state API calls do)
            where = client_host(kwargs["dashboard_host"])
            ports.wait_held(where, int(kwargs["dashboard_port"]), DASHBOARD, timeout_s=30)
        # ray.init is typed to return BaseContext; a local start returns its RayContext subclass
        return str(context.address_info["address"])

    @staticmethod
    def _warm_workers_env(handle: ClusterHandle, preload: WorkerPreload) -> None:
        """Workers started ahead of use import the workload's modules, the user's own among them
        (workload=tune's trainable module): from the folder rayflow runs in, as the trials will (Ray
        gives them the driver's directory, py_driver_sys_path, once the job registers). torch sizes
        its thread pool when it is imported: Ray sets OMP_NUM_THREADS to a task's CPUs only when it
        gives the worker the task, after a prestarted worker has imported torch with one thread per
        core, and 1-CPU trials then fight over the cores (6-13x slower on 2 cores). So the workers
        start with the count a trial process reserves."""
        env = {
            "PYTHONPATH": os.pathsep.join(
                p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p
            )
        }
        if "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(max(1, preload.threads))
        workers_env = scoped_env(env)
        workers_env.__enter__()
        handle.on_stop(
            "put back PYTHONPATH and OMP_NUM_THREADS", workers_env.__exit__, None, None, None
        )


__all__ = ["LocalCluster"]
