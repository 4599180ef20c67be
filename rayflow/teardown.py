"""`python -m rayflow.teardown PATH`: stop a cluster rayflow started, after its client died.

rayflow prints this command on every error path of a backend=vm run (a kept cluster is stopped
with `rayflow down NAME`, which reads its record; this needs none). PATH is what that run left:
the temp dir of a fake_multinode cluster (every process naming it is stopped), or the cluster
YAML of a local/aws/gcp cluster (Ray's teardown_cluster, and `ray stop` on the worker hosts of a
local cluster, which `ray down` leaves running). The cluster's records in this user's state
folders (rayflow.backends.vm.state, rayflow.backends.kept) go with it.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m rayflow.teardown CLUSTER_TEMP_DIR_OR_YAML", file=sys.stderr)
        return 2
    path = Path(argv[0])
    from rayflow.backends.vm import kept_ops
    from rayflow.backends.vm.state import forget

    if path.is_dir():
        # only what rayflow made: its processes are stopped and the folder removed
        if kept_ops.not_rayflows(str(path), fake=True):
            print(
                f"rayflow.teardown: {path} is not a fake_multinode cluster's temp dir of yours "
                "(rf-vm-*, with its autoscaling.yaml): nothing stopped",
                file=sys.stderr,
            )
            return 2
        kept_ops.stop_fake(str(path))
    elif path.is_file():
        kept_ops.stop_sdk(str(path))
    else:
        print(f"rayflow.teardown: {path} does not exist (already torn down?)", file=sys.stderr)
        return 1
    forget(argv[0])
    _forget_kept(argv[0])
    return 0


def _forget_kept(path: str) -> None:
    """The kept-cluster record (`rayflow status`) of the cluster PATH was."""
    from rayflow.backends import kept

    for record in kept.records():
        if path in (record.where.get("temp_dir"), record.where.get("config_file")):
            kept.forget(record)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
