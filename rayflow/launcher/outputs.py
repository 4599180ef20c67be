"""A job's output folder (`.hydra/`, `<task>.log`, what the task wrote) from the node it ran on to
the launching machine: packed as a tar archive in the job's return value, unpacked under the local
sweep dir. Used where the nodes do not share this machine's files (every backend but local).

What comes back is the node's word, so `unpack` trusts none of it: plain files only, inside the
job's own output folder only, never through a symlink, within the size limit."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tarfile
from pathlib import Path

from rayflow.errors import JobError

# The most one job brings back (bytes, before compression): outputs travel in the job's return
# value, and from a submitted sweep in its driver log. Bigger artifacts belong in storage the
# job writes itself (MLflow, s3://, a shared mount).
SYNC_LIMIT = 64 * 2**20
MAX_MEMBERS = 100_000  # files of one job's outputs, unpacked


def pack(folder: str, limit: int = SYNC_LIMIT, skip: str | None = None) -> tuple[bytes, list[str]]:
    """`folder` as a gzipped tar (paths relative to it), but for the folder `skip` inside it, and
    the files left out: those that would take the archive past `limit`, smallest first kept."""
    root = Path(folder)
    skipped = Path(skip) if skip else None
    files = sorted(
        (
            p
            for p in root.rglob("*")
            if p.is_file() and not p.is_symlink() and not (skipped and p.is_relative_to(skipped))
        ),
        key=lambda p: p.stat().st_size,
    )
    buffer, total, left_out = io.BytesIO(), 0, []
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in files:
            size = path.stat().st_size
            if total + size > limit:
                left_out.append(f"{path.relative_to(root)} ({size / 2**20:.1f} MiB)")
                continue
            total += size
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buffer.getvalue(), left_out


class UnsafeArchive(JobError):
    """A job's archive that `pack` could not have made: a link, a device, a path leaving the
    folder, more than the limit. Refused whole: what sent it is not to be trusted."""


def unpack(
    archive: bytes, folder: str, limit: int = SYNC_LIMIT, max_members: int = MAX_MEMBERS
) -> int:
    """Files of `pack` into `folder` (made if missing; files already there are replaced), and
    nowhere else: only regular files, every path inside the folder, each folder on the way and
    the file itself opened without following a symlink (one planted there, or an earlier member,
    cannot redirect a write), at most `limit` bytes and `max_members` members in all. Anything
    else refuses the archive (UnsafeArchive), naming the member. Returns how many files it wrote."""
    root, total, count, written = None, 0, 0, 0
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            for member in tar:
                count += 1
                total += max(member.size, 0)
                if count > max_members or total > limit:
                    raise UnsafeArchive(
                        f"a job's outputs hold more than {max_members} files or {limit // 2**20} "
                        "MiB"
                    )
                parts = _parts(member.name)
                # links, devices, fifos: pack makes none (folders come with their files)
                if not member.isfile():
                    if member.isdir():
                        continue
                    raise UnsafeArchive(
                        f"a job's outputs hold {member.name!r}, which is not a plain file"
                    )
                if root is None:  # made with its first file: an empty archive leaves no folder
                    Path(folder).mkdir(parents=True, exist_ok=True)
                    root = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
                source = tar.extractfile(member)
                assert source is not None
                with source:
                    _write_below(root, parts, source)
                written += 1
    except (tarfile.TarError, EOFError, OSError) as err:
        raise UnsafeArchive(
            f"a job's outputs could not be unpacked safely: {type(err).__name__}: {err}"
        ) from None
    finally:
        if root is not None:
            os.close(root)
    return written


def _parts(name: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or not parts or ".." in parts:
        raise UnsafeArchive(f"a job's outputs hold {name!r}, a path outside its folder")
    return parts


def _write_below(root: int, parts: list[str], source) -> None:
    """`source` into root/parts..., each folder entered with O_NOFOLLOW, the file opened with it."""
    fd = os.dup(root)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=fd)
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
        out = os.open(
            parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666, dir_fd=fd
        )
        with os.fdopen(out, "wb") as target:
            shutil.copyfileobj(source, target)
    finally:
        os.close(fd)
