"""`hydra/launcher=rayflow`: any Hydra application's multirun jobs as Ray tasks on a cluster that a
rayflow backend starts, sizes and stops (the plugin class: hydra_plugins/rayflow_launcher).

- node: the launcher's config node (its own keys and every backend's, for Hydra's ConfigStore)
- settings: from that node to checked settings and the rayflow config of the backend
- jobs: one Hydra job on a Ray worker, and the loop that runs a batch of them at once
- outputs: a job's output folder packed on the node, unpacked under the local sweep dir
- launch: one `launch()` call: check everything, hold the cluster, run, return JobReturns
- on_head: the same loop as a Ray Job on the head, for backends that submit (vm, kuberay)

Only `node` is imported while Hydra discovers plugins; the rest loads inside launch().
"""

from __future__ import annotations


def keep_clusters():
    """`with rayflow.launcher.keep_clusters(): ...` keeps each cluster a launch starts running for
    the later launches (sweeps) in the block that use the same backend config, and stops them all
    when the block ends. Without it each launch stops its cluster before it returns."""
    from rayflow.launcher.launch import keep_clusters as keep

    return keep()
