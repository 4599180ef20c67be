"""What a Ray node needs to run rayflow, pinned to the versions this machine runs: the pip
requirements of a cloud VM's setup commands (backend=vm) and of a submitted job's runtime_env
(backend=kuberay)."""

from __future__ import annotations

# rayflow's runtime dependencies, pinned on every cloud node to what this machine runs.
RUNTIME_PACKAGES = ("torch", "mlflow", "hydra-core", "omegaconf", "filelock", "numpy", "pyyaml")


def installed_version(name: str) -> str:
    from importlib.metadata import version

    return version(name).split("+")[0]  # torch 2.13.0+cpu -> 2.13.0: PyPI's build for the node


def pinned(packages, rename: dict[str, str] | None = None) -> list[str]:
    """`name==version` as installed here (unpinned where it is not installed here); `rename`
    pins another distribution at the same version (mlflow -> mlflow-skinny)."""
    from importlib.metadata import PackageNotFoundError

    pins = []
    for package in packages:
        shipped = (rename or {}).get(package, package)
        try:
            pins.append(f"{shipped}=={installed_version(package)}")
        except PackageNotFoundError:  # not installed here: leave it to pip on the node
            pins.append(shipped)
    return pins


def runtime_requirements(ray_version: str) -> list[str]:
    """pip requirements pinning Ray and rayflow's runtime dependencies to this machine's
    versions."""
    return [f"ray[default,tune]=={ray_version}", *pinned(RUNTIME_PACKAGES)]
