"""The user's code, named in the config as `module:function` (or given to `rayflow.run` as a
Python object), found and checked before anything starts.

Names resolve as they do under `python -m`: the directory rayflow runs from comes first, then
installed packages. Ray gives its workers the driver's directory too (`py_driver_sys_path`), so
a trial imports `train` from the same folder the driver did; a job on a remote cluster runs in
Ray's copy of its `working_dir`, which Ray puts on its workers' path
(rayflow.orchestrator.job_files).

An object given to `rayflow.run(trainable=objective)` is registered here under the name the
config shows for it (`__main__:objective`), so the rest of rayflow reads one config key whether
the user named a function or handed one over.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

from rayflow.errors import ConfigError


class _Given:
    """The objects rayflow.run was given, by the config value naming each (`module:qualname`).
    Process-wide: the config carries the name only, and what resolves it later in this process
    (`load`, `is_given`: the checks before a start, the workload) is handed the config alone; its
    one instance is `_GIVEN`."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}


_GIVEN = _Given()


def give(obj: Any) -> str:
    """Register an object handed to rayflow.run; returns the name the config holds for it."""
    if not callable(obj):
        raise TypeError(f"expected a function or class, got {type(obj).__name__}")
    module = getattr(obj, "__module__", None) or "__main__"
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "callable")
    name = f"{module}:{qualname}"
    _GIVEN.objects[name] = obj
    return name


def forget(name: str) -> None:
    _GIVEN.objects.pop(name, None)


def is_given(name: str) -> bool:
    return name in _GIVEN.objects


def _working_directory_first() -> None:
    """What `python -m` does: the current directory heads the import path. The `rayflow` console
    script and a notebook kernel started elsewhere do not have it; `python -m rayflow` does."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)


def module_of(name: str) -> str:
    return name.split(":", 1)[0]


def load(name: Any, key: str) -> Any:
    """The object `module:attribute` names (attribute may be dotted), imported now; ConfigError
    naming `key` with the import error's last line when it cannot be had, or is not callable."""
    if not isinstance(name, str) or name.count(":") != 1 or not all(name.split(":")):
        raise ConfigError(key, f"must be module:function (e.g. train:objective), got {name!r}")
    if name in _GIVEN.objects:
        return _GIVEN.objects[name]
    module_name, attribute = name.split(":")
    _working_directory_first()
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        missing = getattr(err, "name", None)
        where = f" (not in {os.getcwd()} nor installed)" if missing == module_name else ""
        raise ConfigError(key, f"cannot import {module_name}{where}: {_last_line(err)}") from None
    # Importing user code runs it: whatever it raises is the user's error, one line naming the key.
    except Exception as err:  # noqa: BLE001
        raise ConfigError(key, f"importing {module_name} failed: {_last_line(err)}") from None
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ConfigError(key, f"{module_name} has no {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(key, f"{name} is a {type(obj).__name__}, not a function or class")
    return obj


def _last_line(err: BaseException) -> str:
    lines = traceback.format_exception_only(type(err), err)
    return " ".join(lines[-1].split()) if lines else type(err).__name__
