"""docs/architecture.md, "Adding a backend", walked for a backend outside rayflow's package: the
minimal backend of tests/harness/minimal_backend, declared by a distribution's entry point (group
`rayflow.backends`) as a plugin's package declares it, is found by its name, composes with its keys,
refuses a bad key in one line naming it, and passes the shipped contract suites, joining the running
cluster of `head_node` (it starts none of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rayflow.backends import REGISTRY, backend_for, backend_keys, backends
from rayflow.errors import ConfigError
from rayflow.orchestrator.compose import compose_config, config_errors, validate
from rayflow.testing.backends import DriverConnectionSuite, LifecycleSuite
from tests.harness import REPO
from tests.harness.minimal_backend.keys import Minimal

ENGINE = "tests.harness.minimal_backend.cluster"


def _install(site: Path, dist: str, entry_points: str) -> None:
    """What `pip install` leaves of a distribution that declares backends: its metadata folder,
    where importlib.metadata finds its entry points (the package itself is importable from REPO)."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[rayflow.backends]\n{entry_points}\n")


def _on_path(mp: pytest.MonkeyPatch, site: Path) -> None:
    """`site` on this process's sys.path and on its subprocesses' PYTHONPATH, with the repository
    (the plugin's package, tests.harness.minimal_backend) wherever they run."""
    mp.syspath_prepend(str(site))  # and importlib's caches invalidated
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    mp.setenv("PYTHONPATH", os.pathsep.join([str(site), str(REPO), *inherited]))


@pytest.fixture(scope="module", autouse=True)
def installed(tmp_path_factory):
    site = tmp_path_factory.mktemp("site-packages")
    _install(site, "rayflow-minimal-backend", "minimal = tests.harness.minimal_backend:ENTRY")
    with pytest.MonkeyPatch.context() as mp:
        _on_path(mp, site)
        yield site


def _rayflow(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rayflow", *args],
        cwd=tmp_path,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_is_found_by_its_name_without_its_engine(monkeypatch):
    """Step 1: its entry point names it; rayflow reads its keys' model without importing the
    module of its class, which only a run imports."""
    monkeypatch.delitem(sys.modules, ENGINE, raising=False)
    assert "minimal" in backends() and "minimal" not in REGISTRY
    assert backends()[: len(REGISTRY)] == list(REGISTRY)  # rayflow's own first
    assert backend_keys("minimal") is Minimal
    cfg = compose_config("backend=minimal", "backend.address=127.0.0.1:6379")
    validate(cfg)
    assert ENGINE not in sys.modules
    backend = backend_for(cfg)  # a run's first use of its class
    assert type(backend).__module__ == ENGINE and type(backend).__name__ == "MinimalCluster"


def test_its_keys_compose_at_their_declared_defaults(tmp_path):
    """Step 2: its option is its keys' model, at the defaults declared there: `--cfg job` shows
    them, the address set beside it."""
    done = _rayflow(tmp_path, "backend=minimal", "backend.address=127.0.0.1:6379", "--cfg", "job")
    assert done.returncode == 0, done.stderr[-3000:]
    assert yaml.safe_load(done.stdout)["backend"] == {
        "name": "minimal",
        "address": "127.0.0.1:6379",
    }
    assert compose_config("backend=minimal").backend.address is None


def test_a_bad_key_is_refused_in_one_line_naming_it(tmp_path):
    done = _rayflow(tmp_path, "backend=minimal", "backend.adress=127.0.0.1:6379")
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert done.stderr.strip().splitlines() == [
        "rayflow: error: backend.adress: unknown key; did you mean backend.address?"
    ], done.stderr[-3000:]
    # its model checks the composed section (null: the default, where it must be given)
    with pytest.raises(ConfigError, match=r"^backend\.address: must be a non-empty string"):
        validate(compose_config("backend=minimal"))


def test_an_unknown_name_lists_the_plugins_too():
    with pytest.raises(
        ConfigError, match=r"^backend=nosuch: unknown option; choose from .*minimal"
    ):
        config_errors(lambda: compose_config("backend=nosuch"))


def test_a_broken_plugin_is_one_line_naming_it(tmp_path, monkeypatch):
    """A plugin whose entry point names nothing there is refused naming it, where it is chosen;
    the other plugins go on working."""
    _install(tmp_path, "rayflow-broken-backend", "broken = tests.harness.minimal_backend:NO_SUCH")
    _on_path(monkeypatch, tmp_path)
    assert {"broken", "minimal"} <= set(backends())
    with pytest.raises(ConfigError) as refused:
        compose_config("backend=broken")
    message = str(refused.value)
    assert message.startswith("backend: backend plugin 'broken'") and "\n" not in message, message
    assert "rayflow-broken-backend" in message and "NO_SUCH" in message, message
    assert compose_config("backend=minimal").backend.name == "minimal"


@pytest.mark.usefixtures("head_node")
class TestMinimal(LifecycleSuite, DriverConnectionSuite):
    """Step 5: the shipped suites, as rayflow's own backends pass them."""

    name = "minimal"
    owns_cluster = False
    teardown_faults = [("ray.shutdown()",)]

    @pytest.fixture(autouse=True)
    def _address(self, head_node):
        self.address = head_node

    def overrides(self):
        return ["backend=minimal", f"backend.address={self.address}", "ray_auth_mode=token"]
