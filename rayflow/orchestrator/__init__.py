"""The orchestrator: from a command line to jobs run and clusters stopped, read top-down.

- session: `run_jobs(plans)`, each cluster started once for the consecutive jobs that share it
- driver, remote_run: one job run in this process, or submitted to its cluster as a Ray Job
- report: a run's outcome into MLflow and onto the terminal
- cluster: a cluster's lifetime (`running`, `SharedCluster`, `cluster_scope`)
- preflight: every check of every job, once, before any starts: a `Plan` per job
- resume: an experiment's own config again, the command line's keys on top
- submission, job_logs, job_files: the one protocol of a Ray Job (runs and Hydra sweeps), its log,
  and the user's files that go with it; upload_check, upload_size: those files checked before
  anything starts, and their size as Ray would pack them
- compose: Hydra's composition, the points of a sweep, and each section's model
"""
