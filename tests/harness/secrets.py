"""Planting secrets in a run's config and finding them nowhere it wrote (tests/test_secrets.py,
tests/test_spark.py)."""

from __future__ import annotations

from pathlib import Path

SPARK_SECRETS = {
    "+backend.spark_conf.spark.ssl.keyPassword=PLANTED-key-password": ["PLANTED-key-password"],
    "+backend.spark_conf.spark.ssl.trustStorePassword=PLANTED-trust-password": [
        "PLANTED-trust-password"
    ],
    "+backend.spark_conf.fs.azure.account.key.acct.blob.core.windows.net=PLANTED-azure-key": [
        "PLANTED-azure-key"
    ],
    "+backend.spark_conf.fs.s3a.secret.key=PLANTED-s3-secret": ["PLANTED-s3-secret"],
}


def planted(table: dict) -> tuple[list[str], list[str]]:
    return list(table), [value for values in table.values() for value in values]


def files_under(*folders: Path):
    for folder in folders:
        if folder.exists():
            yield from (p for p in folder.rglob("*") if p.is_file())


def assert_nowhere(secrets: list[str], texts: list[str], folders: list[Path]) -> int:
    """Every secret absent from each text and every file under the folders; returns files read."""
    read = 0
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"{secret} printed"
    for path in files_under(*folders):
        data = path.read_bytes()
        read += 1
        for secret in secrets:
            assert secret.encode() not in data, f"{secret} in {path}"
    return read


# Secrets that no key name gives away: beside a secret name, after a secret flag, inside a
# setup command (rayflow/security/redaction.py masks them by their structure).
STRUCTURAL_VM_SECRETS = {
    "+backend.overrides.setup_commands=['export WANDB_API_KEY=PLANTED-export', 'run --db-password PLANTED-flag']": [
        "PLANTED-export",
        "PLANTED-flag",
    ],
    "+backend.overrides.provider.env=[{name:AWS_SECRET_ACCESS_KEY,value:PLANTED-env-pair}]": [
        "PLANTED-env-pair"
    ],
    "+backend.overrides.head_start_ray_commands=['ray start --head', 'curl -H \"Authorization: Bearer PLANTED-bearer-token\" h']": [
        "PLANTED-bearer-token"
    ],
}
