"""The real Kubernetes control plane and the KubeRay operator, built from their Go modules.

`binaries()` returns the folder holding etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl and kuberay-operator (and beside it, `kuberay/`: the operator's CRDs and
ClusterRole from the same release). It builds them into
`~/.cache/rayflow/kube/<versions>/bin` when that folder is missing them and reuses it when
present, so a change of VERSIONS builds afresh beside the old one. Each step prints one line with
its time. A failed build raises BuildFailed naming the module and ending with the compiler's last
lines.

How each is built, and why:
- **kubernetes** (`k8s.io/kubernetes`): its go.mod requires its 33 staging modules (k8s.io/api,
  client-go, ...) at v0.0.0 and replaces them with folders of its own repository, which a module
  download does not have. So a go.mod of ours requires kubernetes and replaces each staging module
  with its published v0.<minor>.<patch>. The list is read from kubernetes' own go.mod, so a new
  release brings its own. The version is stamped as `make` stamps it
  (k8s.io/component-base/version).
- **etcd** (`go.etcd.io/etcd/server/v3`): its binary's main package lives in etcd's root module,
  whose go.mod has replace directives that `go install` refuses. A main.go of ours calls the same
  `etcdmain.Main`.
- **KubeRay's operator** (`github.com/ray-project/kuberay/ray-operator`): its main package is the
  module's root, built as a dependency of a go.mod of ours. v1.6.1 is the newest release the Go
  module proxy serves whole (v1.7.0's go.mod is served, its source is refused), and it has
  `authOptions`.

Go's own caches (GOMODCACHE, GOCACHE) stay where Go keeps them, so a rebuild after a version
change reuses every unchanged package.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

KUBERNETES = "v1.36.3"
ETCD = "v3.6.16"
KUBERAY = "v1.6.1"
VERSIONS = {"kubernetes": KUBERNETES, "etcd": ETCD, "kuberay": KUBERAY}
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kuberay-operator",
)
GO_TIMEOUT_S = 3600  # a cold kubernetes build on 2 cores takes tens of minutes
TAIL_LINES = 20  # of a failed build's output, in BuildFailed


class BuildFailed(RuntimeError):
    """A component's build failed: its module is `module`."""

    def __init__(self, module: str, output: str) -> None:
        self.module = module
        tail = "\n".join(output.strip().splitlines()[-TAIL_LINES:])
        super().__init__(f"building {module} failed:\n{tail}")


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rayflow" / "kube"


def build_dir(versions: dict[str, str] = VERSIONS) -> Path:
    """This set of versions' folder: named by them, so another set builds beside it."""
    key = json.dumps(versions, sort_keys=True) + _go_version()
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_root() / f"k8s-{versions['kubernetes']}-kuberay-{versions['kuberay']}-{digest}"


def binaries(versions: dict[str, str] = VERSIONS, out=sys.stderr) -> Path:
    """The folder of BINARIES for `versions`, built first where any is missing."""
    bin_dir = build_dir(versions) / "bin"
    missing = [name for name in BINARIES if not (bin_dir / name).is_file()]
    manifests = bin_dir.parent / "kuberay" / "operator-role.yaml"
    if not manifests.is_file() and "kuberay-operator" not in missing:
        missing.append("kuberay-operator")  # its manifests, copied as it is built
    if not missing:
        return bin_dir
    if shutil.which("go") is None:
        raise BuildFailed("go", "no `go` on PATH: the control plane is built from Go modules")
    print(f"[kube-build] building {', '.join(missing)} into {bin_dir}", file=out, flush=True)
    steps = (
        (("etcd",), _etcd),
        (("kuberay-operator",), _kuberay),
        (("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"), _kubernetes),
    )
    for names, step in steps:
        if set(names) & set(missing):
            started = time.monotonic()
            module = step(bin_dir.parent, versions)
            print(
                f"[kube-build] {module}: {', '.join(names)} in {time.monotonic() - started:.0f} s",
                file=out,
                flush=True,
            )
    return bin_dir


