"""`hydra/launcher=rayflow`: Hydra finds this module in the `hydra_plugins` namespace package of
rayflow's wheel and registers the config node below. Only Hydra, OmegaConf and YAML load here, so
discovering plugins stays fast; the launch itself (rayflow.launcher.launch: ray, the backend)
loads when a multirun calls launch()."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from rayflow.launcher.node import launcher_node

ConfigStore.instance().store(
    group="hydra/launcher", name="rayflow", node=launcher_node(), provider="rayflow"
)


class RayflowLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        # Hydra instantiates the launcher with its config node's keys, interpolations resolved
        self.settings = OmegaConf.create(dict(settings))
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from rayflow.launcher.launch import launch

        assert (
            self.config is not None
            and self.hydra_context is not None
            and self.task_function is not None
        )
        return launch(self, job_overrides, initial_job_idx)
