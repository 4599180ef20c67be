"""What this process does around a run while it lasts: the terminating signals turned into
exceptions (signals), the environment a job sets and puts back (environment), stopping exactly one
cluster's processes (processes), the lines long waits print (progress), demand against capacity
and the watch on placement (placement), the cluster's peak (node_usage), and what a node needs
installed (requirements)."""
