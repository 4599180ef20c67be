"""backend=vm on aws and gcp: `ray up` with an end, and a teardown that finds every VM it made.

Ray's launcher creates the head VM, then waits for SSH on it for up to 900 s
(AUTOSCALER_NODE_START_WAIT_S) and runs the setup; a signal landing inside one of its cloud calls
interrupts Ray's code wherever it is, and a create call already sent makes its VM all the same.
So `launch` runs Ray's `create_or_update_cluster` in a daemon thread and this process's main
thread waits for it, at most `start_timeout_s`, taking Ctrl-C and SIGTERM (rayflow.runtime.signals)
at any moment. Whatever ends the wait early, the run's undo stack then calls `terminate_all`: every
VM of the cluster, found by its name and its run's owner tag (rayflow.backends.vm.owner) through
Ray's own node provider, is terminated (its provider's one way, rayflow.backends.vm.providers),
and while
the launcher is inside creating the head (between Ray's `acquiring_new_head_node` and
`head_node_acquired` events) the search goes on, so a VM whose create call was in flight when the
stop came is terminated too; a launcher that has not begun creating never does (its event
handler raises `Cancelled`). Workers are created by the head's autoscaler, never by this process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rayflow.backends.vm import internals, owner, providers
from rayflow.backends.vm.providers.base import Stop
from rayflow.errors import ClusterError


@dataclass
class Launch:
    """One `ray up` in its thread: what it is doing (Ray's last event), and how it ended."""

    name: str
    doing: str = "preparing the cluster config (IAM role, key pair, security group)"
    creating: bool = False
    cancelled: bool = False  # stopped: the launcher must not begin creating a VM
    up: bool = False  # `ray up` returned: the head runs Ray
    error: BaseException | None = None
    thread: threading.Thread | None = field(default=None, repr=False)

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


_DOING = {
    "acquiring_new_head_node": "creating the head VM",
    "head_node_acquired": "waiting for SSH on the head VM",
    "ssh_control_acquired": "syncing files to the head",
    "run_initialization_cmd": "running initialization_commands on the head",
    "run_setup_cmd": "running setup_commands on the head",
    "start_ray_runtime": "starting Ray on the head",
}


class Cancelled(Exception):
    """Raised in the launcher's thread, from Ray's event, where it would create a VM after the
    run was stopped (Ray calls event handlers inline, before its create call)."""


_STATE = threading.Lock()  # `creating` and `cancelled` change together


class _RayEvents:
    """Ray's launcher events, each handed to the launch running in the thread that raised it.
    Process-wide: Ray keeps its event callbacks in a global of this process
    (`sdk.register_callback_handler`) and calls them with the event alone, inline in the thread
    inside `ray up`; so they are registered once a process, here, and the launch an event is about
    is found by its thread. Its one instance is `_EVENTS`."""

    def __init__(self) -> None:
        self.launches: dict[int, Launch] = {}  # thread id -> the launch running in it
        self.registering = threading.Lock()
        self.registered = False

    def register(self) -> None:
        from ray.autoscaler import sdk

        with self.registering:
            if not self.registered:
                for event in internals.create_cluster_events():
                    sdk.register_callback_handler(event, self.on_event)
                self.registered = True

    @contextlib.contextmanager
    def running(self, launch: Launch) -> Iterator[None]:
        """The events raised in this thread while the block runs are `launch`'s."""
        self.launches[threading.get_ident()] = launch
        try:
            yield
        finally:
            self.launches.pop(threading.get_ident(), None)

    def on_event(self, data: dict[str, Any]) -> None:
        launch = self.launches.get(threading.get_ident())
        event = getattr(data.get("event_name"), "name", "")
        if launch is None or not event:
            return
        launch.doing = _DOING.get(event, launch.doing)
        with _STATE:
            if event == "acquiring_new_head_node":
                if launch.cancelled:
                    raise Cancelled(
                        f"cluster {launch.name}: stopped before its head VM was created"
                    )
                launch.creating = True
            elif event == "head_node_acquired":
                launch.creating = False


_EVENTS = _RayEvents()


def launch(
    up: Callable[[], None], name: str, timeout_s: float, handed: Launch, what: str = "backend=vm"
) -> None:
    """Run `up` (Ray's create_or_update_cluster) in a daemon thread and wait for it at most
    timeout_s; `handed` is filled in for `terminate_all`. Re-raises what `up` raised."""
    _EVENTS.register()

    def run() -> None:
        try:
            with _EVENTS.running(handed):
                up()
            handed.up = True
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread as it is
            handed.error = err

    handed.thread = threading.Thread(target=run, name=f"ray up {name}", daemon=True)
    handed.thread.start()
    deadline = time.monotonic() + timeout_s
    while handed.thread.is_alive():
        handed.thread.join(0.2)
        if handed.thread.is_alive() and time.monotonic() > deadline:
            raise ClusterError(
                f"backend.start_timeout_s: cluster {name} was not up within {timeout_s:g} s "
                f"(Ray's launcher was {handed.doing}); tearing down what it created"
            )
    if handed.error is not None:
        raise _one_line(handed.error, what) from None


# The cloud SDKs' own errors, raised inside Ray's launcher: what the API refused, said once.
CLOUD_ERRORS = ("botocore.", "googleapiclient.", "google.auth.")


def _one_line(err: BaseException, what: str) -> BaseException:
    from rayflow.security.redaction import mask_text

    if not type(err).__module__.startswith(CLOUD_ERRORS):
        return err
    text = mask_text(" ".join(str(err).split()))
    return ClusterError(f"{what}: `ray up` failed: the cloud API answered: {text[:400]}")


def terminate_all(config: dict[str, Any], handed: Launch) -> None:
    """Terminate every VM of the cluster that carries its run's owner tag (rayflow.backends.vm.
    owner), by its provider, until none is left and the launcher is not inside a create call
    (owner.SETTLE_TIMEOUT_S at most: long enough for one to come back and its VM to be listed).
    Another party's VMs of the same name are never selected."""
    with _STATE:  # from here on the launcher creates no VM; one being created is waited for
        handed.cancelled = True
    run_owner = owner.owner_of(config)
    if not run_owner:  # rendered at start for every node type: a config without it is a bug
        raise ClusterError(
            f"cluster {config['cluster_name']}: its config carries no {owner.OWNER_TAG} tag: "
            "nothing terminated"
        )
    providers.get(config["provider"]["type"]).terminate(
        Stop(
            config=config,
            owner=run_owner,
            came_up=handed.up,
            busy=lambda: handed.alive() and handed.creating,
        )
    )


def terminate_unless_up(config: dict[str, Any], handed: Launch) -> None:
    """A kept cluster is kept once `ray up` finished; a start cut short leaves no VM either."""
    if not handed.up:
        terminate_all(config, handed)


__all__ = ["Launch", "launch", "terminate_all", "terminate_unless_up"]
