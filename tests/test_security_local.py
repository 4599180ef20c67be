"""Nothing trusted from shared places (issue 30): this machine's /tmp, another user's processes,
Ray's token file, a data folder others can write. A second OS user (`nobody`) plants what a
careful attacker on a shared login host would; none of these tests starts a cluster.

The tests that act as `nobody` need root (to be another user, and to own files as one) and are
skipped otherwise.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rayflow.backends import backend_for
from rayflow.errors import ClusterError, ConfigError, DataError
from rayflow.orchestrator.compose import compose_config

NOBODY = 65534
as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as a second user (nobody) needs root"
)


@pytest.fixture
def shared_tmp(tmp_path, monkeypatch):
    """A /tmp of its own: world-writable and sticky, as /tmp is; TMPDIR points at it."""
    tmp = tmp_path / "shared-tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    tmp_path.chmod(0o755)  # nobody must reach it
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    return tmp


def _plant(path: Path, text: str = "", mode: int = 0o600, uid: int = NOBODY) -> Path:
    path.write_text(text)
    path.chmod(mode)
    os.chown(path, uid, uid)
    return path


# --- 1. the dashboard-port lock: per user, never a fixed name in a shared /tmp -------------------


def test_a_lock_file_another_user_planted_in_tmp_is_not_used(shared_tmp, tmp_path, monkeypatch):
    """The old fixed /tmp/rayflow-dashboard-port.lock, planted by another user, is neither
    opened nor needed: the lock lives in this user's own 0700 folder."""
    from omegaconf import OmegaConf

    from rayflow.backends.handle import ClusterHandle
    from rayflow.backends.local import LocalCluster

    planted = shared_tmp / "rayflow-dashboard-port.lock"
    planted.write_text("")
    planted.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(planted, NOBODY, NOBODY)
    before = planted.stat()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)  # ~/.cache: the HOME's
    backend = LocalCluster(OmegaConf.create({"name": "local"}))
    kwargs = {"include_dashboard": True, "dashboard_host": "127.0.0.1"}
    handle = ClusterHandle("local")
    try:
        with backend._own_dashboard(kwargs, handle):
            assert kwargs["dashboard_port"] >= 8265
    finally:
        backend.stop(handle)
    assert (tmp_path / "home" / ".cache" / "rayflow" / "locks" / "dashboard-port.lock").exists()
    assert (
        planted.stat().st_mtime_ns == before.st_mtime_ns and planted.stat().st_uid == before.st_uid
    )


def test_the_lock_folder_is_private_to_this_user(shared_tmp, tmp_path, monkeypatch):
    from rayflow.backends.local import lock_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)  # ~/.cache: the HOME's
    (tmp_path / "home" / ".cache" / "rayflow").mkdir(parents=True, mode=0o755)
    folder = lock_dir()
    assert folder == tmp_path / "home" / ".cache" / "rayflow" / "locks"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()


@as_root
def test_a_lock_folder_another_user_planted_is_refused_in_one_line(
    shared_tmp, tmp_path, monkeypatch
):
    """With no home to write, the temp dir's rayflow-UID is used, and only if it is this user's:
    a symlink `nobody` planted there is refused, not followed."""
    from rayflow.backends.local import lock_dir

    monkeypatch.setenv("HOME", str(_plant(tmp_path / "not-a-folder", mode=0o644, uid=0)))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)  # ~/.cache: the HOME's
    planted = shared_tmp / f"rayflow-{os.getuid()}"
    (tmp_path / "elsewhere").mkdir()
    planted.symlink_to(tmp_path / "elsewhere")
    os.lchown(planted, NOBODY, NOBODY)
    with pytest.raises(
        ClusterError, match=f"{planted} is a symlink, not a folder, or another user's"
    ) as err:
        lock_dir()
    assert "\n" not in str(err.value)


# --- 2. attach address=auto: Ray's ray_current_cluster only if this user wrote it ---------------


def _current_cluster(
    shared_tmp: Path, text: str = "10.9.9.9:6379\n", mode: int = 0o644, uid: int | None = None
) -> Path:
    folder = shared_tmp / "ray"
    folder.mkdir(exist_ok=True)
    folder.chmod(0o777)  # as Ray leaves it: every user's
    return _plant(folder / "ray_current_cluster", text, mode, os.getuid() if uid is None else uid)


