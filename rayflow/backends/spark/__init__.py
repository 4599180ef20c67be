"""backend=spark: Ray on Spark. `cluster` (SparkCluster: the session, `setup_ray_cluster`, the
driver's connection), `plan` (what Spark would give Ray: the sizing plan of a dry run) and `hook`
(the start hook that carries rayflow's token and credentials to every Ray node Spark starts)."""
