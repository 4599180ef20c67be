"""Object storage for experiments: `storage_path` as an `s3://` or `gs://` URI, through pyarrow's
filesystems, the ones Ray Tune and Ray Train write to (so what rayflow reads and writes there is
where they look, under the same settings).

Every node of a cluster whose nodes are separate machines sees one bucket where it would not see
one local folder. An S3-compatible store is reached through the standard AWS settings
(AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, a
profile); Google Cloud Storage through its application default credentials. rayflow passes
nothing of them on argv or in a config: they stay in the environment (rayflow.orchestrator
.submission forwards them to a job like MLflow's).

`probe` checks a store before anything starts, within a bounded wait, and says in one line what
is wrong (no answer, no such bucket, credentials refused) without the credentials.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROBE_TIMEOUT_S = 20.0
# What the environment may hold for a store; forwarded to a job's driver and its trials.
STORAGE_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_EC2_METADATA_DISABLED",
)
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


# Caps on what rayflow reads from a store (a bucket is a shared place: what is under a name it
# reads, and how much, is whoever wrote it's choice): a small object (its state, a manifest, a
# lease) unless a smaller cap is given, and a pull, by default and for an experiment's mirror.
TEXT_MAX = 16 * 2**20
PULL_FILES_MAX, PULL_BYTES_MAX = 1_000_000, 256 * 2**30
CHUNK = 4 * 2**20


class StorageError(Exception):
    """A store that cannot be used, in one line (no credentials in it)."""


class ReadRefused(StorageError):
    """An object, or a pull, past rayflow's cap on what it reads: one line saying which."""

    def __init__(self, uri: str, size: int, limit: int, what: str = "bytes") -> None:
        super().__init__(
            f"{uri} holds {size} {what}, over the {limit} {what} rayflow reads from it "
            "(written by something else than a rayflow run, or not meant to be read back)"
        )
        self.uri = uri


def is_uri(value: object) -> bool:
    return "://" in str(value)


def scheme(uri: str) -> str:
    return uri.split("://", 1)[0].lower()


def checkpoint_uri(checkpoint: Any) -> str:
    """Where a Ray Checkpoint is: its folder, or a URI on an object store (Ray names it by its
    filesystem's path, which leaves the scheme out)."""
    scheme = {"S3FileSystem": "s3", "GcsFileSystem": "gs"}.get(type(checkpoint.filesystem).__name__)
    return f"{scheme}://{checkpoint.path}" if scheme else str(checkpoint.path)


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)])


