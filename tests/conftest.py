"""Shared fixtures: config composition, the rayflow command line, Ray process checks, MLflow reads;
their machinery is in tests/harness/.

Integration tests drive `python -m rayflow` in a subprocess, as a user would, with their
own storage folder and MLflow store under tmp_path; the synthetic data set is written
once per session and shared.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from rayflow.orchestrator.compose import compose_config
from rayflow.testing.processes import mark_session, ray_daemon_pids, wait_until
from tests.harness.archive import archive_server as serve_archive
from tests.harness.cli import Rayflow
from tests.harness.kube_local import local_kube  # noqa: F401  (the real Kubernetes, per worker)
from tests.harness.needs import (  # noqa: F401  (in CI, a skip is a failure)
    pytest_make_collect_report,
    pytest_runtest_makereport,
)
from tests.harness.ray_head import ray_head


def pytest_configure(config):
    # Every process a test starts inherits this session's mark: the checks for what is left see
    # this session's Ray and Spark processes only (rayflow.testing.processes), so another suite
    # running on the machine, or the other pytest-xdist worker, is neither blamed nor killed.
    mark_session()
    _spark_defaults_for_short_jvms(config)
    _ctrl_c_as_in_a_terminal()


def _ctrl_c_as_in_a_terminal() -> None:
    """A suite started in the background (`cmd &`, nohup, some CI runners) inherits SIGINT ignored,
    and so would every process a test starts: a Ctrl-C test would then see rayflow ignore the
    signal as Python does by design. The tests' processes get SIGINT as a terminal gives it."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# As a machine's spark-defaults.conf would: the tests' Spark JVMs live a minute or two, so the
# JIT's first tier and the serial collector (one thread on these two cores) serve them best. A
# local-cluster start took half the JVM CPU (22 s -> 11 s); Spark's behaviour is the same.
SPARK_DEFAULTS = """\
spark.driver.extraJavaOptions -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
spark.executor.extraJavaOptions -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
"""


def _spark_defaults_for_short_jvms(config) -> None:
    # the machine's own, or the one the pytest-xdist workers inherit from the controller
    if "SPARK_CONF_DIR" in os.environ:
        return
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="rayflow-tests-spark-conf-"))
    (folder / "spark-defaults.conf").write_text(SPARK_DEFAULTS)
    os.environ["SPARK_CONF_DIR"] = str(folder)
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


# Modules that take turns, machine-wide (a lock held for the whole module): the SSH hosts' bridge,
# subnet and namespaces are machine-wide; and while test_spark runs beside it, the fake_multinode
# head's dashboard of test_vm's shared cluster was seen to receive a SIGTERM mid-job (the sender is
# not found yet, docs/testing.md). test_vm passes alone.
TAKE_TURNS = {
    "test_ssh_hosts": "ssh-hosts",
    "test_vm_ssh": "ssh-hosts",
    "test_spark": "spark-vm",
    "test_vm": "spark-vm",
}


# Modules one worker runs one after the other, as one unit of pytest-xdist's `--dist loadfile`:
# they take turns anyway (TAKE_TURNS), and on another worker the second of them would sit
# waiting for the lock, idle, while the first runs.
SAME_WORKER = {
    "test_spark": "test_spark+test_vm",
    "test_vm": "test_spark+test_vm",
    "test_ssh_hosts": "test_ssh_hosts+test_vm_ssh",
    "test_vm_ssh": "test_ssh_hosts+test_vm_ssh",
    # one worker's Kubernetes stack (tests/harness/kube_local.py) for both
    "test_kuberay_local": "test_kuberay_local+user",
    "test_kuberay_local_user": "test_kuberay_local+user",
    "test_security_kuberay_local": "test_kuberay_local+user",
}


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadFileScheduling

    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own choice

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return SAME_WORKER.get(Path(scope).stem, scope)

    return Scheduling(config, log)


# The longest modules first (seconds on 2 cores, from `pytest --durations=0`), so that neither
# worker is left with a long one at the end while the other idles; the rest keep their order.
# pytest-xdist would order the modules by their number of tests instead (`--no-loadscope-reorder`
# in pyproject's addopts keeps this order): the 133 bad-input rows first, test_api's 3 tests last.
LONGEST_FIRST = [
    "test_spark",  # with test_vm (one unit, SAME_WORKER): about 1240 s at 44's fresh-clone run
    "test_vm",
    "test_kuberay_local",  # with test_kuberay_local_user (SAME_WORKER): about 900 s
    "test_kuberay_local_user",
    "test_security_kuberay_local",
    "test_ddp",  # 490
    "test_ppo",  # 305
    "test_user_workloads",  # 270
    "test_ssh_hosts",  # with test_vm_ssh: about 260 s
    "test_vm_ssh",
    "test_resume",  # 235
    "test_tune_run",  # 235
    "test_api",  # 215
    "test_sweeper",  # 200: hydra/sweeper=rayflow, 4 searches
    "test_ray_examples",  # 150
    "test_vm_aws",  # mostly Ray's launcher against the EC2 API
    "test_notebook",  # 120
    "test_bench",  # 90
    "test_launcher",
    "test_bad_input",
    "test_backends",
    "test_quiet",
]


def pytest_collection_modifyitems(config, items):
    """`--dist loadfile` (pyproject's addopts) keeps a test module's tests on one worker, so a
    module's shared cluster (test_spark's, test_vm's, test_kuberay's head) starts once. (The
    xdist_group marks of `--dist loadgroup` never reached the node ids in pytest-xdist 3.8 here:
    modules were split over both workers, and each started its shared cluster twice at once.)"""
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: in-module order kept


@pytest.fixture(scope="module", autouse=True)
def _take_turns(request):
    group = TAKE_TURNS.get(request.module.__name__.rsplit(".", 1)[-1])
    if group is None:
        yield
        return
    import tempfile

    from filelock import FileLock

    with FileLock(os.path.join(tempfile.gettempdir(), f"rayflow-tests-{group}.lock"), timeout=3600):
        yield


@pytest.fixture(scope="session")
def default_config():
    """The default config, composed once for the session: copy before changing it."""
    return compose_config()


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cifar-data")


@pytest.fixture
def archive_server(tmp_path):
    """A loopback HTTP server holding a CIFAR-format archive (tests.harness.archive): yields
    (url, md5, the paths requested)."""
    with serve_archive(tmp_path) as served:
        yield served


@pytest.fixture(scope="session")
def empty_mlflow_store(tmp_path_factory) -> Path:
    """An MLflow store as MLflow makes it on first use (its tables created and migrated), made
    once per worker: a test's work folder starts with a copy, which spares its first run MLflow's
    migrations (about 1 s of CPU each; the module-scoped runners still start without a store)."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("empty-mlflow-store") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def rayflow(request, tmp_path, data_root) -> Rayflow:
    before = ray_daemon_pids()
    runner = Rayflow(tmp_path, data_root, request.node.get_closest_marker("no_dashboard") is None)
    if request.node.get_closest_marker("no_store") is None:
        shutil.copyfile(request.getfixturevalue("empty_mlflow_store"), runner.db)
    yield runner
    # Whatever a test did, rayflow must not leave a Ray cluster behind.
    leftover = wait_until(lambda: not (ray_daemon_pids() - before), timeout=20) or (
        ray_daemon_pids() - before
    )
    if leftover is not True:
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"Ray daemons left running after the test: {sorted(leftover)}")


@pytest.fixture(scope="class")
def head_node():
    """A 1-CPU `ray start --head` cluster for the test class (ray_head)."""
    with ray_head() as address:
        yield address
