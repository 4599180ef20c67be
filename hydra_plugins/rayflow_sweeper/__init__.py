"""rayflow's Hydra sweeper plugin: `hydra/sweeper=rayflow` (rayflow_sweeper.py)."""
