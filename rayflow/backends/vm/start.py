"""backend=vm: one start of a vm cluster, and what its two ways share (vm.fake_start: a
fake_multinode head on this machine; vm.sdk_start: local, aws and gcp through Ray's SDK).

`Start` is the run that claims the cluster's name and where its files are; `Starting` what a start
reads of its backend (VMCluster, rayflow.backends.vm.cluster, which imports the starts: they do
not import it). The command that tears the cluster down should this process die first, the line
saying a cluster is kept, the token's file, and the wait for a head's dashboard are the same for
both ways.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

from omegaconf import DictConfig

from rayflow.backends.handle import ClusterHandle
from rayflow.errors import ClusterError
from rayflow.security import ports
from rayflow.security.auth import auth_token, token_path


class Starting(Protocol):
    """What a start reads of its backend: VMCluster's section, auth mode and cluster YAML."""

    section: DictConfig
    auth_mode: str

    @property
    def provider(self) -> str: ...

    @property
    def keeps_cluster(self) -> bool: ...

    @property
    def cluster_yaml(self) -> str | None: ...

    def cluster_config(self, gcs_address: str | None = None) -> dict[str, Any]: ...


@dataclass
class Start:
    """One start of a vm cluster: the run that claims its name, and where its files are."""

    handle: ClusterHandle
    run_id: str
    name: str
    temp_dir: str = ""
    config_file: str = ""


def token_file() -> str | None:
    """The token's file, mounted on every node by path (its value never enters the config)."""
    path = token_path()
    return str(path) if auth_token() is not None and path.is_file() else None


def teardown_is(run: Start, path: str) -> None:
    """The command that stops this cluster should this process die first (printed on error
    paths); `path`, what it takes: a fake cluster's temp dir, else its cluster YAML."""
    run.handle.teardown_command = f"python -m rayflow.backends.vm.teardown {path}"


def kept_note(run: Start) -> None:
    print(
        f"[rayflow] vm: cluster {run.name} is kept running (backend.keep_cluster=true); "
        "a later run that names it joins it; see it with `rayflow status`, stop it with "
        f"`rayflow down {run.name}`",
        flush=True,
    )


def wait_for_dashboard(url: str, timeout_s: float, what: str) -> None:
    """Until the Jobs API answers (any HTTP status: 401 without a token still means up). Each
    try first looks up who listens on the port (rayflow.security.ports): another user's process
    there is refused in one line, and nothing is sent to it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ports.url_held(url, f"{what}: the dashboard"):
                with urllib.request.urlopen(f"{url}/api/version", timeout=5):
                    return
        except urllib.error.HTTPError:
            return
        # not (yet) the dashboard: nothing there, or another server on the port (HTTP/2 bytes)
        except (urllib.error.URLError, http.client.HTTPException, OSError):
            pass
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{what}: the dashboard at {url} did not answer within {timeout_s:g} s "
                "(backend.start_timeout_s)"
            )
        time.sleep(1.0)
