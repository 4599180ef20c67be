"""backend=spark: Ray on Spark (ray.util.spark.setup_ray_cluster), autoscaling through Spark.

The Ray head runs beside the Spark driver, Ray worker nodes run inside Spark tasks, and
the autoscaler asks Spark for more tasks when Ray has pending demand. rayflow uses the
active SparkSession when there is one (Databricks, spark-submit) and never stops it;
otherwise it builds one from `backend.master` and stops it, and its JVMs, at the end.

With `backend.keep_cluster=true` the run's end disconnects its driver and leaves the cluster (and
the SparkSession rayflow built for it) running in this process, a notebook kernel: the next run
here with the same backend section joins it. Ray on Spark's head is a child of this process and
dies with it, so a kept cluster lives at most as long as the kernel; within it an idle timer (a
thread, `_watch`) shuts it down after `backend.autostop_idle_minutes` with no run, no driver and
no waiting demand. `rayflow status` and `down` reach it from its record (`reach`, `down`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from rayflow.backends.base import ClusterBackend, KeepsClusters, Rendered, Traits, WorkerPreload
from rayflow.backends.handle import ClusterHandle
from rayflow.backends.kept import KeptCluster, autostop_minutes
from rayflow.backends.spark import kept as kept_holder
from rayflow.backends.spark import processes
from rayflow.backends.spark.plan import active_session, sizing_plan
from rayflow.errors import ConfigError
from rayflow.runtime.progress import phase
from rayflow.runtime.ray_internals import active_ray_on_spark_cluster
from rayflow.runtime.ray_logs import shutdown_ray
from rayflow.schema.values import flatten, renamed_key_error
from rayflow.security.auth import (
    NO_LOOPBACK,
    auth_token,
    ensure_token,
    refuse_auth_off,
    secure_token_file,
)
from rayflow.security.redaction import mask_text, redact

SETUP_KEYS = (
    "min_worker_nodes",
    "max_worker_nodes",
    "num_cpus_worker_node",
    "num_gpus_worker_node",
    "num_cpus_head_node",
    "num_gpus_head_node",
    "memory_worker_node",
    "memory_head_node",
    "object_store_memory_worker_node",
    "object_store_memory_head_node",
    "head_node_options",
    "worker_node_options",
    "ray_temp_root_dir",
    "strict_mode",
    "collect_log_to_path",
    "autoscale_upscaling_speed",
    "autoscale_idle_timeout_minutes",
)
SUPPORTED_MASTER = re.compile(r"^(local(\[[^\]]*\])?|local-cluster\[.*\]|spark://.+)$")
HOOK = "rayflow.backends.spark.hook.RayflowStartHook"


class SparkCluster(ClusterBackend, KeepsClusters):
    # KeepsClusters: with backend.keep_cluster=true the cluster stays in this process (a notebook
    # kernel) for its next run, under an idle timer; `rayflow status` and `down` reach it by its
    # record.

    # A property here: Spark's local and local-cluster masters (a Databricks single-node cluster
    # among them) run every worker on one machine.
    @property
    def traits(self) -> Traits:  # type: ignore[override]
        active = active_session()
        master = str(active.sparkContext.master if active else self.section.master)
        return Traits(single_machine=master.startswith("local"))

    def spark_conf(self) -> dict[str, str]:
        """spark_conf with dotted keys: on the command line Hydra nests `spark.task.cpus` as
        dicts."""
        conf = OmegaConf.to_container(self.section.spark_conf or {}, resolve=True)
        return {key: str(value) for key, value in flatten(conf)}

    def setup_args(self) -> dict:
        b = OmegaConf.to_container(self.section, resolve=True)
        assert isinstance(b, dict)  # the container of a DictConfig
        return {k: b.get(k) for k in SETUP_KEYS}

    def check(self) -> None:
        b = self.section
        # Ray on Spark binds the head's dashboard to every interface (its dashboard_host is not
        # ours to set), its GCS and Ray client ports to the Spark driver's address and the
        # raylets to the Spark workers', which the nodes must reach: auth off is refused whatever
        # the dashboard (rayflow.security.auth.refuse_auth_off; docs/backends/spark.md).
        refuse_auth_off(
            self.auth_mode,
            "Ray on Spark's dashboard listens on all interfaces, its GCS and Ray Client on the "
            f"Spark driver's address and its raylets on the Spark workers' ({NO_LOOPBACK})",
        )
        for key in b:  # +backend.autoscale=true gets past Hydra; name the replacement
            error = renamed_key_error(f"backend.{key!s}")
            if error:
                raise error
        if importlib.util.find_spec("pyspark") is None:
            raise ConfigError(
                "backend", "backend 'spark' needs pyspark: pip install 'rayflow[spark]'"
            )
        if b.hybrid:
            self._check_hybrid()
        self._check_kept()
        active = active_session()
        if active is None:
            self._check_master()
            self._check_worker_size()
        self._check_local_mode(str(active.sparkContext.master if active else self.section.master))

    def _check_kept(self) -> None:
        """A kept cluster is watched and reached through its head's dashboard; and Ray on Spark
        runs one cluster a process, so a run here either joins the one this process keeps or
        waits until it is gone."""
        options = self.section.get("head_node_options") or {}
        if self.section.get("keep_cluster") and options.get("include_dashboard") is False:
            raise ConfigError(
                "backend.keep_cluster",
                "a kept cluster needs its head's dashboard (its idle timer and `rayflow status` "
                "ask it): leave backend.head_node_options.include_dashboard unset",
            )
        held = kept_holder.alive_held()
        if held is not None and held.key != self.cluster_key():
            raise ConfigError(
                "backend",
                f"this process keeps the Ray-on-Spark cluster {held.name}, started with another "
                "backend section, and Ray on Spark runs one cluster a process: run with that "
                f"section to join it, or tear it down first (rayflow.down({held.name!r}))",
            )

    def cluster_key(self) -> str:
        """What a kept cluster is joined by: the backend section it was started with (but whether
        to keep it, and for how long) and the auth mode."""
        section = OmegaConf.to_container(self.section, resolve=True)
        assert isinstance(section, dict)  # the container of a DictConfig
        for key in ("keep_cluster", "autostop_idle_minutes"):
            section.pop(key, None)
        return json.dumps([section, self.auth_mode], sort_keys=True, default=str)

    def _check_local_mode(self, master: str) -> None:
        """Spark's local mode (`local[...]`, a Databricks single-node cluster) has no stage
        scheduling: Ray on Spark sizes each node by `spark.task.cpus` and refuses the node sizes
        after starting Spark."""
        if not (master == "local" or master.startswith("local[")):
            return
        for key in ("num_cpus_worker_node", "num_gpus_worker_node"):
            if self.section.get(key) is not None:
                raise ConfigError(
                    f"backend.{key}",
                    f"cannot be set on Spark's local mode (master {master}): Ray on Spark sizes "
                    "its nodes by spark.task.cpus there; set backend.num_cpus_worker_node=null "
                    "backend.num_gpus_worker_node=null",
                )

    def _check_worker_size(self) -> None:
        """Where the Spark workers are this machine (local-cluster, local), a Ray worker node
        must fit one Spark worker: Ray on Spark would otherwise fail, or wait, after starting
        Spark."""
        b = self.section
        match = re.match(r"local-cluster\[\s*\d+\s*,\s*(\d+)\s*,", str(b.master))
        if (
            b.num_cpus_worker_node is not None
            and match
            and b.num_cpus_worker_node > int(match.group(1))
        ):
            raise ConfigError(
                "backend.num_cpus_worker_node",
                f"({b.num_cpus_worker_node}) exceeds the {match.group(1)} cores "
                f"of each Spark worker of {b.master}",
            )
        if not str(b.master).startswith("local"):
            return  # the workers are other machines: their size is known once Spark runs
        from rayflow.backends.spark.plan import _worker_facts

        try:
            _worker_facts(
                b.num_cpus_worker_node,
                b.num_gpus_worker_node,
                b.memory_worker_node,
                b.object_store_memory_worker_node,
            )
        except ValueError as err:  # Ray's own check of these sizes against the worker
            raise ConfigError(
                "backend.num_cpus_worker_node",
                f"Ray on Spark refuses the worker node size: {str(err).splitlines()[0]}",
            ) from None

    def _check_master(self) -> None:
        master = str(self.section.master)
        if not SUPPORTED_MASTER.match(master):
            raise ConfigError(
                "backend.master",
                f"{master!r} is not supported by Ray on Spark; "
                "use spark://HOST:PORT, local-cluster[...] or local[...]",
            )
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise ConfigError(
                "backend.master",
                "Spark needs a Java 17 runtime: apt-get install openjdk-17-jre-headless",
            )

    def _check_hybrid(self) -> None:
        """Databricks guidance for Spark work beside Ray: leave head resources unset, keep Spark
        capacity."""
        b = self.section  # (head resources left unset: rayflow.backends.spark.keys.Spark)
        workers = self.spark_workers()
        if workers is not None and b.max_worker_nodes >= workers:
            raise ConfigError(
                "backend.max_worker_nodes",
                f"({b.max_worker_nodes}) must stay below the Spark workers ({workers}) "
                "with backend.hybrid=true, so Spark keeps capacity",
            )

    def spark_workers(self) -> int | None:
        match = re.match(r"local-cluster\[\s*(\d+)\s*,", str(self.section.master))
        return int(match.group(1)) if match else None

    def _tags(self, source: str) -> dict[str, str]:
        """For the MLflow parent run: whose SparkSession the cluster ran in (and where its logs
        went)."""
        path = self.section.collect_log_to_path
        tags = {"spark_session": source}
        if source == "built by rayflow":
            tags["spark_master"] = str(self.section.master)
        return {**tags, "collect_log_to_path": str(path)} if path else tags

    def session_source(self) -> str:
        return "active SparkSession" if active_session() is not None else "built by rayflow"

    def render(self, preload: WorkerPreload | None = None) -> Rendered:
        """What `ray.util.spark.setup_ray_cluster(**args)` is called with, and only that (a dry
        run's stdout, the parent run's cluster/spec.yaml); the SparkSession and the sizing plan
        are notes."""
        return Rendered(yaml.safe_dump(self.setup_args(), sort_keys=False), self._notes)

    def _notes(self) -> list[str]:
        b = self.section
        held = kept_holder.alive_held()
        if held is not None and held.key == self.cluster_key():
            # (no sizing plan: its task would wait for Spark slots the kept cluster's nodes hold)
            return [
                f"spark: joins the Ray-on-Spark cluster {held.name} this process keeps "
                f"(head {mask_text(held.address)})",
                f"auth mode: {os.environ.get('RAY_AUTH_MODE', self.auth_mode)}",
            ]
        if active_session() is not None:
            lines = ["spark: the active SparkSession (used and left running)"]
        else:
            conf = ", ".join(f"{k}={v}" for k, v in redact(self.spark_conf()).items())
            lines = [
                "spark: a SparkSession rayflow builds and stops: "
                f"master={b.master}, app_name={b.app_name}"
                + (f", spark_conf: {conf}" if conf else "")
            ]
        plan = sizing_plan(OmegaConf.create({"backend": b}), self.spark_conf())
        nodes, node = plan["ray_worker_nodes"], plan["ray_worker_node"]
        lines.append(
            f"sizing plan: {plan['spark_workers']} Spark worker(s) ({plan['source']}), "
            f"{plan['cores_per_spark_worker']} core(s) each; "
            f"Ray worker nodes min {nodes['min']}, max {nodes['max']}, "
            f"possible {nodes['possible']}; "
            f"each {node['cpus']} CPU(s), {node['gpus']} GPU(s), heap {node['heap_bytes']} bytes"
        )
        lines += [f"sizing plan: {warning}" for warning in plan["warnings"]]
        lines.append(f"auth mode: {os.environ.get('RAY_AUTH_MODE', self.auth_mode)}")
        return lines

    # --- lifecycle ---------------------------------------------------------------------

    def capacity(self, resources: set[str]) -> list[dict[str, float]] | None:
        """The head and max_worker_nodes worker nodes of the sizes asked for; None when Spark
        decides the worker size (num_cpus_worker_node null), known only once it runs."""
        b = self.section
        if b.num_cpus_worker_node is None:
            return None
        worker = {"CPU": float(b.num_cpus_worker_node), "GPU": float(b.num_gpus_worker_node or 0)}
        if b.memory_worker_node is not None:
            worker["memory"] = float(b.memory_worker_node)
        head = {"CPU": float(b.num_cpus_head_node or 0), "GPU": float(b.num_gpus_head_node or 0)}
        return [head] + [dict(worker) for _ in range(int(b.max_worker_nodes))]

    # --- lifecycle: every step registers its undo as soon as it succeeds -----------------

    @staticmethod
    def _set_env(handle: ClusterHandle, key: str, value: str) -> None:
        old = os.environ.get(key)
        os.environ[key] = value
        handle.on_stop(f"restore ${key}", _restore_env, key, old)

    def _environment(self, handle: ClusterHandle, steps: ClusterHandle) -> None:
        """What Ray-on-Spark's launchers need from the driver's environment (the scratch folder
        is the cluster's: `steps` removes it)."""
        bin_dir = str(Path(sys.executable).parent)
        # they run `which ray`
        self._set_env(handle, "PATH", bin_dir + os.pathsep + os.environ.get("PATH", ""))
        if "PYSPARK_PYTHON" not in os.environ:
            self._set_env(handle, "PYSPARK_PYTHON", sys.executable)  # executors run this one
        if "SPARK_WORKER_DIR" not in os.environ:
            # local-cluster scratch space, not site-packages/pyspark/work
            worker_dir = tempfile.mkdtemp(prefix="rayflow-spark-")
            steps.on_stop(
                "remove the Spark worker scratch folder",
                shutil.rmtree,
                worker_dir,
                ignore_errors=True,
            )
            self._set_env(handle, "SPARK_WORKER_DIR", worker_dir)
        self._set_env(handle, "RAY_ON_SPARK_START_HOOK", HOOK)
        if os.environ.get("RAY_AUTH_MODE") == "token":
            ensure_token()  # one token for head, workers and driver, made before any starts

    def start(self, preload: WorkerPreload | None = None) -> ClusterHandle:
        handle = ClusterHandle(self.name)
        with handle.unwound_on_error():
            if self._join(handle):
                return handle
            keep = bool(self.section.get("keep_cluster"))
            # The cluster's own undo steps (Ray on Spark, the session rayflow built): this run's,
            # or, kept, handed to this process's holder once started (until then a failed start
            # unwinds them too).
            steps = ClusterHandle(self.name) if keep else handle
            if keep:
                handle.on_stop("stop the Ray-on-Spark cluster", kept_holder.stop_unless_kept, steps)
            self._environment(handle, steps)
            started = time.monotonic()
            self._session(handle, steps)
            handle.metrics["spark_ready_s"] = time.monotonic() - started
            handle.address = self._ray_on_spark(steps)
            handle.metrics["ray_ready_s"] = time.monotonic() - started
            self._connect(handle)
            if keep:
                self._keep(handle, steps)
        return handle

    def _session(self, handle: ClusterHandle, steps: ClusterHandle) -> None:
        """The SparkSession: the active one (a notebook's, never stopped), else one built here
        (`steps` stops it)."""
        from pyspark.sql import SparkSession

        # Hydra's INFO root logger makes it chatty
        logging.getLogger("py4j").setLevel(logging.WARNING)
        spark = active_session()
        handle.tags.update(self._tags(self.session_source()))
        if spark is None:  # ours to stop; an active session (a notebook's) never is
            with phase(f"starting Spark ({mask_text(str(self.section.master))})", "spark"):
                builder = SparkSession.builder.master(str(self.section.master)).appName(
                    str(self.section.app_name)
                )
                for key, value in self.spark_conf().items():
                    builder = builder.config(key, value)
                spark = builder.getOrCreate()
            steps.on_stop("shut down Spark's py4j gateway JVM", processes.shutdown_gateway_jvm)
            steps.on_stop("stop the SparkSession rayflow built", spark.stop)
        else:
            print(
                "[rayflow] spark: using the active SparkSession "
                f"({mask_text(str(spark.sparkContext.master))})",
                flush=True,
            )

    def _ray_on_spark(self, steps: ClusterHandle) -> str:
        """The Ray cluster inside Spark (setup_ray_cluster): its head here, its workers in Spark
        tasks (`steps` shuts it down)."""
        from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

        args = self.setup_args()
        low = (
            args["min_worker_nodes"]
            if args["min_worker_nodes"] is not None
            else args["max_worker_nodes"]
        )
        with phase(
            f"starting Ray on Spark (head node, then {low} of up to "
            f"{args['max_worker_nodes']} worker nodes)",
            "spark",
        ) as step:
            # setup_ray_cluster starts the head, then waits for min_worker_nodes: say which, on a
            # terminal
            step.status(
                lambda: (
                    "waiting for worker nodes"
                    if active_ray_on_spark_cluster() is not None
                    else "starting the head node"
                )
            )
            try:
                address, _ = setup_ray_cluster(**args)
                secure_token_file()  # whatever Ray wrote meanwhile: 0600 in a 0700 ~/.ray
            finally:  # a setup that failed halfway may still have left its head node running
                cluster = active_ray_on_spark_cluster()
                if cluster is not None:
                    # its processes read now too: once its launcher is gone, what it left is
                    # no longer found under it
                    steps.on_stop(
                        "terminate what is left of the Ray-on-Spark head node",
                        processes.end_head,
                        cluster.head_proc,
                        processes.tree(cluster.head_proc.pid),
                    )
                    steps.on_stop("shutdown_ray_cluster()", shutdown_ray_cluster)
        return str(address)

    @staticmethod
    def _connect(handle: ClusterHandle) -> None:
        import ray

        with phase(f"connecting this driver to {handle.address}", "spark"):
            ray.init(address=handle.address, log_to_driver=True)
        handle.on_stop("ray.shutdown() of this driver", shutdown_ray)

    # --- a kept cluster: kept in this process, joined by its next run here (spark/kept.py) ----

    def _keep(self, handle: ClusterHandle, steps: ClusterHandle) -> None:
        token = auth_token() if self.auth_mode == "token" else None
        minutes = autostop_minutes(self.section, kept=True)
        kept_holder.keep(self.cluster_key(), handle, steps, token, minutes)

    def _join(self, handle: ClusterHandle) -> bool:
        if not kept_holder.join(self.cluster_key(), handle):
            return False
        self._connect(handle)
        return True

    # --- a kept cluster, from its record alone (rayflow status, down, logs) ------------------

    def reach(self, kept: KeptCluster, headers: dict[str, str]) -> ClusterHandle | None:
        return kept_holder.reach(kept, headers)

    def down(self, kept: KeptCluster) -> None:
        kept_holder.down(kept)


def _restore_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
