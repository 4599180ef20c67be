"""`hydra/sweeper=rayflow`: any Hydra application's parameter search as one asynchronous Ray Tune
run on a cluster a rayflow backend starts, sizes and stops (the plugin class:
hydra_plugins/rayflow_sweeper).

- node: its config node, built when Hydra discovers the plugin
- keys: the sweeper's own keys, checked as every rayflow key
- params: `hydra.sweeper.params` and the command line, in the Optuna sweeper's syntax or Tune's
- settings: from the node to checked settings and the rayflow config of the search
- sweep: one `sweep()`: check everything, run the search as rayflow's own run, write the outputs
- outputs: the sweep dir's job folders, optimization_results.yaml and trials.csv

The trials themselves, Hydra jobs in a Tune run, are rayflow.workloads.hydra_sweep. Only the node
(node.sweeper_node) is built while Hydra discovers plugins; the rest loads inside sweep().
"""
