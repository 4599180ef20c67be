"""backend=spark: every key of conf/backend/spark.yaml, its kind and meaning, and the rules between
keys. What needs the machine (pyspark installed, a Java runtime, the size of a Spark worker) stays
with the backend's `check()`."""

from pydantic import Field, model_validator

from rayflow.schema.kinds import (
    SECONDS_MAX,
    Boolean,
    Bytes,
    IdleMinutes,
    Integer,
    KeyedError,
    Mapping,
    Number,
    OptionalText,
    Text,
)
from rayflow.schema.root import Section


class Spark(Section):
    name: Text = Field(description="`spark`: Ray on Spark (`ray.util.spark.setup_ray_cluster`)")
    master: Text = Field(
        description="used only when there is no active SparkSession: `spark://...`, "
        "`local-cluster[...]`, `local[...]` (yarn and k8s are refused)"
    )
    app_name: Text = Field(description="the Spark application's name")
    spark_conf: Mapping = Field(
        description="settings of the SparkSession rayflow builds "
        "(executor memory 1g, `spark.task.cpus` 1)"
    )
    hybrid: Boolean = Field(
        description="Spark jobs run beside Ray; enforces the Databricks rules "
        "(head resources unset, fewer Ray worker nodes than Spark workers)"
    )
    keep_cluster: Boolean = Field(
        description="leave the Ray-on-Spark cluster running in this process (a notebook kernel) "
        "when the run ends; the next run in it joins it"
    )
    autostop_idle_minutes: IdleMinutes = Field(
        description="tear a kept cluster down after this many minutes with no run, no connected "
        "driver and no waiting demand, by a timer in the process that keeps it (it goes with "
        "that process anyway); null: 60 for a kept cluster (`keep_cluster=true`); 0: never"
    )
    min_worker_nodes: Integer(0) = Field(
        description="Ray worker nodes kept up; autoscaling when min < max"
    )
    max_worker_nodes: Integer(1) = Field(description="Ray worker nodes at most")
    num_cpus_worker_node: Integer(1, optional=True) = Field(
        description="per Ray worker node, set with `num_gpus_worker_node` "
        "(both null: Spark decides)"
    )
    num_gpus_worker_node: Integer(0, optional=True) = Field(
        description="per Ray worker node, set with `num_cpus_worker_node`"
    )
    num_cpus_head_node: Integer(0, optional=True) = Field(
        description="null: 0 (the head runs no tasks) outside global mode"
    )
    num_gpus_head_node: Integer(0, optional=True) = Field(description="GPUs of the head node")
    memory_worker_node: Bytes(optional=True) = Field(
        description="bytes of heap per Ray worker node"
    )
    memory_head_node: Bytes(optional=True) = Field(description="bytes of heap of the head node")
    object_store_memory_worker_node: Bytes(optional=True) = Field(
        description="bytes of object store per Ray worker node"
    )
    object_store_memory_head_node: Bytes(optional=True) = Field(
        description="bytes of object store of the head node"
    )
    head_node_options: Mapping = Field(
        description="extra `ray start` options of the head, e.g. `{include_dashboard: false}`"
    )
    worker_node_options: Mapping = Field(
        description="extra `ray start` options of the worker nodes"
    )
    ray_temp_root_dir: OptionalText = Field(description="Ray's temp root on the Spark nodes")
    strict_mode: Boolean = Field(description="true: refuse to start on too small Spark workers")
    collect_log_to_path: OptionalText = Field(
        description="copy the Ray nodes' logs here at shutdown (e.g. `/dbfs/ray-logs`); "
        "tagged on the MLflow parent run"
    )
    autoscale_upscaling_speed: Number() = Field(description="Ray's `upscaling_speed` (>= 1.0)")
    autoscale_idle_timeout_minutes: Number(allow_zero=True, at_most=SECONDS_MAX / 60) = Field(
        description="an idle Ray worker node is given back to Spark after this long"
    )

    @model_validator(mode="after")
    def _rules(self) -> "Spark":
        if self.min_worker_nodes > self.max_worker_nodes:
            raise KeyedError(
                "min_worker_nodes",
                f"({self.min_worker_nodes}) is greater than "
                f"backend.max_worker_nodes ({self.max_worker_nodes})",
            )
        if (self.num_cpus_worker_node is None) != (self.num_gpus_worker_node is None):
            raise KeyedError(
                "num_gpus_worker_node",
                "set it together with backend.num_cpus_worker_node, or leave both null",
            )
        if self.autoscale_upscaling_speed < 1.0:
            raise KeyedError(
                "autoscale_upscaling_speed", f"must be >= 1.0; got {self.autoscale_upscaling_speed}"
            )
        if self.hybrid:  # Databricks: head-node CPUs/GPUs starve Spark and kill the Ray cluster
            for key in ("num_cpus_head_node", "num_gpus_head_node"):
                if getattr(self, key):
                    raise KeyedError(
                        key,
                        "must stay unset with backend.hybrid=true: "
                        "head-node CPUs/GPUs starve Spark and kill the Ray cluster",
                    )
        return self
