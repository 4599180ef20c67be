"""A job's output folder (`.hydra/`, `<task>.log`, what the task wrote) from the node it ran on to
the launching machine: packed as a tar archive in the job's return value, unpacked under the local
sweep dir. Used where the nodes do not share this machine's files (every backend but local)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

# The most one job brings back (bytes, before compression): outputs travel in the job's return
# value, and from a submitted sweep in its driver log. Bigger artifacts belong in storage the
# job writes itself (MLflow, s3://, a shared mount).
SYNC_LIMIT = 64 * 2**20


def pack(folder: str, limit: int = SYNC_LIMIT, skip: str | None = None) -> tuple[bytes, list[str]]:
    """`folder` as a gzipped tar (paths relative to it), but for the folder `skip` inside it, and
    the files left out: those that would take the archive past `limit`, smallest first kept."""
    root = Path(folder)
    skipped = Path(skip) if skip else None
    files = sorted((p for p in root.rglob("*") if p.is_file() and not p.is_symlink()
                    and not (skipped and p.is_relative_to(skipped))), key=lambda p: p.stat().st_size)
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


def unpack(archive: bytes, folder: str) -> None:
    """Files of `pack` into `folder` (made if missing; files already there are replaced)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or member.name.startswith(("/", "..")) or ".." in Path(member.name).parts:
                continue  # only plain files, inside the folder
            target = os.path.join(folder, member.name)
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            with source, open(target, "wb") as out:
                out.write(source.read())
