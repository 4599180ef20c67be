#!/usr/bin/env bash
# A local Kubernetes for backend=kuberay on one Linux machine (root): the real control plane and
# KubeRay operator built from their Go modules (cached in ~/.cache/rayflow/kube), the process
# kubelet with two Nodes, an S3-compatible server and an MLflow server (docs/guides/kube-local.md).
#
#   eval "$(sudo scripts/kube-local.sh up)"   # stdout: export lines only (KUBECONFIG, AWS_*, ...)
#   sudo scripts/kube-local.sh down           # stops everything, leaves no process or namespace
#
# PYTHON: the interpreter with rayflow's test extras (default: the checkout's .venv).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
exec "${PYTHON:-$root/.venv/bin/python}" -m scripts.kube_local.cli "$@"
