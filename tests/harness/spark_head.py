"""Ray on Spark's head start without its fixed wait, for test_spark's processes.

setup_ray_cluster (ray.util.spark.cluster_init) starts the head node, then sleeps a fixed 20 s
(_RAY_HEAD_STARTUP_TIMEOUT) before one check that the head's GCS port is bound; its ready loop
then polls for worker nodes every 3 s. On this machine the head binds its ports in about 5 s: the
rest of the 20 s is a pure sleep, paid by every cluster the module starts (a dozen or so).

Here the head's start returns as soon as the ports picked for it are all bound (GCS, client
server, dashboard and dashboard agent: those another cluster started next could pick again),
never later than the 20 s it waited before, and the one check after it runs at once; the ready
loop polls every 0.5 s. Everything else of Ray on Spark runs as it is.

`enabled()` applies it to this process while its context is open, and puts the folder of a
`sitecustomize` that applies it on PYTHONPATH for the processes it starts (a rayflow run, a
kernel, a script, the benchmark): it patches the module once it is imported, and imports
nothing of Ray itself. A Ray without these names is left as it is (the tests are only slower).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

MODULE = "ray.util.spark.cluster_init"
POLL_S = 0.2
READY_POLL_S = 0.5
FOLDER = Path(__file__).parent / "spark_head_site"


def _head_ports(host: str, args: tuple, kwargs: dict) -> list[tuple[str, int]]:
    """The ports AutoscalingCluster.start(ray_head_ip, ray_head_port, ray_client_server_port,
    ray_temp_dir, dashboard_options, ...) gives the head."""
    names = ("ray_head_port", "ray_client_server_port", "ray_temp_dir", "dashboard_options")
    given = dict(zip(names, args, strict=False)) | kwargs
    ports = [int(given["ray_head_port"]), int(given["ray_client_server_port"])]
    for option in given.get("dashboard_options") or []:
        found = re.fullmatch(r"--dashboard-(?:agent-listen-)?port=(\d+)", str(option))
        if found:
            ports.append(int(found.group(1)))
    return [(host, port) for port in ports]


def patch(module: ModuleType) -> bool:
    """Patch an imported ray.util.spark.cluster_init; False (nothing done) if it is not as known."""
    names = ("_RAY_HEAD_STARTUP_TIMEOUT", "_RAY_CLUSTER_STARTUP_PROGRESS_CHECKING_INTERVAL")
    cls = getattr(module, "AutoscalingCluster", None)
    if cls is None or not all(hasattr(module, n) for n in names) or hasattr(cls, "_quick_head"):
        return False
    from ray.util.spark.utils import is_port_in_use

    wait_s = float(module._RAY_HEAD_STARTUP_TIMEOUT)
    start = cls.start

    def quick_start(self, ray_head_ip, *args, **kwargs):
        proc, tail = start(self, ray_head_ip, *args, **kwargs)
        ports = _head_ports(ray_head_ip, args, kwargs)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and proc.poll() is None:
            if all(is_port_in_use(h, p) for h, p in ports):
                break
            time.sleep(POLL_S)
        return proc, tail

    cls.start, cls._quick_head = quick_start, start
    module._RAY_HEAD_STARTUP_TIMEOUT = 0
    module._RAY_CLUSTER_STARTUP_PROGRESS_CHECKING_INTERVAL = READY_POLL_S
    return True


def unpatch(module: ModuleType, before: dict) -> None:
    cls = module.AutoscalingCluster
    if hasattr(cls, "_quick_head"):
        cls.start = cls._quick_head
        del cls._quick_head
    for name, value in before.items():
        setattr(module, name, value)


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """This process (patched now) and the Python processes it starts meanwhile (PYTHONPATH)."""
    import importlib

    module = importlib.import_module(MODULE)
    before = {
        n: getattr(module, n)
        for n in ("_RAY_HEAD_STARTUP_TIMEOUT", "_RAY_CLUSTER_STARTUP_PROGRESS_CHECKING_INTERVAL")
        if hasattr(module, n)
    }
    patched = patch(module)
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(FOLDER), path) if p)
    try:
        yield
    finally:
        if path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = path
        if patched:
            unpatch(module, before)


def install_import_hook() -> None:
    """For sitecustomize: patch the module when it is first imported (imports nothing now)."""
    import importlib.abc
    import importlib.machinery

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != MODULE:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    break
            else:
                return None
            loader = spec.loader
            exec_module = loader.exec_module

            def patched_exec(module):
                exec_module(module)
                patch(module)

            loader.exec_module = patched_exec  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())
