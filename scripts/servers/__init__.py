"""Servers the tests and scripts/kube-local.sh run beside rayflow: an S3-compatible store (moto)
and an `mlflow server`."""
