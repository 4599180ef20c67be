"""A Hydra app that knows nothing of Ray or rayflow: fit a line by gradient descent, write
metrics.json in the job's output folder, return the final loss (what a sweeper optimises).

    python my_app.py -m hydra/launcher=rayflow lr=0.01,0.1 steps=50,200
    python my_app.py -m hydra/launcher=rayflow hydra.launcher.backend=spark lr=0.01,0.1
"""

import json
import logging
import os
import random
import time

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)  # Hydra writes it to the job's my_app.log

# A resolver the app registers: it travels with every job to the node that runs it.
OmegaConf.register_new_resolver(
    "scaled", lambda lr, factor: float(lr) * float(factor), replace=True
)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    started = time.time()
    if cfg.fail:
        raise ValueError(f"job {cfg.name} was asked to fail")
    rng = random.Random(cfg.seed)
    data = [
        (x, 3.0 * x + 0.5 + rng.gauss(0, 0.1)) for x in (rng.uniform(-1, 1) for _ in range(200))
    ]
    w = b = 0.0
    for _ in range(cfg.steps):
        gw = sum(2 * (w * x + b - y) * x for x, y in data) / len(data)
        gb = sum(2 * (w * x + b - y) for x, y in data) / len(data)
        w, b = w - cfg.lr * gw, b - cfg.lr * gb
    loss = sum((w * x + b - y) ** 2 for x, y in data) / len(data)
    time.sleep(cfg.hold_s)  # stands for real work: long enough to see jobs run side by side
    out = HydraConfig.get().runtime.output_dir
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump(
            {
                "name": cfg.name,
                "loss": loss,
                "w": w,
                "b": b,
                "decay": cfg.decay,
                "pid": os.getpid(),
                "host": os.uname().nodename,
                "job_num": HydraConfig.get().job.num,
                "started": started,
                "ended": time.time(),
            },
            f,
        )
    log.info(f"{cfg.name}: loss {loss:.4f} after {cfg.steps} steps at lr={cfg.lr}")
    return loss


if __name__ == "__main__":
    main()
