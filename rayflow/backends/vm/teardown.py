"""`python -m rayflow.backends.vm.teardown PATH`: stop a vm cluster rayflow started, after its
client died.

rayflow prints this command on every error path of a backend=vm run (a kept cluster is stopped
with `rayflow down NAME`, which reads its record; this needs none). PATH is what that run left:
the temp dir of a fake_multinode cluster (every process naming it is stopped), or the cluster
YAML of a local/aws/gcp cluster in this user's cache (a cloud's VMs that carry its owner tag are
terminated; `ray stop` runs on every host of an SSH-hosts cluster): its provider's one way of
stopping it (rayflow.backends.vm.providers), as `rayflow down` and the autostop watcher stop it.
The cluster's records in this user's state folders (rayflow.backends.vm.state,
rayflow.backends.kept) go with it.

PATH is trusted only as this user's own: the folder and the file are checked (never followed if a
link; owned by this user, writable by no one else) before anything is read, run, stopped or
removed by them (rayflow.backends.vm.owned). Another user's folder, even one recreated under a
path a record names, is refused in one line and left as it is.

Records and error lines of older rayflow versions name `python -m rayflow.teardown PATH`: that
command is only printed for a person to run, so it has no module any more (no alias of this one);
run this one with the same PATH.
"""

from __future__ import annotations

import os
import stat
import sys


def _fail(message: str, code: int = 2) -> int:
    from rayflow.security.redaction import mask_text

    print(f"rayflow.backends.vm.teardown: {mask_text(message)}", file=sys.stderr)
    return code


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: python -m rayflow.backends.vm.teardown CLUSTER_TEMP_DIR_OR_YAML",
            file=sys.stderr,
        )
        return 2
    path = argv[0]
    from rayflow.backends.vm import kept as vm_kept
    from rayflow.backends.vm import providers
    from rayflow.backends.vm.providers.base import Stop
    from rayflow.backends.vm.state import forget
    from rayflow.errors import ClusterError

    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return _fail(f"{path} does not exist (already torn down?)", 1)
    if stat.S_ISDIR(info.st_mode):
        # only what rayflow made: its processes are stopped and the folder removed
        problem = vm_kept.not_rayflows(path, fake=True)
        if problem:
            if not os.path.basename(path.rstrip("/")).startswith("rf-vm-"):
                problem = (
                    f"{path} is not a fake_multinode cluster's temp dir of yours (rf-vm-*, "
                    "with its autoscaling.yaml)"
                )
            return _fail(f"{problem}: nothing stopped")
        providers.in_place().terminate(Stop(path=path))
    else:
        problem = vm_kept.not_rayflows(path, fake=False)
        if problem:  # not where rayflow writes them, or not (only) yours: never read
            return _fail(f"{problem}: nothing stopped")
        try:
            vm_kept.stop_sdk(path)
        except ClusterError as err:  # not reached: what is left, and how to finish by hand
            return _fail(str(err), 1)
    forget(path)
    _forget_kept(path)
    return 0


def _forget_kept(path: str) -> None:
    """The kept-cluster record (`rayflow status`) of the cluster PATH was."""
    from rayflow.backends import kept

    for record in kept.records():
        if path in (record.where.get("temp_dir"), record.where.get("config_file")):
            kept.forget(record)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
