"""A Hydra app whose parameter search runs as one Ray Tune run: the same app sweeps with Hydra's
Optuna sweeper (`hydra/sweeper=optuna`) or with rayflow's, by that one line of conf/config.yaml.

    python sphere.py -m                                   # the search in conf/config.yaml
    python sphere.py -m hydra.sweeper.scheduler=asha      # bad trials stopped at their first reports
    python sphere.py -m hydra.sweeper.backend=spark       # the same search on Ray on Spark

The task is a curve that falls toward x^2 + y^2 over `steps` reports, one every `step_s` seconds:
rayflow.report shows a scheduler each point (outside hydra/sweeper=rayflow it does nothing).
"""

import logging
import time

import hydra
from omegaconf import DictConfig

import rayflow

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def sphere(cfg: DictConfig) -> float:
    if cfg.get("error", False):
        raise RuntimeError("cfg.error is True")
    target = cfg.x**2 + cfg.y**2
    value = target
    for step in range(1, cfg.steps + 1):
        time.sleep(cfg.step_s)
        value = target + 10.0 / step  # a learning curve: falls toward the target
        rayflow.report(objective=value)
    log.info(f"x={cfg.x} y={cfg.y}: {value}")
    return value


if __name__ == "__main__":
    sphere()
