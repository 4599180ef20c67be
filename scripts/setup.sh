#!/usr/bin/env bash
# Creates .venv (Python 3.10+) with rayflow and its test tools, choosing the torch build first:
# pip resolves an open torch range to the newest release plus several GB of CUDA packages, so
# torch==$TORCH_VERSION is installed on its own before rayflow (whose torch>=2.1 it satisfies).
#   TORCH_VERSION    default 2.13.0
#   TORCH_INDEX_URL  an index holding the build you want (e.g. PyTorch's CPU-only index for a
#                    CPU machine without a local CPU wheel); default: pip's own configuration,
#                    which gives the CUDA build on Linux and a local CPU wheel where one is set up.
#   PYTHON           the interpreter for the venv, default python3
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

torch_version=${TORCH_VERSION:-2.13.0}
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  "${pip[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$torch_version"
fi
"${pip[@]}" -e ".[test]"
# Hydra finds plugins by listing the folders of the hydra_plugins namespace package, which an
# editable install's import hook does not have: hydra/launcher=rayflow is listed from a folder that
# holds only hydra_plugins/ (a link to this checkout's), put on the venv's path. (A wheel installs
# it into site-packages and needs none of this.)
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
mkdir -p .venv/rayflow-hydra-plugins && ln -sfn "$PWD/hydra_plugins" .venv/rayflow-hydra-plugins/hydra_plugins
echo "$PWD/.venv/rayflow-hydra-plugins" > "$site/rayflow-hydra-plugins.pth"

# backend=spark (and its tests) run Spark's JVMs: Java 17.
if ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "rayflow setup: no java; backend=spark needs Java 17 (apt-get install openjdk-17-jre-headless)" >&2
  fi
fi
# backend=vm provider=local tests (tests/ssh_hosts.py) make SSH hosts from network namespaces on
# this machine: sshd (openssh-server), rsync (Ray's launcher syncs files with it), tini (each host's PID 1).
ssh_host_pkgs=()
[ -x /usr/sbin/sshd ] || ssh_host_pkgs+=(openssh-server)
command -v rsync >/dev/null 2>&1 || ssh_host_pkgs+=(rsync)
command -v tini >/dev/null 2>&1 || ssh_host_pkgs+=(tini)
if [ ${#ssh_host_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 "${ssh_host_pkgs[@]}" >/dev/null
  else
    echo "rayflow setup: no ${ssh_host_pkgs[*]}; the backend=vm SSH-host tests need them (apt-get install ${ssh_host_pkgs[*]}) and skip without them" >&2
  fi
fi
.venv/bin/python -c "import torch, ray, mlflow, pyspark; print('rayflow setup: torch', torch.__version__, '| cuda', torch.cuda.is_available(), '| ray', ray.__version__, '| mlflow', mlflow.__version__, '| pyspark', pyspark.__version__)"