def _attach(*overrides: str):
    return backend_for(compose_config("backend=attach", "backend.address=auto", *overrides))


@as_root
def test_attach_auto_refuses_a_cluster_file_another_user_wrote(shared_tmp):
    _current_cluster(shared_tmp, uid=NOBODY)
    with pytest.raises(
        ConfigError,
        match=r"^backend.address: auto: .*ray_current_cluster is not this user's own file "
        r"\(owner uid 65534.*not followed",
    ) as err:
        _attach().target()
    assert "10.9.9.9" not in str(err.value)


@as_root
def test_attach_auto_refusal_is_one_line_from_the_cli(shared_tmp, tmp_path):
    _current_cluster(shared_tmp, uid=NOBODY)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayflow",
            "backend=attach",
            "backend.address=auto",
            "dry_run=true",
            f"storage_path={tmp_path / 'results'}",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("rayflow: error: backend.address: auto: ")
    assert "Traceback" not in out.stderr


def test_attach_auto_refuses_a_writable_or_linked_cluster_file(shared_tmp, tmp_path):
    current = _current_cluster(shared_tmp, mode=0o666)
    with pytest.raises(ConfigError, match="not this user's own file"):
        _attach().target()
    current.unlink()
    (tmp_path / "theirs").write_text("10.9.9.9:6379")
    current.symlink_to(tmp_path / "theirs")
    with pytest.raises(ConfigError, match="is a symlink or unreadable: not followed"):
        _attach().target()


def test_attach_auto_follows_this_users_own_cluster_file(shared_tmp):
    _current_cluster(shared_tmp, text="127.0.0.1:6379\n")
    assert _attach().target() == "127.0.0.1:6379"


# --- 3. teardown selects by uid and path, and handles processes it may not touch -----------------


def _sleeper(*argv: str, user: int | None = None, name: str = "sh") -> subprocess.Popen:
    """A shell waiting 60 s whose command line holds ARGV (as `user`; its argv[0] `name`, as Ray
    names its processes), in a process group of its own."""
    extra = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    return subprocess.Popen(
        [name, "-c", "sleep 60; true", "sleeper", *argv],
        executable="/bin/sh",
        start_new_session=True,
        **extra,
    )


@pytest.fixture
def sleepers():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:  # only what this test started: its own process group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@as_root
def test_teardown_leaves_another_users_process_naming_the_temp_dir(tmp_path, sleepers):
    """A process of `nobody` that names the cluster's temp dir survives teardown, which does not
    raise; this user's processes naming the folder (or a path in it) are stopped; a sibling
    folder whose name merely starts with it is not the cluster's."""
    from rayflow.runtime.processes import pids_mentioning, stop_processes_mentioning

    temp_dir = str(tmp_path / "rf-vm-x")
    theirs = _sleeper(temp_dir, user=NOBODY)
    ours = _sleeper(f"--session-dir={temp_dir}/session_1")
    sibling = _sleeper(temp_dir + "2")
    sleepers += [theirs, ours, sibling]
    time.sleep(0.2)  # exec'd
    assert pids_mentioning(temp_dir) == {ours.pid}
    stop_processes_mentioning(temp_dir, timeout_s=5)
    assert ours.wait(timeout=10) is not None
    assert theirs.poll() is None and sibling.poll() is None


def test_teardown_goes_on_past_processes_it_may_not_signal(tmp_path, sleepers, monkeypatch):
    """AccessDenied (another user's setuid process, a hardened /proc) and processes that vanish
    or turn zombie mid-teardown are skipped, never raised: the rest are still stopped."""
    import psutil

    from rayflow.runtime import processes

    temp_dir = str(tmp_path / "rf-vm-y")
    stubborn, ours = _sleeper(temp_dir), _sleeper(temp_dir)
    sleepers += [stubborn, ours]
    time.sleep(0.2)
    real_terminate = psutil.Process.terminate

    def terminate(self):
        if self.pid == stubborn.pid:
            raise psutil.AccessDenied(self.pid)
        return real_terminate(self)

    monkeypatch.setattr(psutil.Process, "terminate", terminate)
    monkeypatch.setattr(
        psutil.Process,
        "kill",
        lambda self: terminate(self) if self.pid == stubborn.pid else real_terminate(self),
    )
    processes.stop_processes_mentioning(temp_dir, timeout_s=0.5)
    assert ours.wait(timeout=10) is not None
    gone = psutil.Process(stubborn.pid)
    monkeypatch.setattr(
        psutil.Process, "uids", lambda self: (_ for _ in ()).throw(psutil.ZombieProcess(self.pid))
    )
    assert processes.is_own(gone) is False


