"""No secret in clear: values planted in secret-named keys and in URL credentials must not
appear in anything a run writes — stdout, stderr, the MLflow store and its artifacts, and
Ray's session logs. (Ray on Spark's collected logs are checked in test_spark.py.)"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rayflow.testing.processes import ray_daemon_pids
from tests.harness.secrets import SPARK_SECRETS, assert_nowhere, planted

LOCAL_SECRETS = {
    "data.url='https://alice:PLANTED-url-password@mirror.invalid/c.tgz?token=PLANTED-url-token'": [
        "PLANTED-url-password",
        "PLANTED-url-token",
    ],
    "+backend.api_token=PLANTED-backend-token": ["PLANTED-backend-token"],
    # no key name gives it away: a secret inside a command (rayflow/security/redaction.py, by structure)
    "+backend.setup_line='export WANDB_API_KEY=PLANTED-export'": ["PLANTED-export"],
}


def ray_sessions_since(start: float) -> list[Path]:
    root = Path(tempfile.gettempdir()) / "ray"
    return (
        [p for p in root.glob("session_2*") if p.stat().st_mtime >= start - 1]
        if root.exists()
        else []
    )


def test_a_local_run_prints_and_stores_no_planted_secret(rayflow):
    overrides, secrets = planted(LOCAL_SECRETS)
    start = time.time()
    out = rayflow.run(*overrides, "workload.num_samples=1", "workload.max_epochs=1")
    assert out.returncode == 0, out.stderr[-3000:]
    sessions = ray_sessions_since(start)
    assert sessions, "the run's Ray session logs were not found"
    client, parents, _ = rayflow.mlflow("cifar")
    assert parents[0].data.params["backend.api_token"] == "***"
    assert "alice:***@mirror.invalid" in parents[0].data.params["data.url"]
    assert parents[0].data.params["backend.setup_line"] == "export WANDB_API_KEY=***"
    read = assert_nowhere(secrets, [out.stdout, out.stderr], [rayflow.workdir, *sessions])
    assert read > 10  # the store, its artifacts (config.yaml, spec, checkpoint) and Ray's logs


def test_dry_runs_print_no_planted_secret(rayflow):
    before = ray_daemon_pids()
    overrides, secrets = planted(LOCAL_SECRETS)
    out = rayflow.run(*overrides, "dry_run=true")
    assert out.returncode == 0, out.stderr
    spark_overrides, spark_secrets = planted(SPARK_SECRETS)
    spark = rayflow.run(
        *spark_overrides,
        "backend=spark",
        "dry_run=true",
        "+backend.head_node_options.redis_password=PLANTED-option",
    )
    assert spark.returncode == 0, spark.stderr
    assert "spark.ssl.keyPassword=***" in spark.stderr  # the SparkSession's settings: a note
    kuberay = rayflow.run(
        "backend=kuberay",
        "tracking=none",
        "dry_run=true",
        "+backend.overrides.metadata.annotations.api_token=PLANTED-annotation",
    )
    assert kuberay.returncode == 0, kuberay.stderr
    assert "api_token: '***'" in kuberay.stdout
    assert_nowhere(
        secrets + spark_secrets + ["PLANTED-option", "PLANTED-annotation"],
        [out.stdout, out.stderr, spark.stdout, spark.stderr, kuberay.stdout, kuberay.stderr],
        [],
    )
    assert ray_daemon_pids() == before
