"""rayflow's backend contract as importable test suites (like fsspec's abstract tests).

A backend's test module subclasses the suites for what the backend can do:
`LifecycleSuite` (every backend), `DriverConnectionSuite` (backends that connect this
process: local, attach, spark) and `JobSubmissionSuite` (backends that submit the run: vm,
kuberay). Combined with `LifecycleSuite`, a kind's check of a started cluster (`check_started`)
runs on the exception test's start, so each backend starts one cluster fewer. Needs pytest
(rayflow's `test` extra).
"""

from rayflow.testing.processes import process_pids, ray_daemon_pids, wait_until

__all__ = ["process_pids", "ray_daemon_pids", "wait_until"]