def test_teardown_can_be_narrowed_to_the_process_group_it_started(tmp_path, sleepers):
    from rayflow.runtime.processes import pids_mentioning

    temp_dir = str(tmp_path / "rf-vm-z")
    group, other = _sleeper(temp_dir), _sleeper(temp_dir)
    sleepers += [group, other]
    time.sleep(0.2)
    assert pids_mentioning(temp_dir, pgid=group.pid) == {group.pid}
    assert pids_mentioning(temp_dir) == {group.pid, other.pid}


@as_root
def test_the_test_helpers_do_not_count_another_users_processes(tmp_path, sleepers, monkeypatch):
    """`nobody`'s processes named like a raylet or a Ray actor are not this suite's leftovers."""
    from rayflow.testing import processes as testing

    monkeypatch.delenv(testing.SESSION_MARK, raising=False)  # unmarked: every process of this user
    raylet = _sleeper(user=NOBODY, name=str(tmp_path / "raylet"))
    actor = _sleeper(user=NOBODY, name="ray::RayflowFakeActor")
    ours = _sleeper(name="ray::RayflowFakeActor")
    sleepers += [raylet, actor, ours]
    time.sleep(0.2)
    assert raylet.pid not in testing.ray_daemon_pids()
    # ours alone: under load, our shell's child was seen between its fork and its exec, still named
    # as its parent (a moment later it is `sleep`); nobody's is never counted
    assert testing.wait_until(
        lambda: testing.process_pids("ray::RayflowFakeActor") == {ours.pid}, 10
    ), (
        testing.process_pids("ray::RayflowFakeActor"),
        ours.pid,
    )


# --- 4. ray_auth_mode=disabled: refused, since every Ray node listens beyond loopback ------------
# (issue 43: auth off was allowed with the dashboard on 127.0.0.1, while the GCS, raylet and agents
# of that very cluster listened on all interfaces)


def test_local_auth_off_is_refused_whatever_the_dashboard():
    for where in (
        ["backend.dashboard_host=0.0.0.0"],
        ["backend.dashboard_host=127.0.0.1"],
        ["backend.dashboard_host=0.0.0.0", "backend.include_dashboard=false"],
    ):
        with pytest.raises(ConfigError) as err:
            backend_for(compose_config(*where, "ray_auth_mode=disabled")).check()
        assert err.value.key == "ray_auth_mode" and "\n" not in str(err.value)
        assert "backend=local" in str(err.value) and "all interfaces" in str(err.value)
    for fine in (["backend.dashboard_host=0.0.0.0"], ["backend.dashboard_host=127.0.0.1"]):
        backend_for(compose_config(*fine, "ray_auth_mode=token")).check()


def test_spark_auth_off_is_refused_whatever_its_dashboard():
    """Ray on Spark binds the dashboard to all interfaces and its GCS and client ports to the
    driver's address: no setting keeps them on loopback (docs/backends/spark.md)."""
    pytest.importorskip("pyspark")
    for extra in ([], ["+backend.head_node_options.include_dashboard=false"]):
        with pytest.raises(
            ConfigError,
            match=r"^ray_auth_mode: disabled, but Ray on Spark's dashboard listens on all interfaces",
        ):
            backend_for(compose_config("backend=spark", "ray_auth_mode=disabled", *extra)).check()


def test_attach_auth_off_is_refused_on_loopback_too_before_connecting(capsys):
    """A cluster reached on 127.0.0.1 has its nodes' servers beyond loopback all the same: the
    job and its secrets would go to a cluster anyone reaching it can use. Refused before any
    connection (192.0.2.1 is unreachable: a connect would take the whole timeout)."""
    for address in ("127.0.0.1:1", "ray://192.0.2.1:10001"):
        backend = backend_for(
            compose_config(
                "backend=attach",
                f"backend.address={address}",
                "backend.connect_timeout_s=30",
                "ray_auth_mode=disabled",
            )
        )
        started = time.monotonic()
        with pytest.raises(ConfigError) as err:
            backend.check()
        assert err.value.key == "ray_auth_mode" and "cannot reach" not in str(err.value)
        assert f"backend=attach joins ({address})" in str(err.value)
        assert time.monotonic() - started < 5
    assert "warning" not in capsys.readouterr().err


