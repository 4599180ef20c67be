"""backend=spark: Ray on Spark (ray.util.spark.setup_ray_cluster), autoscaling through Spark.

The Ray head runs beside the Spark driver, Ray worker nodes run inside Spark tasks, and
the autoscaler asks Spark for more tasks when Ray has pending demand. rayflow uses the
active SparkSession when there is one (Databricks, spark-submit) and never stops it;
otherwise it builds one from `backend.master` and stops it, and its JVMs, at the end.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from rayflow.backends.base import ClusterBackend, Rendered, WorkerPreload
from rayflow.backends.handle import ClusterHandle
from rayflow.backends.spark.plan import active_session, sizing_plan
from rayflow.errors import ConfigError
from rayflow.runtime.progress import phase, shutdown_ray
from rayflow.schema.values import flatten, renamed_key_error
from rayflow.security.auth import ensure_token, refuse_auth_off, secure_token_file
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


class SparkCluster(ClusterBackend):
    # The contract's class attribute, a property here: Spark's local and local-cluster masters
    # (a Databricks single-node cluster among them) run every worker on one machine.
    @property
    def single_machine(self) -> bool:  # type: ignore[override]
        active = active_session()
        master = str(active.sparkContext.master if active else self.section.master)
        return master.startswith("local")

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
        for key in b:  # +backend.autoscale=true gets past Hydra; name the replacement
            error = renamed_key_error(f"backend.{key!s}")
            if error:
                raise error
        if importlib.util.find_spec("pyspark") is None:
            raise ConfigError(
                "backend", "backend 'spark' needs pyspark: pip install 'rayflow[spark]'"
            )
        # Ray on Spark binds the head's dashboard to every interface (its dashboard_host is not
        # ours to set) and its GCS and Ray client ports to the Spark driver's address, which the
        # worker nodes must reach: turning the dashboard off would leave those open. So auth off
        # is refused whatever the dashboard (docs/backends/spark.md).
        refuse_auth_off(
            self.auth_mode,
            "ray_auth_mode",
            "Ray on Spark's dashboard (all interfaces) and its GCS and "
            "Ray client ports (the Spark driver's address)",
            fix="keep token auth (ray_auth_mode=token): "
            "Ray on Spark has no setting that keeps them on loopback",
        )
        if b.hybrid:
            self._check_hybrid()
        active = active_session()
        if active is None:
            self._check_master()
            self._check_worker_size()
        self._check_local_mode(str(active.sparkContext.master if active else self.section.master))

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

    def _environment(self, handle: ClusterHandle) -> None:
        """What Ray-on-Spark's launchers need from the driver's environment."""
        bin_dir = str(Path(sys.executable).parent)
        # they run `which ray`
        self._set_env(handle, "PATH", bin_dir + os.pathsep + os.environ.get("PATH", ""))
        if "PYSPARK_PYTHON" not in os.environ:
            self._set_env(handle, "PYSPARK_PYTHON", sys.executable)  # executors run this one
        if "SPARK_WORKER_DIR" not in os.environ:
            # local-cluster scratch space, not site-packages/pyspark/work
            worker_dir = tempfile.mkdtemp(prefix="rayflow-spark-")
            handle.on_stop(
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
            self._environment(handle)
            started = time.monotonic()
            self._session(handle)
            handle.metrics["spark_ready_s"] = time.monotonic() - started
            handle.address = self._ray_on_spark(handle)
            handle.metrics["ray_ready_s"] = time.monotonic() - started
            self._connect(handle)
        return handle

    def _session(self, handle: ClusterHandle) -> None:
        """The SparkSession: the active one (a notebook's, never stopped), else one built here."""
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
            handle.on_stop("shut down Spark's py4j gateway JVM", shutdown_gateway_jvm)
            handle.on_stop("stop the SparkSession rayflow built", spark.stop)
        else:
            print(
                "[rayflow] spark: using the active SparkSession "
                f"({mask_text(str(spark.sparkContext.master))})",
                flush=True,
            )

    def _ray_on_spark(self, handle: ClusterHandle) -> str:
        """The Ray cluster inside Spark (setup_ray_cluster): its head here, its workers in Spark
        tasks."""
        from ray.util.spark import cluster_init, setup_ray_cluster, shutdown_ray_cluster

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
                    if cluster_init._active_ray_cluster is not None
                    else "starting the head node"
                )
            )
            try:
                address, _ = setup_ray_cluster(**args)
                secure_token_file()  # whatever Ray wrote meanwhile: 0600 in a 0700 ~/.ray
            finally:  # a setup that failed halfway may still have left its head node running
                cluster = cluster_init._active_ray_cluster
                if cluster is not None:
                    handle.on_stop(
                        "terminate what is left of the Ray-on-Spark head node",
                        _terminate,
                        cluster.head_proc,
                    )
                    handle.on_stop("shutdown_ray_cluster()", shutdown_ray_cluster)
        return str(address)

    @staticmethod
    def _connect(handle: ClusterHandle) -> None:
        import ray

        with phase(f"connecting this driver to {handle.address}", "spark"):
            ray.init(address=handle.address, log_to_driver=True)
        handle.on_stop("ray.shutdown() of this driver", shutdown_ray)


def _restore_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def _terminate(process, timeout: float = 30) -> None:
    """Stop a process Ray on Spark started (its head node) if it still runs: TERM, then KILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)


def shutdown_gateway_jvm() -> None:
    """spark.stop() ends the executors; the py4j gateway JVM lives until Python exits unless
    it is shut down too, and a later SparkSession in this process then starts a new one."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    SparkContext._gateway = None
    SparkContext._jvm = None
    try:
        gateway.shutdown()
    finally:
        if process is not None:
            _terminate(process)


def stop_session_and_jvm(spark) -> None:
    """Stop a SparkSession and the gateway JVM behind it (for code that built its own)."""
    spark.stop()
    shutdown_gateway_jvm()
