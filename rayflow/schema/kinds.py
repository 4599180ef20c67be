"""The kinds of value a config key can hold, each with the one-line message a user gets when a
value is not of its kind. A kind is an `Annotated` type for pydantic: a check that runs before
pydantic's own (so Hydra's strings are never coerced: `maybe` is not a boolean, `3.5` not an
integer) and a `Kind` that says in words what it takes (the config reference prints it)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationInfo


@dataclass(frozen=True)
class Kind:
    """What a key takes, in words (the config reference's type column)."""

    words: str


class KeyedError(ValueError):
    """A rule of a model that names a key of its own (relative to the model), not the model."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def kind(words: str, check: Callable[[Any], Any], optional: bool = False) -> Any:
    def run(value: Any) -> Any:
        if value is None and optional:
            return None
        return check(value)

    return Annotated[Any, BeforeValidator(run), Kind(f"{words}, or null" if optional else words)]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# Every number a key takes has an upper bound (tests/test_security_state.py walks the schema for
# it): a value beyond any real use is a typo or an attack, and left through it overflows a C
# timeout (OverflowError), allocates until the machine dies, or waits forever. A key with a
# tighter limit of its own says so; these are the defaults.
COUNT_MAX = 1_000_000  # trials, workers, epochs, replicas, batch sizes: more is no real run
NUMBER_MAX = 1e6  # rates, factors, CPUs per trial
BYTES_MAX = 2**50  # 1 PiB: more memory than any node has
SECONDS_MAX = 86_400  # one day: a timeout longer than that is a hang, not a wait
TIME_BUDGET_MAX = 30 * 86_400  # a whole search's own time budget: a month
PORT_MIN, PORT_MAX = 1024, 65535  # ports rayflow binds: below 1024 needs root
NAME_MAX = 255  # bytes of one file or folder name (Linux's NAME_MAX)
# bytes of a folder path: room left under Linux's 4096 for the experiment's and trials' folders
PATH_MAX = 3072


def _integer(minimum: int, maximum: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"must be an integer >= {minimum}, got {value!r}")
        if value > maximum:
            raise ValueError(f"must be at most {maximum}, got {value!r}")
        return value

    return check


def _number(allow_zero: bool, at_most: float) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if not _is_number(value) or value < 0 or (value == 0 and not allow_zero):
            raise ValueError(f"must be a number {'>= 0' if allow_zero else '> 0'}, got {value!r}")
        if value > at_most:
            raise ValueError(f"must be at most {at_most:g}, got {value!r}")
        return float(value)

    return check


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def _one_of(choices: tuple[Any, ...], optional: bool = False) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value not in choices:
            raise ValueError(
                f"must be one of {', '.join(map(str, choices))}{' or null' if optional else ''}; "
                f"got {value!r}"
            )
        return value

    return check


def _fraction(value: Any) -> float:
    if not _is_number(value) or not 0 < value < 1:
        raise ValueError(f"must be between 0 and 1 (exclusive); got {value!r}")
    return float(value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def _folder_name(max_bytes: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = _text(value) if isinstance(value, str) else str(value)
        if text in (".", "..") or "/" in text or os.sep in text or "\0" in text or not text.strip():
            raise ValueError(
                f"must be a name used as one folder (no '/', not '.' or '..'); got {value!r}"
            )
        if len(text.encode("utf-8", "surrogateescape")) > max_bytes:
            raise ValueError(
                f"must be at most {max_bytes} bytes (a folder's name), got "
                f"{len(text.encode('utf-8', 'surrogateescape'))}"
            )
        return text

    return check


def path_length_error(value: str) -> str | None:
    """Why `value` is no path this machine's filesystems take (a name over NAME_MAX bytes, the
    whole over PATH_MAX, a NUL), or None: checked before anything touches the path, which would
    fail with `File name too long` once Ray runs."""
    raw = value.encode("utf-8", "surrogateescape")
    if b"\0" in raw:
        return "must not contain a NUL character"
    if len(raw) > PATH_MAX:
        return f"must be at most {PATH_MAX} bytes (a path), got {len(raw)}"
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return f"has a name of {len(longest)} bytes; a file or folder name is at most {NAME_MAX}"
    return None


RAY_MIN_OBJECT_STORE = 78643200  # Ray's floor for object_store_memory (bytes)

# Pseudo-filesystems: nothing rayflow writes can live there, whatever the permissions say.
_VIRTUAL = (Path("/proc"), Path("/sys"), Path("/dev"))


OBJECT_STORES = ("s3", "gs", "gcs")  # pyarrow's object stores, which Ray Tune and Train write to


def object_storage_error(value: str) -> str:
    """An object-store URI where only a folder of the machines will do (data.root)."""
    scheme = value.split("://", 1)[0]
    return f"{value}: must be a folder path ({scheme}:// is taken by storage_path only)"


def object_store_error(value: str) -> str | None:
    """Why `value` is not an object-store URI an experiment can live under, or None."""
    kind, _, rest = value.partition("://")
    if kind.lower() not in OBJECT_STORES:
        return (
            f"{value}: {kind}:// is not an object store rayflow writes to; use s3://, gs:// or "
            "a folder"
        )
    bucket = rest.split("/", 1)[0]
    if not bucket or any(c.isspace() for c in rest):
        return f"{value}: want {kind}://BUCKET/PATH"
    return None


def writable_dir_error(value: Any) -> str | None:
    """Why `value` cannot be a directory this process creates and writes, or None. Nothing is
    created: the nearest existing ancestor must be a writable directory."""
    if not isinstance(value, str) or not value.strip():
        return f"must be a directory path, got {value!r}"
    if "://" in value:
        return object_storage_error(value)
    too_long = path_length_error(value) or path_length_error(
        str(Path(value).expanduser().absolute())
    )
    if too_long:
        return f"{value[:80]}{'...' if len(value) > 80 else ''} {too_long}"
    path = Path(value).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path
    virtual = next((v for v in _VIRTUAL if path == v or v in path.parents), None)
    if virtual is not None:
        return f"{value} is on a virtual filesystem ({virtual}); choose a real directory"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{value} cannot be created: {existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{value} cannot be created or written: {existing} is not writable"
    return None


def _writable_dir(value: Any, info: ValidationInfo) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a directory path, got {value!r}")
    # Paths mean this machine's only where the cluster's nodes share its files (the validation
    # context says: a backend that submits to other machines resolves them on its head).
    if "://" in value:
        raise ValueError(object_storage_error(value))
    if (info.context or {}).get("local_paths", True):
        error = writable_dir_error(value)
        if error:
            raise ValueError(error)
    elif path_length_error(value):
        raise ValueError(path_length_error(value))
    return value


# Schemes a storage path may be mistyped with: one not written `scheme://` (`s3:/b`, `s3:b`,
# `s3//b`) would otherwise be a relative folder named `s3:`, silently on this machine's disk.
_URI_LIKE = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)(?P<sep>:/*|//)(?P<rest>.*)", re.DOTALL
)
_MISTYPED_SCHEMES = (*OBJECT_STORES, "file", "dbfs", "hdfs", "http", "https", "abfs", "abfss", "az")


def mistyped_uri_error(value: str) -> str | None:
    """Why `value`, meant as a URI, is not written as one rayflow reads (with the fix), or None."""
    found = _URI_LIKE.fullmatch(value.strip())
    if not found or found["scheme"].lower() not in _MISTYPED_SCHEMES:
        return None
    scheme, sep, rest = found["scheme"], found["sep"], found["rest"].lstrip("/")
    lower = scheme.lower()
    if lower == "file":
        return f"{value}: give the folder itself, /{rest}"
    if lower == "dbfs":
        return f"{value}: give the mounted folder, /dbfs/{rest} (Databricks mounts DBFS there)"
    if lower in OBJECT_STORES and (sep != "://" or scheme != lower):
        return f"{value}: a mistyped URI; did you mean {lower}://{rest}?"
    return None


def _storage_dir(value: Any, info: ValidationInfo) -> str:
    """A folder (as WritableDir) or an object-store URI (checked for its form here, reached by
    the preflight's probe)."""
    mistyped = mistyped_uri_error(value) if isinstance(value, str) else None
    if mistyped:
        raise ValueError(mistyped)
    if isinstance(value, str) and "://" in value:
        error = object_store_error(value.strip())
        if error:
            raise ValueError(error)
        return value.strip()
    return _writable_dir(value, info)


def Integer(minimum: int = 1, maximum: int = COUNT_MAX, optional: bool = False) -> Any:
    return kind(f"integer in [{minimum}, {maximum}]", _integer(minimum, maximum), optional)


def Number(allow_zero: bool = False, at_most: float = NUMBER_MAX, optional: bool = False) -> Any:
    return kind(
        f"number in {'[' if allow_zero else '('}0, {at_most:g}]",
        _number(allow_zero, at_most),
        optional,
    )


def Seconds(at_most: float = SECONDS_MAX, optional: bool = False) -> Any:
    """A timeout or a time budget: > 0, finite, at most `at_most` (a day unless the key says)."""
    return kind(f"seconds in (0, {at_most:g}]", _number(False, at_most), optional)


# How long a kept cluster may sit idle before its watcher tears it down: a week at most; 0 never.
IdleMinutes = kind("minutes in [0, 10080] (0: never)", _number(True, 7 * 24 * 60), optional=True)


def Bytes(minimum: int = 1, optional: bool = False) -> Any:
    """Memory in bytes, up to BYTES_MAX (1 PiB)."""
    return kind(f"bytes in [{minimum}, 2**50]", _integer(minimum, BYTES_MAX), optional)


def Port(minimum: int = PORT_MIN, optional: bool = False) -> Any:
    """A TCP port: up to 65535; from 1024 for one rayflow binds (below needs root)."""
    return kind(f"port in [{minimum}, {PORT_MAX}]", _integer(minimum, PORT_MAX), optional)


def FolderName(max_bytes: int = NAME_MAX) -> Any:
    return kind(f"a name used as one folder (at most {max_bytes} bytes)", _folder_name(max_bytes))


def OneOf(*choices: Any, optional: bool = False) -> Any:
    return kind("one of " + ", ".join(map(str, choices)), _one_of(choices, optional), optional)


Boolean = kind("true or false", _boolean)
OptionalBoolean = kind("true or false", _boolean, optional=True)
Fraction = kind("number between 0 and 1 (exclusive)", _fraction)
Text = kind("string", _text)
OptionalText = kind("string", _text, optional=True)
LOCAL_FOLDER = Kind("a directory that must be creatable and writable")
WritableDir = Annotated[Any, BeforeValidator(_writable_dir), LOCAL_FOLDER]
# storage_path: a folder as above, or an object store every node of a cluster reaches
StorageDir = Annotated[
    Any,
    BeforeValidator(_storage_dir),
    Kind("a directory that must be creatable and writable, or s3://BUCKET/PATH, gs://BUCKET/PATH"),
    LOCAL_FOLDER,  # a folder given is this machine's where the nodes share its files
]
Anything = Annotated[Any, Kind("any value")]
Mapping = Annotated[dict, Kind("a mapping")]


def local_folder_keys(model: Any) -> list[str]:
    """The keys of a model whose kind is a folder of this machine (WritableDir): storage_path, a
    preset's data.root. A run submitted to nodes that share this machine's files gets them
    resolved."""
    return [name for name, field in model.model_fields.items() if LOCAL_FOLDER in field.metadata]
