"""The app's config files, for a search whose driver runs elsewhere (a Ray Job on the head of a vm
or kuberay cluster): each trial's job config is composed where the driver is, and Hydra composes it
from files. The folders of the app's config search path (`file://` entries, or paths without a
scheme, as Hydra reads them) are copied, their YAML files only, into a folder that travels with
the job; there the search path is pointed at the copies. `pkg://` and `structured://` entries are
the installed packages' and Hydra's ConfigStore (the Singleton state the trials already carry),
the same on every node.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayflow.errors import ConfigError

FILE = "file://"
SUFFIXES = (".yaml", ".yml")  # what Hydra's file config source reads
LIMIT = 16 * 2**20  # a config search path's YAML files, in all


@dataclass(frozen=True)
class ShippedConfigs:
    """Which entries of the config search path were copied, by their place in it, and where to."""

    folder: str  # relative to the bundle: where the copies are
    entries: tuple[tuple[int, str], ...]  # (index in the search path, its copy's subfolder)


def _yaml_files(root: Path) -> list[Path]:
    """A config folder's YAML files, hidden folders and links left out (a link could take in
    anything of this machine)."""
    found = []
    for parent, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and not Path(parent, d).is_symlink()
        )
        for name in sorted(files):
            path = Path(parent, name)
            if name.endswith(SUFFIXES) and not path.is_symlink() and path.is_file():
                found.append(path)
    return found


def _folder(path: str) -> Path | None:
    """The folder of a file entry of the search path (`file://...` or a path without a scheme, as
    Hydra reads it), else None."""
    if path.startswith(FILE):
        return Path(path[len(FILE) :])
    return None if "://" in path else Path(path)


def ship_configs(config_loader: Any, bundle: Path, folder: str = "conf") -> ShippedConfigs:
    """Copy the YAML files of each `file://` folder of `config_loader`'s search path under
    `bundle/folder/<index>`; refused past LIMIT in all."""
    entries, total = [], 0
    for index, element in enumerate(config_loader.config_search_path.get_path()):
        root = _folder(str(element.path))
        if root is None or not root.is_dir():
            continue  # Hydra skips a missing folder too
        target = bundle / folder / str(index)
        target.mkdir(parents=True)
        for path in _yaml_files(root):
            total += path.stat().st_size
            if total > LIMIT:
                raise ConfigError(
                    "hydra.searchpath",
                    f"the app's config folders hold over {LIMIT // 2**20} MiB of YAML "
                    f"(at {path}); a search on a cluster takes them to its head",
                )
            copy_to = target / path.relative_to(root)
            copy_to.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy_to)
        entries.append((index, str(index)))
    return ShippedConfigs(folder, tuple(entries))


def loader_at(config_loader: Any, bundle: Path, shipped: ShippedConfigs) -> Any:
    """A config loader like `config_loader`, its shipped entries pointed at their copies under
    `bundle`; the original is left as it was."""
    search_path = copy.deepcopy(config_loader.config_search_path)
    elements = search_path.get_path()
    for index, subfolder in shipped.entries:
        elements[index].path = f"{FILE}{(bundle / shipped.folder / subfolder).resolve()}"
    return type(config_loader)(config_search_path=search_path)


def ship_search(search: Any, spec: Any, staging: str) -> str:
    """The search, for a driver that is a Ray Job on the cluster's head: a package in `staging`
    (rayflow.workloads.hydra_sweep.PACKAGE, shipped with the job as one of its py_modules) holding
    the trials' spec, pickled, and the app's config files; the trainable named is the one that
    reads it there (rayflow.workloads.hydra_sweep.SHIPPED). The app's own modules travel by
    value, as the launcher sends them. Returns the package's folder."""
    import cloudpickle

    from rayflow.launcher.jobs import ship_app_modules
    from rayflow.workloads.hydra_sweep import BUNDLE, PACKAGE, SHIPPED

    package = Path(staging, PACKAGE)
    package.mkdir(mode=0o700)  # this user's only, while it is staged
    (package / "__init__.py").write_text('"""A hydra/sweeper=rayflow search, shipped."""\n')
    spec.compose.shipped = ship_configs(spec.compose.hydra_context.config_loader, package)
    ship_app_modules(os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv[0] else spec.cwd)
    (package / BUNDLE).write_bytes(cloudpickle.dumps(spec))
    search.set("workload.trainable", SHIPPED)
    return str(package)
