"""Can the cluster ever place what the workload asks for? Checked twice.

Before anything starts: each workload declares its demand (`demand(cfg)`: the resource
bundles one trial or run needs at once) and each backend that knows its size declares
its nodes (`capacity()`); a bundle no node can hold, or a total the whole cluster cannot,
is refused with the key that asked for it.

While running, for clusters whose size only they know (attach, autoscaling): a watch
thread reads the resource demands pending in Ray's GCS (what `ray status` shows) and,
when one no alive node could ever hold stays pending for `schedule_timeout_s` while
the cluster does not grow, fails the run with one line instead of waiting forever.
"""

from __future__ import annotations

import _thread
import threading
import time
from dataclasses import dataclass

from rayflow.errors import ConfigError
from rayflow.runtime import ray_internals

RESOURCE_KEYS = {"CPU": "cpu", "GPU": "gpu", "memory": "memory"}


@dataclass(frozen=True)
class Bundle:
    """What one placement of a trial or run needs: `count` copies of `resources` at once."""

    what: str  # "a trial", "a Train worker", "an env runner"
    resources: dict  # Ray resource name -> amount
    keys: dict  # Ray resource name -> the config key that sets it
    count: int = 1
    count_key: str | None = None  # the key that sets `count`, e.g. workload.num_workers


def section_bundle(
    cfg, what: str, prefix: str, count: int = 1, count_key: str | None = None
) -> Bundle:
    """A Bundle from a `resources_per_*` section with cpu, gpu and optional memory (bytes)."""
    from omegaconf import OmegaConf

    section = OmegaConf.select(cfg, prefix)
    amounts = {
        "CPU": section.get("cpu"),
        "GPU": section.get("gpu"),
        "memory": section.get("memory"),
    }
    return Bundle(
        what,
        {k: float(v) for k, v in amounts.items() if v},
        {k: f"{prefix}.{name}" for k, name in RESOURCE_KEYS.items()},
        count,
        count_key,
    )


def _fmt(resources: dict) -> str:
    return ", ".join(
        f"{v / 2**30:.1f} GiB {k}" if k == "memory" else f"{v:g} {k}"
        for k, v in resources.items()
        if v
    )


def copies_at_once(bundle: Bundle, nodes: list[dict]) -> int:
    """How many placements of `bundle` the nodes hold at once, each node filled on its own."""
    need = {k: v for k, v in bundle.resources.items() if v}
    return sum(
        min((int(node.get(k, 0.0) // v) for k, v in need.items()), default=0) for node in nodes
    )


def _fits(bundle: dict, node: dict) -> bool:
    return all(node.get(k, 0.0) >= v for k, v in bundle.items() if v)


def check_fits(bundles: list[Bundle], nodes: list[dict], backend: str) -> None:
    """Raise ConfigError when a bundle fits no node, or all bundles together exceed the cluster."""
    for b in bundles:
        if any(_fits(b.resources, n) for n in nodes):
            continue
        for name, amount in b.resources.items():
            biggest = max((n.get(name, 0.0) for n in nodes), default=0.0)
            if amount and biggest < amount:
                raise ConfigError(
                    b.keys.get(name, name),
                    f"{b.what} asks for {_fmt({name: amount})} but the biggest node of "
                    f"backend={backend} offers {_fmt({name: biggest}) or 'none'}",
                )
        raise ConfigError(
            next(iter(b.keys.values())),
            f"{b.what} asks for {_fmt(b.resources)} but no single node of backend={backend} has "
            "all of it",
        )
    for name in {k for b in bundles for k in b.resources}:
        total = sum(b.resources.get(name, 0.0) * b.count for b in bundles)
        offered = sum(n.get(name, 0.0) for n in nodes)
        if total > offered:
            big = max(bundles, key=lambda b: b.resources.get(name, 0.0) * b.count)
            parts = " + ".join(
                f"{b.count} × {_fmt({name: b.resources[name]})} ({b.what})"
                for b in bundles
                if b.resources.get(name)
            )
            raise ConfigError(
                big.count_key or big.keys.get(name, name),
                f"needs {parts} = {_fmt({name: total})} at once, but backend={backend} offers "
                f"{_fmt({name: offered})} in all",
            )


# --- while running --------------------------------------------------------------------

_DEAD = 2  # autoscaler.proto NodeStatus.DEAD


def unplaceable(state) -> list[str]:
    """The pending demands (ClusterResourceState from the GCS) that no alive node could hold
    even when idle: tasks and actors by shape, placement groups by strategy."""
    nodes = [dict(n.total_resources) for n in state.node_states if n.status != _DEAD]
    found = []
    for request in state.pending_resource_requests:
        shape = dict(request.request.resources_bundle)
        if not any(_fits(shape, n) for n in nodes):
            found.append(f"{request.count} × {{{_fmt(shape)}}}")
    for gang in state.pending_gang_resource_requests:
        shapes = [dict(r.resources_bundle) for r in gang.requests]
        strict_pack = "STRICT_PACK" in gang.details
        whole = {k: sum(s.get(k, 0.0) for s in shapes) for k in {k for s in shapes for k in s}}
        fits = (
            any(_fits(whole, n) for n in nodes)
            if strict_pack
            else all(any(_fits(s, n) for n in nodes) for s in shapes)
            and all(sum(n.get(k, 0.0) for n in nodes) >= v for k, v in whole.items())
        )
        if not fits:
            found.append(f"a placement group of {len(shapes)} bundles ({_fmt(whole)} in all)")
    return found


class PlacementWatch:
    """Fails the run (by interrupting the main thread, which Tune and Ray Train answer by
    stopping and saving their state) when a demand stays unplaceable for `timeout_s`."""

    def __init__(self, timeout_s: float, hint: str, interval_s: float = 2.0):
        self.timeout_s, self.hint, self.interval_s = timeout_s, hint, interval_s
        self.message: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="rayflow-placement-watch", daemon=True
        )

    def _run(self) -> None:
        from ray.autoscaler.v2.sdk import get_cluster_resource_state

        gcs = ray_internals.driver_gcs_client()
        since, nodes_seen = None, -1
        while not self._stop.wait(self.interval_s):
            # Broad on purpose: a watch that fails must never fail the run it watches; whatever the
            # autoscaler's state call raises (the cluster is going away), nothing is left to watch.
            try:
                state = get_cluster_resource_state(gcs)
            except Exception:  # noqa: BLE001
                return
            alive = sum(1 for n in state.node_states if n.status != _DEAD)
            stuck = unplaceable(state)
            if not stuck or since is None or alive > nodes_seen:
                # fine, new, or the cluster grew: the clock starts anew
                since, nodes_seen = (time.monotonic() if stuck else None), alive
                continue
            if time.monotonic() - since >= self.timeout_s:
                biggest = max(
                    (dict(n.total_resources) for n in state.node_states if n.status != _DEAD),
                    key=lambda n: n.get("CPU", 0.0),
                    default={},
                )
                self.message = (
                    f"schedule_timeout_s: {stuck[0]} could not be placed for {self.timeout_s:g} s: "
                    "no node of the cluster can hold it (the biggest has "
                    f"{_fmt({k: biggest[k] for k in RESOURCE_KEYS if k in biggest})}); {self.hint}"
                )
                _thread.interrupt_main()
                return

    def __enter__(self) -> PlacementWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
