"""rayflow's Hydra launcher plugin: `hydra/launcher=rayflow` (rayflow_launcher.py)."""
