"""backend=kuberay: the Ray resources a rendered manifest's pods will have, derived the way the
KubeRay operator derives them from Kubernetes quantities (parsed by rayflow.backends.kuberay.keys,
which holds the keys' kinds) (`capacity`, the Ray nodes at full scale that placement checks a run's
demand against). Pure functions, no `kubernetes` import.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_UP
from typing import Any

from omegaconf import DictConfig

from rayflow.backends.kuberay.keys import parse_quantity, run_group
from rayflow.backends.kuberay.manifest import cluster_of, render


def quantity_value(value: Any) -> int | None:
    """Quantity.Value() of the operator: rounded up to a whole number (500m CPU -> 1)."""
    number = parse_quantity(value)
    return None if number is None else int(number.to_integral_value(rounding=ROUND_UP))


# --- capacity ----------------------------------------------------------------------------------


def ray_resources(group: Mapping) -> dict[str, float] | None:
    """The CPU, GPU and memory Ray starts a group's pods with, as the operator derives them
    (ray-operator/controllers/ray/common/pod.go): the group's `resources` field overrides
    rayStartParams (updateRayStartParamsResources); what is still unset comes from the Ray
    container, CPU from limits else requests, memory and GPUs from limits
    (generateRayStartCommand, addWellKnownAcceleratorResources), each Quantity.Value() (rounded up).
    None when a quantity cannot be parsed."""
    params = {k: str(v) for k, v in (group.get("rayStartParams") or {}).items()}
    for name, amount in (group.get("resources") or {}).items():
        value, lower = quantity_value(amount), str(name).lower()
        if value is None:
            return None
        key = {"cpu": "num-cpus", "memory": "memory"}.get(
            lower, "num-gpus" if lower.endswith("gpu") else None
        )
        if key:
            params[key] = str(value)
    containers = (((group.get("template") or {}).get("spec") or {}).get("containers")) or [{}]
    resources = containers[0].get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    derived = {
        "num-cpus": limits.get("cpu", requests.get("cpu")),
        "memory": limits.get("memory"),
        "num-gpus": next(
            (v for k, v in sorted(limits.items()) if k.endswith("gpu") and parse_quantity(v)), None
        ),
    }
    for key, amount in derived.items():
        if key not in params and amount is not None:
            value = quantity_value(amount)
            if value is None:
                return None
            params[key] = str(value)
    out: dict[str, float] = {}
    for key, ray_name in (("num-cpus", "CPU"), ("num-gpus", "GPU"), ("memory", "memory")):
        try:
            out[ray_name] = float(params.get(key, 0))
        except ValueError:
            return None
    return out


def capacity(section: DictConfig | Mapping, gpu: bool) -> list[dict[str, float]] | None:
    """The Ray nodes at full scale of the manifest rayflow renders from the section (overrides
    included)."""
    return nodes_at_full_scale(
        render(section, gpu, "disabled", "0.0.0", "3.11", {}), run_group(gpu)
    )


def nodes_at_full_scale(manifest: Mapping, group_name: str | None) -> list[dict[str, float]] | None:
    """The Ray nodes at full scale: the head, then maxReplicas pods (x numOfHosts) of the group the
    run uses; None when a quantity cannot be parsed."""
    spec = cluster_of(manifest)
    head = ray_resources(spec.get("headGroupSpec") or {})
    if head is None:
        return None
    nodes = [{"CPU": head["CPU"], "GPU": head["GPU"]}]
    for group in spec.get("workerGroupSpecs") or []:
        if group_name is not None and group.get("groupName") == group_name:
            pod = ray_resources(group)
            if pod is None:
                return None
            count = int(group.get("maxReplicas") or 0) * int(group.get("numOfHosts") or 1)
            nodes.extend(dict(pod) for _ in range(count))
    return nodes
