"""The keys of backend=local and backend=attach (conf/backend/local.yaml, attach.yaml), their kinds
and meaning. What needs the machine (an address that answers) stays with the backend's `check()`."""

from pydantic import Field

from rayflow.schema.kinds import (
    RAY_MIN_OBJECT_STORE,
    Boolean,
    Bytes,
    Integer,
    Number,
    Port,
    Seconds,
    Text,
)
from rayflow.schema.root import Section


class Local(Section):
    name: Text = Field(
        description=(
            "`local`: a Ray cluster on this machine (`ray.init`), stopped when the command ends"
        )
    )
    num_cpus: Integer(1, optional=True) = Field(
        description="what `ray.init` gets (null: every core of this machine)"
    )
    num_gpus: Number(allow_zero=True, optional=True) = Field(
        description="GPUs for `ray.init` (null: every GPU Ray detects)"
    )
    object_store_memory: Bytes(RAY_MIN_OBJECT_STORE, optional=True) = Field(
        description="bytes (null: Ray's default, 30% of memory)"
    )
    include_dashboard: Boolean = Field(
        description="the Ray dashboard; it serves Ray's state API, which Ray Train's clean-up of "
        "stopped runs needs (`workload=ddp workload.tune=true` refuses to run without it)"
    )
    dashboard_host: Text = Field(
        description="where the dashboard listens: loopback unless you say otherwise"
    )
    dashboard_port: Port(optional=True) = Field(description="null: 8265 or the next free port")
    preload_worker_imports: Boolean = Field(
        description="the idle worker processes Ray starts with the cluster (one per CPU) import "
        "what the workload's trials import first (`ppo`: torch and RLlib, about 0.45 GB each), and "
        "as many as one trial has processes are kept for it; `false` to skip (a machine with many "
        "cores and little memory)"
    )


class Attach(Section):
    name: Text = Field(description="`attach`: a running cluster, never stopped by rayflow")
    address: Text = Field(
        description="`ray://HOST:PORT`, `HOST:PORT` or `auto` (default `$RAY_ADDRESS`, else `auto`)"
    )
    connect_timeout_s: Seconds() = Field(description="how long the address may take to answer")
