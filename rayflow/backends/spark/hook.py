"""The Ray-on-Spark start hook rayflow installs (RAY_ON_SPARK_START_HOOK).

Ray on Spark adds a hook's `custom_environment_variables()` to the environment of the
head node and of every worker node that Spark tasks launch. That is how rayflow's token
auth mode, the token itself and MLflow's tracking settings reach Ray nodes on machines
whose environment the driver does not control. Ray loads the hook with no arguments.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ray.util.spark.utils import is_in_databricks_runtime

from rayflow.security.auth import auth_token

# On Databricks, keep Databricks' own defaults (temp dir, dashboard proxy, creds). mypy reads the
# portable base: a base class must be one class to it (the Databricks hook subclasses it).
if TYPE_CHECKING or not is_in_databricks_runtime():
    from ray.util.spark.start_hook_base import RayOnSparkStartHook as _Base
else:
    from ray.util.spark.databricks_hook import (
        DefaultDatabricksRayOnSparkStartHook as _Base,
    )

# What Ray nodes, and the trials on them, must see as the driver does.
FORWARDED = (
    "RAY_AUTH_MODE",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "DATABRICKS_HOST",
    "DATABRICKS_TOKEN",
)


def forwarded_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in FORWARDED if os.environ.get(k)}
    if env.get("RAY_AUTH_MODE") == "token":
        token = auth_token()
        if token:
            env["RAY_AUTH_TOKEN"] = token  # worker machines may not share the driver's ~/.ray
    return env


class RayflowStartHook(_Base):
    def __init__(self, is_global: bool = False):
        super().__init__(is_global)

    def custom_environment_variables(self) -> dict[str, str]:
        return {**super().custom_environment_variables(), **forwarded_env()}