def parent(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[0]


def name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _fs(uri: str) -> tuple[Any, str]:
    from pyarrow import fs

    return fs.FileSystem.from_uri(uri)


def filesystem(uri: str) -> tuple[Any, str]:
    """(pyarrow's filesystem of `uri`, the object's path in it)."""
    return _fs(uri)


def read_bytes(uri: str, limit: int) -> bytes | None:
    """The object's bytes, or None where there is none; ReadRefused past `limit` bytes (a shared
    store may hold anything under a name rayflow reads: it reads no more than it needs)."""
    from pyarrow import fs as pafs

    filesystem, path = _fs(uri)
    info = filesystem.get_file_info(path)
    if info.type != pafs.FileType.File:
        return None
    if info.size is not None and info.size > limit:
        raise ReadRefused(uri, info.size, limit)
    with filesystem.open_input_stream(path) as f:
        data = f.read(limit + 1)  # what was written since it was listed counts too
    if len(data) > limit:
        raise ReadRefused(uri, len(data), limit)
    return bytes(data)


def read_capped(where: str, limit: int) -> bytes | None:
    """An object's bytes, or a file's of this machine (not through a symlink), at most `limit`
    (ReadRefused past them); None where there is none."""
    import os

    if is_uri(where):
        return read_bytes(where, limit)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ReadRefused(where, len(data), limit)
    return data


def read_text(uri: str, limit: int = TEXT_MAX) -> str | None:
    """The object's text, or None where there is none (ReadRefused past `limit` bytes)."""
    data = read_bytes(uri, limit)
    return None if data is None else data.decode()


def write_text(uri: str, text: str) -> None:
    filesystem, path = _fs(uri)
    with filesystem.open_output_stream(path) as f:
        f.write(text.encode())


def delete(uri: str) -> None:
    from pyarrow import fs as pafs

    filesystem, path = _fs(uri)
    if filesystem.get_file_info(path).type == pafs.FileType.File:
        filesystem.delete_file(path)


def modified(uri: str) -> float | None:
    """The object's last change (seconds since the epoch), or None: there is none."""
    from pyarrow import fs as pafs

    filesystem, path = _fs(uri)
    info = filesystem.get_file_info(path)
    if info.type != pafs.FileType.File:
        return None
    return info.mtime.timestamp() if info.mtime else 0.0


def children(uri: str) -> list[str]:
    """The names directly under `uri` (none where it does not exist)."""
    from pyarrow import fs as pafs

    filesystem, path = _fs(uri)
    selector = pafs.FileSelector(path, allow_not_found=True)
    return sorted(Path(i.path).name for i in filesystem.get_file_info(selector))


def walk(uri: str) -> Iterator[tuple[str, bool]]:
    """(path relative to `uri`, is a file) for everything below it."""
    from pyarrow import fs as pafs

    filesystem, path = _fs(uri)
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    for info in filesystem.get_file_info(selector):
        yield info.path[len(path.rstrip("/")) + 1 :], info.type == pafs.FileType.File


def files(uri: str) -> list[tuple[str, int, float]]:
    """(path relative to `uri`, size, last change) of every file below it (none where it does not
    exist), in one listing."""
    from pyarrow import fs as pafs

    filesystem, path = _fs(uri)
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    cut = len(path.rstrip("/")) + 1
    return [
        (i.path[cut:], int(i.size or 0), i.mtime.timestamp() if i.mtime else 0.0)
        for i in filesystem.get_file_info(selector)
        if i.type == pafs.FileType.File
    ]


def pull(
    uri: str,
    local: Path,
    skip: Callable[[str], bool],
    max_files: int = PULL_FILES_MAX,
    max_bytes: int = PULL_BYTES_MAX,
) -> None:
    """Copy what is below `uri` into `local`, but the files `skip` names (by relative path);
    folders are made whatever they hold, so their names are there to read. A bucket is a shared
    place: a key that would land outside `local` (`..`, an absolute part) is passed by; a key that
    is also a folder's (`a` beside `a/b`) is passed by with one warning; past `max_files` files or
    `max_bytes` bytes nothing is copied (ReadRefused), checked on the listing and again as the
    bytes come."""
    filesystem, root = _fs(uri)
    inside = local.resolve()
    entries = [
        (relative, is_file)
        for relative, is_file in walk(uri)
        if inside in (t := (local / relative).resolve(), *t.parents)
    ]
    folders = {r for r, is_file in entries if not is_file}
    folders |= {str(p) for r, _ in entries for p in Path(r).parents if str(p) != "."}
    clashing = sorted(r for r, is_file in entries if is_file and r in folders)
    if clashing:
        _warn(
            f"{uri}: passed by {len(clashing)} object(s) whose key is also a folder's "
            f"({', '.join(clashing[:3])}{', ...' if len(clashing) > 3 else ''})"
        )
    wanted = [r for r, is_file in entries if is_file and r not in folders and not skip(r)]
    sizes = {r: s for r, s, _ in files(uri)} if wanted else {}
    if len(wanted) > max_files:
        raise ReadRefused(uri, len(wanted), max_files, "files")
    if sum(sizes.get(r, 0) for r in wanted) > max_bytes:
        raise ReadRefused(uri, sum(sizes.get(r, 0) for r in wanted), max_bytes)
    for folder in sorted(folders):
        (local / folder).mkdir(parents=True, exist_ok=True)
    copied = 0
    for relative in wanted:
        with filesystem.open_input_stream(f"{root}/{relative}") as source:
            copied = _copy(source, local / relative, copied, (uri, max_bytes))


def _copy(source: Any, target: Path, copied: int, cap: tuple[str, int]) -> int:
    """`source` into `target`, the pull's bytes so far `copied`, refused past the pull's cap
    (ReadRefused); the pull's bytes after it."""
    with open(target, "wb") as out:
        while chunk := source.read(CHUNK):
            copied += len(chunk)
            if copied > cap[1]:
                raise ReadRefused(cap[0], copied, cap[1])
            out.write(chunk)
    return copied


def _warn(text: str) -> None:
    import sys

    from rayflow.security.redaction import mask_text

    print(f"rayflow: warning: {mask_text(text)}", file=sys.stderr, flush=True)


def push(local: Path, uri: str) -> None:
    """A file or folder of this machine to `uri`."""
    from pyarrow import fs as pafs

    filesystem, path = _fs(uri)
    pafs.copy_files(
        str(local),
        path,
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=filesystem,
    )


@dataclass
class _Outcome:
    error: BaseException | None = None
    done: bool = False


def probe(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """StorageError unless the store answers within `timeout_s`, its bucket exists and a marker
    object can be written and removed there. Waits no longer than `timeout_s` (the SDK's own
    retries run in a thread left behind, a daemon)."""
    outcome = _Outcome()

    def attempt() -> None:
        try:
            _write_marker(uri)
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread as it is
            outcome.error = err
        outcome.done = True

    thread = threading.Thread(target=attempt, name="rayflow-storage-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome.done:
        raise StorageError(f"{uri}: no answer from the store within {timeout_s:g} s{_where(uri)}")
    if outcome.error is not None:
        raise StorageError(f"{uri}: {_reason(outcome.error, uri)}")


def _probe_fs(uri: str) -> tuple[Any, str]:
    """The store as `_fs` makes it, but S3 with one attempt per request and a connect timeout:
    the SDK's own retries would outlast the probe's wait on a store that does not answer."""
    import os
    from urllib.parse import urlsplit

    from pyarrow import fs as pafs

    if scheme(uri) != "s3":
        return _fs(uri)
    path = uri.split("://", 1)[1]
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not region and not endpoint:  # AWS itself: the bucket's own region, as from_uri finds it
        region = pafs.resolve_s3_region(path.split("/", 1)[0])
    where = {}
    if endpoint:
        parts = urlsplit(endpoint)
        where = {"endpoint_override": parts.netloc or endpoint, "scheme": parts.scheme or "https"}
    filesystem = pafs.S3FileSystem(
        region=region,
        connect_timeout=5,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        **where,
    )
    return filesystem, path


def _write_marker(uri: str) -> None:
    from pyarrow import fs as pafs

    filesystem, path = _probe_fs(uri)
    bucket = path.split("/", 1)[0]
    if filesystem.get_file_info(bucket).type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"bucket {bucket!r} does not exist")
    marker = f"{path.rstrip('/')}/.rayflow-probe-{uuid.uuid4().hex[:12]}"
    with filesystem.open_output_stream(marker) as f:
        f.write(b"rayflow checks it can write here\n")
    filesystem.delete_file(marker)


def _where(uri: str) -> str:
    import os

    if scheme(uri) != "s3":
        return ""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return f" (endpoint {endpoint})" if endpoint else ""


# The SDK's words for a refusal, each with what the user does about it.
_REFUSALS = (
    (
        ("InvalidAccessKeyId", "INVALID_ACCESS_KEY_ID", "SignatureDoesNotMatch"),
        "the store refused the credentials (check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or "
        "the profile; for gs://, the application default credentials)",
    ),
    (
        ("SIGNATURE_DOES_NOT_MATCH", "InvalidClientTokenId", "AccessDenied", "ACCESS_DENIED"),
        "the store refused the credentials, or they may not use this bucket (check "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or the profile, and the bucket's policy; for "
        "gs://, the application default credentials)",
    ),
    (
        ("NoSuchBucket", "NO_SUCH_BUCKET", "does not exist", "NOT_FOUND"),
        "the bucket does not exist (create it, or fix the name)",
    ),
    (
        ("NETWORK_CONNECTION", "Couldn't connect", "Connection refused", "curlCode: 7"),
        "cannot connect to the store",
    ),
    (("Could not resolve", "curlCode: 6"), "cannot resolve the store's address"),
)


def _reason(err: BaseException, uri: str) -> str:
    """One line for a failed probe: a known refusal in words, else the SDK's first line."""
    from rayflow.security.redaction import mask_text

    text = str(err)
    for marks, words in _REFUSALS:
        if any(m.lower() in text.lower() for m in marks):
            return words + _where(uri)
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return f"{type(err).__name__}: {mask_text(first)}{_where(uri)}"
