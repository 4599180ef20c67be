"""rayflow: one Hydra config, the same Ray Tune / Ray Train job on every kind of cluster."""

__version__ = "0.1.0"
