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

from rayflow.backends.base import ClusterBackend
from rayflow.backends.spark_plan import sizing_plan
from rayflow.config import ConfigError, flatten, positive_int, positive_number, redact, renamed_key_error

SETUP_KEYS = (
    "min_worker_nodes", "max_worker_nodes", "num_cpus_worker_node", "num_gpus_worker_node",
    "num_cpus_head_node", "num_gpus_head_node", "memory_worker_node", "memory_head_node",
    "object_store_memory_worker_node", "object_store_memory_head_node", "head_node_options",
    "worker_node_options", "ray_temp_root_dir", "strict_mode", "collect_log_to_path",
    "autoscale_upscaling_speed", "autoscale_idle_timeout_minutes",
)
SUPPORTED_MASTER = re.compile(r"^(local(\[[^\]]*\])?|local-cluster\[.*\]|spark://.+)$")
HOOK = "rayflow.backends.spark_hook.RayflowStartHook"


def active_session():
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


class SparkCluster(ClusterBackend):
    def spark_conf(self) -> dict[str, str]:
        """spark_conf with dotted keys: on the command line Hydra nests `spark.task.cpus` as dicts."""
        conf = OmegaConf.to_container(self.cfg.backend.spark_conf or {}, resolve=True)
        return {key: str(value) for key, value in flatten(conf)}

    def setup_args(self) -> dict:
        b = OmegaConf.to_container(self.cfg.backend, resolve=True)
        return {k: b.get(k) for k in SETUP_KEYS}

    def check(self) -> None:
        b = self.cfg.backend
        for key in b:  # +backend.autoscale=true gets past Hydra; name the replacement
            error = renamed_key_error(f"backend.{key}")
            if error:
                raise error
        if importlib.util.find_spec("pyspark") is None:
            raise ConfigError("backend", "backend 'spark' needs pyspark: pip install 'rayflow[spark]'")
        high = positive_int(self.cfg, "backend.max_worker_nodes")
        low = positive_int(self.cfg, "backend.min_worker_nodes", minimum=0)
        if low > high:
            raise ConfigError("backend.min_worker_nodes", f"({low}) is greater than backend.max_worker_nodes ({high})")
        if (b.num_cpus_worker_node is None) != (b.num_gpus_worker_node is None):
            raise ConfigError("backend.num_gpus_worker_node", "set it together with backend.num_cpus_worker_node, or leave both null")
        if b.num_cpus_worker_node is not None:
            positive_int(self.cfg, "backend.num_cpus_worker_node")
            positive_int(self.cfg, "backend.num_gpus_worker_node", minimum=0)
        for key in ("num_cpus_head_node", "num_gpus_head_node"):
            if b[key] is not None:
                positive_int(self.cfg, f"backend.{key}", minimum=0)
        for key in ("memory_worker_node", "memory_head_node", "object_store_memory_worker_node", "object_store_memory_head_node"):
            if b[key] is not None:
                positive_int(self.cfg, f"backend.{key}")
        if positive_number(self.cfg, "backend.autoscale_upscaling_speed") < 1.0:
            raise ConfigError("backend.autoscale_upscaling_speed", f"must be >= 1.0; got {b.autoscale_upscaling_speed}")
        positive_number(self.cfg, "backend.autoscale_idle_timeout_minutes", allow_zero=True)
        if b.hybrid:
            self._check_hybrid()
        if active_session() is None:
            self._check_master()

    def _check_master(self) -> None:
        master = str(self.cfg.backend.master)
        if not SUPPORTED_MASTER.match(master):
            raise ConfigError("backend.master", f"{master!r} is not supported by Ray on Spark; use spark://HOST:PORT, local-cluster[...] or local[...]")
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise ConfigError("backend.master", "Spark needs a Java 17 runtime: apt-get install openjdk-17-jre-headless")

    def _check_hybrid(self) -> None:
        """Databricks guidance for Spark work beside Ray: leave head resources unset, keep Spark capacity."""
        b = self.cfg.backend
        for key in ("num_cpus_head_node", "num_gpus_head_node"):
            if b[key]:
                raise ConfigError(f"backend.{key}", "must stay unset with backend.hybrid=true: head-node CPUs/GPUs starve Spark and kill the Ray cluster")
        workers = self.spark_workers()
        if workers is not None and b.max_worker_nodes >= workers:
            raise ConfigError("backend.max_worker_nodes", f"({b.max_worker_nodes}) must stay below the Spark workers ({workers}) with backend.hybrid=true, so Spark keeps capacity")

    def spark_workers(self) -> int | None:
        match = re.match(r"local-cluster\[\s*(\d+)\s*,", str(self.cfg.backend.master))
        return int(match.group(1)) if match else None

    def tags(self) -> dict:
        path = self.cfg.backend.collect_log_to_path
        return {"collect_log_to_path": path} if path else {}

    def metrics(self) -> dict:
        return dict(getattr(self, "timings", {}))

    def cluster_gpus(self) -> float | None:
        b = self.cfg.backend
        if b.num_gpus_worker_node is None:
            return None  # Spark decides: known once the cluster is up
        return float(b.num_gpus_worker_node * b.max_worker_nodes + (b.num_gpus_head_node or 0))

    def render(self) -> str:
        b = self.cfg.backend
        session = "active SparkSession" if active_session() is not None else None
        spec = {
            "backend": "spark",
            "spark": {"session": session or "built by rayflow", "master": None if session else str(b.master),
                      "app_name": str(b.app_name), "spark_conf": redact(self.spark_conf())},
            "setup_ray_cluster": self.setup_args(),
            "sizing_plan": sizing_plan(self.cfg, self.spark_conf()),
            "auth_mode": os.environ.get("RAY_AUTH_MODE", self.cfg.ray_auth_mode),
        }
        return yaml.safe_dump(spec, sort_keys=False)

    # --- lifecycle ---------------------------------------------------------------------

    def _environment(self) -> None:
        """What Ray-on-Spark's launchers need from the driver's environment, saved to restore."""
        bin_dir = str(Path(sys.executable).parent)
        self._saved_env = {k: os.environ.get(k) for k in ("PATH", "PYSPARK_PYTHON", "SPARK_WORKER_DIR", "RAY_ON_SPARK_START_HOOK")}
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")  # they run `which ray`
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this interpreter
        self._worker_dir = None
        if "SPARK_WORKER_DIR" not in os.environ:  # local-cluster scratch space, not site-packages/pyspark/work
            self._worker_dir = tempfile.mkdtemp(prefix="rayflow-spark-")
            os.environ["SPARK_WORKER_DIR"] = self._worker_dir
        os.environ["RAY_ON_SPARK_START_HOOK"] = HOOK
        if os.environ.get("RAY_AUTH_MODE") == "token":
            from rayflow.backends.spark_hook import auth_token

            if auth_token() is None:  # one token for head, workers and driver, made before any starts
                subprocess.run([str(Path(bin_dir) / "ray"), "get-auth-token", "--generate"],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> str:
        from pyspark.sql import SparkSession

        logging.getLogger("py4j").setLevel(logging.WARNING)  # Hydra's INFO root logger makes it chatty
        self._environment()
        self.timings: dict[str, float] = {}
        started = time.monotonic()
        self._spark = active_session()
        self._own_spark = self._spark is None
        if self._own_spark:
            builder = SparkSession.builder.master(str(self.cfg.backend.master)).appName(str(self.cfg.backend.app_name))
            for key, value in self.spark_conf().items():
                builder = builder.config(key, value)
            self._spark = builder.getOrCreate()
        self.timings["spark_ready_s"] = time.monotonic() - started

        import ray
        from ray.util.spark import setup_ray_cluster

        address, _ = setup_ray_cluster(**self.setup_args())
        self._ray_on_spark = True
        self.timings["ray_ready_s"] = time.monotonic() - started
        ray.init(address=address, log_to_driver=True)
        return address

    def stop(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if getattr(self, "_ray_on_spark", False):
            from ray.util.spark import shutdown_ray_cluster

            self._ray_on_spark = False
            shutdown_ray_cluster()
        if getattr(self, "_own_spark", False):
            self._own_spark = False
            stop_session_and_jvm(self._spark)
        for key, value in getattr(self, "_saved_env", {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}
        if getattr(self, "_worker_dir", None):
            shutil.rmtree(self._worker_dir, ignore_errors=True)
            self._worker_dir = None


def stop_session_and_jvm(spark) -> None:
    """spark.stop() ends the executors; the py4j gateway JVM lives until Python exits unless
    it is shut down too, and a later SparkSession in this process then starts a new one."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        process = getattr(gateway, "proc", None)
        gateway.shutdown()
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
        SparkContext._gateway = None
        SparkContext._jvm = None
