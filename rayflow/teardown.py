"""`python -m rayflow.teardown PATH`: stop a cluster rayflow started, after its client died.

rayflow prints this command on every error path of a backend=vm run, and for a cluster kept
running (`backend.keep_cluster=true`). PATH is what that run left: the temp dir of a
fake_multinode cluster (every process naming it is stopped), or the cluster YAML of a
local/aws/gcp cluster (Ray's teardown_cluster, and `ray stop` on the worker hosts of a local
cluster, which `ray down` leaves running). The cluster's record in this user's state folder
(rayflow.backends.vm.state) goes with it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m rayflow.teardown CLUSTER_TEMP_DIR_OR_YAML", file=sys.stderr)
        return 2
    path = Path(argv[0])
    from rayflow.backends.vm.state import forget

    if path.is_dir():
        from rayflow.runtime.processes import stop_processes_mentioning

        # only what rayflow made: its processes are stopped and the folder removed
        if not (
            path.name.startswith("rf-vm-")
            and (path / "autoscaling.yaml").is_file()
            and path.stat().st_uid == os.getuid()
        ):
            print(
                f"rayflow.teardown: {path} is not a fake_multinode cluster's temp dir of yours "
                "(rf-vm-*, with its autoscaling.yaml): nothing stopped",
                file=sys.stderr,
            )
            return 2

        stop_processes_mentioning(str(path))
        shutil.rmtree(path, ignore_errors=True)
        forget(argv[0])
        return 0
    if path.is_file():
        import yaml
        from ray.autoscaler import sdk

        from rayflow.backends.vm.cluster import stop_local_workers

        config = yaml.safe_load(path.read_text())
        sdk.teardown_cluster(str(path))
        if config.get("provider", {}).get("type") == "local":
            stop_local_workers(config)
        forget(argv[0])
        return 0
    print(f"rayflow.teardown: {path} does not exist (already torn down?)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