# --- 5. the token at rest: 0600 in a 0700 folder, whoever wrote it -------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)  # ~/.cache: the HOME's
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    return home


def _modes(path: Path) -> tuple[int, int]:
    return stat.S_IMODE(path.parent.stat().st_mode), stat.S_IMODE(path.stat().st_mode)


def test_ensure_token_makes_an_open_token_private(home, tmp_path, monkeypatch):
    from rayflow.security.auth import ensure_token

    (home / ".ray").mkdir(mode=0o755)
    token = home / ".ray" / "auth_token"
    token.write_text("t" * 32)
    token.chmod(0o644)
    ensure_token()
    assert _modes(token) == (0o700, 0o600)
    # RAY_AUTH_TOKEN_PATH elsewhere: that file 0600 too (its folder is the user's choice)
    other = tmp_path / "tokens" / "ray"
    other.parent.mkdir(mode=0o755)
    other.write_text("t" * 32)
    other.chmod(0o644)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(other))
    ensure_token()
    assert _modes(other) == (0o755, 0o600)


def test_a_local_start_leaves_the_token_ray_generates_private(home, monkeypatch):
    """ray.init generates a missing token into ~/.ray (0644): rayflow makes the folder 0700
    before (the file is never readable by others) and the file 0600 after."""
    import ray
    from ray._private.authentication import authentication_token_setup as setup

    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    seen = {}

    def init(**kwargs):  # what ray.init does with the token, and no cluster
        setup.generate_and_save_token()
        seen["folder"] = stat.S_IMODE((home / ".ray").stat().st_mode)
        return SimpleNamespace(address_info={"address": "127.0.0.1:1"})

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(
        ray._private.worker,
        "_global_node",
        SimpleNamespace(kill_all_processes=lambda **_: None),
        raising=False,
    )
    backend = backend_for(  # no dashboard: the stub binds none for rayflow to check (issue 43)
        compose_config(
            "backend.num_cpus=1",
            "backend.preload_worker_imports=false",
            "backend.include_dashboard=false",
        )
    )
    handle = backend.start()
    backend.stop(handle)
    assert seen["folder"] == 0o700
    assert _modes(home / ".ray" / "auth_token") == (0o700, 0o600)


@as_root
def test_another_users_token_file_is_left_alone(home):
    from rayflow.security.auth import secure_token_file

    (home / ".ray").mkdir(mode=0o700)
    theirs = _plant(home / ".ray" / "auth_token", "t", mode=0o644)
    secure_token_file()
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o644 and theirs.stat().st_uid == NOBODY


# --- 6. data: a batch file runs no code, whoever wrote it ---------------------------------------


class _Planted:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_in_data_root_runs_nothing_and_is_refused_in_one_line(tmp_path):
    from rayflow.workloads.presets.cifar_data import TEST_FILE, TRAIN_FILES, DataSpec, load_split

    spec = DataSpec(root=str(tmp_path / "data"), download=False)
    spec.batch_dir.mkdir(parents=True)
    marker = tmp_path / "code-ran"
    good = {b"data": np.zeros((10, 3072), np.uint8), b"labels": list(range(10))}
    for name in TRAIN_FILES + [TEST_FILE]:
        (spec.batch_dir / name).write_bytes(pickle.dumps(good, protocol=2))
    (spec.batch_dir / TRAIN_FILES[2]).write_bytes(
        pickle.dumps({b"data": _Planted(marker), b"labels": []})
    )
    with pytest.raises(
        DataError,
        match=rf"^data.root: .*{TRAIN_FILES[2]} is not a CIFAR-10 batch pickle \(UnpicklingError: it names posix.system, "
        "which a CIFAR-10 batch never holds\\); not loaded",
    ) as err:
        load_split(spec)
    assert "\n" not in str(err.value)
    assert not marker.exists()
