#!/usr/bin/env bash
# Creates .venv (Python 3.10+) with rayflow, choosing the torch build first: pip resolves an open
# torch range to the newest release plus several GB of CUDA packages, so torch==$TORCH_VERSION is
# installed on its own before rayflow (whose torch>=2.6 it satisfies).
#   bash scripts/setup.sh          what running jobs needs: rayflow with the extras the README's
#                                  tour uses (spark, rllib, kuberay) and Java 17 for backend=spark
#   bash scripts/setup.sh --test   that, plus the test tools (the `test` extra), the system
#                                  packages only the backend=vm SSH-host tests use (sshd, rsync, tini),
#                                  and, where Go is, the real Kubernetes control plane the kuberay
#                                  tests are moving onto (cached in ~/.cache/rayflow/kube)
#   TORCH_VERSION    default 2.13.0
#   TORCH_INDEX_URL  an index holding the build you want (e.g. PyTorch's CPU-only index for a
#                    CPU machine without a local CPU wheel); default: pip's own configuration,
#                    which gives the CUDA build on Linux and a local CPU wheel where one is set up.
#   PYTHON           the interpreter for the venv, default python3
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  "") tests=false ;;
  --test) tests=true ;;
  *) echo "usage: bash scripts/setup.sh [--test]" >&2; exit 2 ;;
esac

# pip warns once per package and index about a configured location it cannot read ("WARNING:
# Location '...' is ignored"), hundreds of lines that bury everything else; those lines are left
# out, every other line (errors, resolver conflicts) is kept, and pip's exit status is setup's
# (pipefail; grep finding nothing to print is not a failure).
pip_install() {
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
    | { grep -v -E "^WARNING: Location '[^']*' is ignored" || true; } >&2
}

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv

torch_version=${TORCH_VERSION:-2.13.0}
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  pip_install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$torch_version"
fi
if $tests; then extras=test; else extras=spark,rllib,kuberay; fi
pip_install -e ".[$extras]"
# The editable install maps rayflow's modules (conf/ and backends/ ship as rayflow.conf and
# rayflow.cluster_defs) with an import hook that Python asks only after its own path search. Run
# from the folder that holds the clone (`cd ~ && python -m rayflow` with the clone in ~/rayflow),
# that search finds the clone's folder as a namespace package `rayflow`, whose backends/ (the
# cluster files) shadows rayflow.backends. With the checkout itself on the path, as compat mode
# puts it, the search finds the real package (a regular package wins over namespace folders) and
# the hook still maps rayflow.conf; and Hydra, which lists the folders of the hydra_plugins
# namespace package, finds hydra/launcher=rayflow there. (A wheel needs none of this.)
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf .venv/rayflow-hydra-plugins "$site/rayflow-hydra-plugins.pth"  # what earlier versions made
echo "$PWD" > "$site/rayflow-checkout.pth"

apt_install() {  # apt_install WHAT-NEEDS-THEM PACKAGE...: as root with apt-get, else one line saying what to install
  local why=$1; shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 "$@" >/dev/null
  else
    echo "rayflow setup: $why needs $* (apt-get install $*)" >&2
  fi
}
# backend=spark (and its tests) run Spark's JVMs: Java 17.
command -v java >/dev/null 2>&1 || apt_install "backend=spark" openjdk-17-jre-headless
# Only the tests: backend=vm provider=local tests (tests/ssh_hosts.py) make SSH hosts from network
# namespaces on this machine: sshd (openssh-server), rsync (Ray's launcher syncs files with it),
# tini (each host's PID 1).
if $tests; then
  ssh_host_pkgs=()
  [ -x /usr/sbin/sshd ] || ssh_host_pkgs+=(openssh-server)
  command -v rsync >/dev/null 2>&1 || ssh_host_pkgs+=(rsync)
  command -v tini >/dev/null 2>&1 || ssh_host_pkgs+=(tini)
  [ ${#ssh_host_pkgs[@]} -eq 0 ] || apt_install "the backend=vm SSH-host tests (they skip without them)" "${ssh_host_pkgs[@]}"
fi
# Only the tests: the real Kubernetes control plane and KubeRay's operator, built from their Go
# modules into ~/.cache/rayflow/kube (scripts/kube_local/build.py; minutes the first time, then
# reused); without Go the tests that need it skip (CI fails them).
if $tests; then
  if command -v go >/dev/null 2>&1; then
    # a failed build fails only the tests that need it (they say so), not the rest
    .venv/bin/python -m scripts.kube_local.build >/dev/null \
      || echo "rayflow setup: the control plane did not build (above): its tests will skip (CI: fail)" >&2
  else
    echo "rayflow setup: no Go on PATH: the tests on a real Kubernetes control plane will skip" >&2
  fi
fi
.venv/bin/python -c "import torch, ray, mlflow, pyspark; print('rayflow setup: torch', torch.__version__, '| cuda', torch.cuda.is_available(), '| ray', ray.__version__, '| mlflow', mlflow.__version__, '| pyspark', pyspark.__version__)"
# How to run what was installed: `rayflow` is on PATH only inside the virtual environment.
cat <<'DONE'
rayflow setup: done. Run it with `.venv/bin/python -m rayflow ...` (or `.venv/bin/rayflow ...`),
or activate the environment first, `source .venv/bin/activate`, then `rayflow --help`, `rayflow status`.
DONE