def _go(args: list[str], cwd: Path, module: str) -> None:
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false", "GOTOOLCHAIN": "local"}
    done = subprocess.run(
        ["go", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=GO_TIMEOUT_S
    )
    if done.returncode != 0:
        raise BuildFailed(module, done.stdout + done.stderr)


def _module_dir(folder: Path, name: str, go_mod: str, files: dict[str, str] | None = None) -> Path:
    work = folder / "src" / name
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(go_mod)
    for file, text in (files or {}).items():
        (work / file).write_text(text)
    return work


def _go_version() -> str:
    found = shutil.which("go")
    if found is None:
        return "no-go"
    return subprocess.run(
        [found, "env", "GOVERSION"], capture_output=True, text=True
    ).stdout.strip()


ETCD_MAIN = """// etcd's own main: etcdmain.Main with the process's arguments.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


def _etcd(folder: Path, versions: dict[str, str]) -> str:
    module = "go.etcd.io/etcd/server/v3"
    go_mod = f"module rayflow.local/etcd\n\ngo 1.26\n\nrequire {module} {versions['etcd']}\n"
    work = _module_dir(folder, "etcd", go_mod, {"main.go": ETCD_MAIN})
    _go(["mod", "tidy"], work, module)
    _go(
        ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(folder / "bin" / "etcd"), "."],
        work,
        module,
    )
    return f"{module}@{versions['etcd']}"


def _kuberay(folder: Path, versions: dict[str, str]) -> str:
    module = "github.com/ray-project/kuberay/ray-operator"
    work = _module_dir(folder, "kuberay", "module rayflow.local/kuberay\n\ngo 1.26\n")
    _go(["get", f"{module}@{versions['kuberay']}"], work, module)
    out = str(folder / "bin" / "kuberay-operator")
    _go(["build", "-trimpath", "-ldflags", "-s -w", "-o", out, module], work, module)
    # its CRDs and its ClusterRole, as this release ships them, beside the binary
    source = Path(_module_info(work, module)["Dir"]) / "config"
    manifests = folder / "kuberay"
    manifests.mkdir(exist_ok=True)
    for crd in sorted((source / "crd" / "bases").glob("*.yaml")):
        shutil.copyfile(crd, manifests / crd.name)
    shutil.copyfile(source / "rbac" / "role.yaml", manifests / "operator-role.yaml")
    return f"{module}@{versions['kuberay']}"


def _module_info(work: Path, module: str) -> dict:
    done = subprocess.run(
        ["go", "list", "-m", "-json", module], cwd=work, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise BuildFailed(module, done.stdout + done.stderr)
    return json.loads(done.stdout)


# kubernetes' go.mod: `k8s.io/api => ./staging/src/k8s.io/api`
_STAGING = re.compile(r"^\s*(k8s\.io/[\w.-]+) => \./staging/src/", re.MULTILINE)
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


def kubernetes_go_mod(upstream: str, version: str) -> str:
    """Our go.mod for kubernetes `version`, from kubernetes' own (`upstream`): each staging module
    it replaces with a folder of its repository, replaced with its published v0.<minor>.<patch>."""
    staging_version = "v0." + version.removeprefix("v1.")
    replaces = [
        f"\t{m} => {m} {staging_version}"
        for m in _STAGING.findall(upstream)
        if not m.startswith("k8s.io/sample-")  # examples nothing here imports, not all published
    ]
    return (
        f"module rayflow.local/kube\n\ngo 1.26\n\nrequire k8s.io/kubernetes {version}\n\n"
        "replace (\n" + "\n".join(replaces) + "\n)\n"
    )


def _kubernetes(folder: Path, versions: dict[str, str]) -> str:
    module, version = "k8s.io/kubernetes", versions["kubernetes"]
    work = _module_dir(folder, "kubernetes", "module rayflow.local/kube\n\ngo 1.26\n")
    go_mod = kubernetes_go_mod(_downloaded_go_mod(work, module, version), version)
    tools = (
        "//go:build tools\n\npackage tools\n\nimport (\n"
        + "".join(f'\t_ "{module}/cmd/{c}"\n' for c in KUBE_COMMANDS)
        + ")\n"
    )
    work = _module_dir(folder, "kubernetes", go_mod, {"tools.go": tools})
    _go(["mod", "tidy"], work, module)
    minor = version.removeprefix("v").split(".")[1]
    stamp = "k8s.io/component-base/version"
    ldflags = (
        f"-s -w -X {stamp}.gitVersion={version} -X {stamp}.gitMajor=1 -X {stamp}.gitMinor={minor}"
        f" -X {stamp}.gitTreeState=clean"
    )
    packages = [f"{module}/cmd/{c}" for c in KUBE_COMMANDS]
    out = str(folder / "bin") + "/"
    _go(["build", "-trimpath", "-ldflags", ldflags, "-o", out, *packages], work, module)
    return f"{module}@{version}"


def _downloaded_go_mod(work: Path, module: str, version: str) -> str:
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=GO_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise BuildFailed(module, done.stdout + done.stderr)
    return Path(json.loads(done.stdout)["GoMod"]).read_text()


if __name__ == "__main__":
    try:
        print(binaries())
    except BuildFailed as err:
        print(f"kube-build: {err}", file=sys.stderr)
        sys.exit(1)
