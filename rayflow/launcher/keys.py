"""The keys of `hydra/launcher=rayflow` (hydra_plugins/rayflow_launcher/rayflow.yaml): the
launcher's own, and the resources each job asks for. The chosen backend's keys beside them are
checked by that backend's own model (registered with it: rayflow.backends) once they are merged over
its defaults."""

from __future__ import annotations

import math

from pydantic import Field

from rayflow.backends import REGISTRY
from rayflow.schema.kinds import (
    NUMBER_MAX,
    Bytes,
    Integer,
    KeyedError,
    Mapping,
    Number,
    OneOf,
    OptionalText,
    Seconds,
)
from rayflow.schema.root import Part, RayAuthModeKind, Section


class JobResources(Part):
    cpu: Number(allow_zero=True) = Field(description="CPUs a job reserves (Ray's `num_cpus`)")
    gpu: Number(allow_zero=True) = Field(
        description="GPUs a job reserves (Ray's `num_gpus`); any job above 0 renders the "
        "backend's GPU workers, as `compute=gpu` does"
    )
    memory: Bytes(optional=True) = Field(
        description="bytes of Ray's `memory` resource a job reserves (null: none)"
    )
    custom: Mapping = Field(
        description="custom Ray resources a job reserves, `{name: amount}` (the nodes must "
        "declare them)"
    )

    @classmethod
    def check_keys(cls, value: dict) -> None:
        for key in value:
            if key not in cls.model_fields:
                raise KeyedError(
                    str(key), f"not a resource key; choose from {', '.join(cls.model_fields)}"
                )
        for name, amount in (value.get("custom") or {}).items():
            if (
                isinstance(amount, bool)
                or not isinstance(amount, (int, float))
                or not math.isfinite(amount)
                or amount < 0
            ):
                raise KeyedError(f"custom.{name}", f"must be a number >= 0, got {amount!r}")
            if amount > NUMBER_MAX:
                raise KeyedError(
                    f"custom.{name}", f"must be at most {NUMBER_MAX:g}, got {amount!r}"
                )


class Launcher(Section):
    # rayflow's own backends, as the launcher's node has their keys only (rayflow.launcher.node)
    backend: OneOf(*REGISTRY) = Field(
        description="where the jobs run; that backend's keys may be set beside this one (null: "
        "its default)"
    )
    ray_auth_mode: RayAuthModeKind = Field(
        description="Ray token auth for the cluster, as rayflow's own `ray_auth_mode`"
    )
    resources: JobResources = Field(description="what each job asks Ray for")
    job_resources_key: OptionalText = Field(
        description="a section of the job's own config whose keys (`cpu`, `gpu`, `memory`, "
        "`custom`) win over `resources` for that job, so one sweep mixes small and large "
        "jobs (null: none)"
    )
    max_concurrent: Integer(1, optional=True) = Field(
        description="jobs running at once at most (null: as many as the cluster holds)"
    )
    on_failure: OneOf("continue", "stop") = Field(
        description="`continue`: a failing job is its own JobReturn and the others still run; "
        "`stop`: jobs not started yet are not started (their JobReturns say so)"
    )
    schedule_timeout_s: Seconds() = Field(
        description="a job no node can hold, pending this long while the cluster does not grow, "
        "fails the sweep"
    )
