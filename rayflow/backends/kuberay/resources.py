"""backend=kuberay: Kubernetes quantities, and the Ray resources a rendered manifest's pods
will have, derived the way the KubeRay operator derives them (`capacity`, the Ray nodes at full
scale that placement checks a run's demand against). Pure functions, no `kubernetes` import.
"""

from __future__ import annotations

import re
from decimal import ROUND_UP, Decimal
from typing import Any, Mapping

from omegaconf import DictConfig

from rayflow.backends.kuberay.manifest import cluster_of, render, run_group

# Kubernetes' quantity grammar (k8s.io/apimachinery resource.ParseQuantity): a signed decimal
# and one suffix, binary (Ki..Ei), decimal (n u m k M G T P E) or an exponent (e3, E-2).
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_SUFFIX = {"Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
           "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60, "n": Decimal("1e-9"), "u": Decimal("1e-6"),
           "m": Decimal("1e-3"), "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
           "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18")}


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity ("500m", "4Gi", 2) as a Decimal, or None if it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    match = _QUANTITY.match(str(value))
    if not match:
        return None
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return number.scaleb(int(suffix[1:]))
    return number * _SUFFIX.get(suffix, Decimal(1))


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
        key = {"cpu": "num-cpus", "memory": "memory"}.get(lower, "num-gpus" if lower.endswith("gpu") else None)
        if key:
            params[key] = str(value)
    containers = (((group.get("template") or {}).get("spec") or {}).get("containers")) or [{}]
    resources = containers[0].get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    derived = {"num-cpus": limits.get("cpu", requests.get("cpu")), "memory": limits.get("memory"),
               "num-gpus": next((v for k, v in sorted(limits.items()) if k.endswith("gpu") and parse_quantity(v)), None)}
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
    """The Ray nodes at full scale: the head, then max_replicas pods of the group the run uses,
    read from the rendered manifest (overrides included); None when a quantity cannot be parsed."""
    manifest = render(section, gpu, "disabled", "0.0.0", "3.11", {})
    spec = cluster_of(manifest)
    head = ray_resources(spec.get("headGroupSpec") or {})
    if head is None:
        return None
    nodes = [{"CPU": head["CPU"], "GPU": head["GPU"]}]
    for group in spec.get("workerGroupSpecs") or []:
        if group.get("groupName") == run_group(gpu):
            pod = ray_resources(group)
            if pod is None:
                return None
            count = int(group.get("maxReplicas") or 0) * int(group.get("numOfHosts") or 1)
            nodes.extend(dict(pod) for _ in range(count))
    return nodes
