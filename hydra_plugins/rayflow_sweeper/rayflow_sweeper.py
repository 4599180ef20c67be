"""`hydra/sweeper=rayflow`: Hydra finds this module in the `hydra_plugins` namespace package of
rayflow's wheel and registers the config node below. Only Hydra, OmegaConf and YAML load here;
the search itself (rayflow.sweeper.sweep: ray, the backend) loads when a multirun calls sweep()."""

from __future__ import annotations

from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from rayflow.sweeper.node import SAMPLER_GROUP, sweeper_node

ConfigStore.instance().store(
    group="hydra/sweeper", name="rayflow", node=sweeper_node(), provider="rayflow"
)
# The Optuna sweeper's sampler group, so that an app's `override hydra/sweeper/sampler: tpe` line
# composes without that plugin (its own entries, where it is installed, say the same)
for name, target in SAMPLER_GROUP.items():
    ConfigStore.instance().store(
        group="hydra/sweeper/sampler",
        name=name,
        node={"_target_": target, "seed": None},
        provider="rayflow",
    )


class RayflowSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        # Hydra instantiates the sweeper with its config node's keys, interpolations resolved
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

    def sweep(self, arguments: list[str]) -> None:
        from rayflow.sweeper.sweep import sweep

        assert self.config is not None and self.hydra_context is not None
        return sweep(self, arguments)
