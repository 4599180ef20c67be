"""Hydra config groups, installed as the package rayflow.conf so a wheel carries them."""
