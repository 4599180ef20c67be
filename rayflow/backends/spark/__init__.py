"""backend=spark: Ray on Spark. `cluster` (SparkCluster: the session, `setup_ray_cluster`, the
driver's connection), `keys` (its keys and the rules between them), `plan` (what Spark would give
Ray: the sizing plan of a dry run), `hook` (the start hook that carries rayflow's token and
credentials to every Ray node Spark starts), `kept` (the cluster a notebook kernel keeps: joined
by its next run, under an idle timer) and `processes` (what a run starts here, ended whole: the
head's process tree, the py4j gateway JVM)."""
