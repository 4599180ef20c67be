"""backend=vm security (issue 30), without a cluster: clusters have owners (vm.state), cluster
names validated wherever they come from, auth off beside an exposed head refused from overrides
too, the token private on every node, the dashboard of a remote head reached through an SSH
tunnel. The two-runs test on a real fake_multinode cluster is in test_vm.py (its cluster's turn)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from rayflow.backends import backend_for
from rayflow.backends.vm import state, tunnel
from rayflow.errors import ConfigError
from rayflow.orchestrator.cluster import running
from rayflow.orchestrator.compose import compose_config
from rayflow.security.auth import NODE_TOKEN_MODES
from tests.harness.vm_hosts import local_hosts


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A HOME of the test's own: the state folder (~/.cache/rayflow/vm) and ~/.ray are its. A
    backend's start exports RAY_AUTH_MODE for this process: put back afterwards."""
    from rayflow.runtime.environment import reread_ray_config

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)  # ~/.cache: the HOME's
    mode = os.environ.get("RAY_AUTH_MODE")
    yield home
    if mode is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = mode
    reread_ray_config()


@pytest.fixture
def other_run(tmp_path):
    """Another live process (a run of the same user, as far as the state folder knows)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", str(tmp_path / "rf-vm-other")]
    )
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def holder_of(proc: subprocess.Popen) -> dict:
    import psutil

    return {"run": "other-run", "pid": proc.pid, "started": psutil.Process(proc.pid).create_time()}


def write_state(name: str, **fields) -> None:
    state._write(name, {"cluster_name": name, "owner_run": "other-run", **fields})


# --- clusters have owners ---------------------------------------------------------------------


def test_the_state_folder_is_private_and_records_are_0600(home):
    (home / ".cache" / "rayflow").mkdir(parents=True, mode=0o755)  # an open folder from before
    assert state.claim("mine", "run-1", "fake_multinode", True, lambda _: False) is None
    folder = home / ".cache" / "rayflow" / "vm"
    assert (
        stat.S_IMODE(folder.stat().st_mode) == 0o700
        and stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    )
    assert stat.S_IMODE((folder / "mine.json").stat().st_mode) == 0o600
    record = state.read("mine")
    assert (
        record["owner_run"] == "run-1"
        and record["kept"] is True
        and record["holder"]["pid"] == os.getpid()
    )


def test_a_second_run_is_refused_while_another_holds_the_name_and_leaves_it_intact(
    other_run, tmp_path
):
    """The old behaviour: any live cluster of the name was reused and its teardown registered."""
    # the other run's cluster: a process naming its temp dir
    temp_dir = str(tmp_path / "rf-vm-other")
    write_state(
        "rayflow",
        provider="fake_multinode",
        kept=True,
        holder=holder_of(other_run),
        temp_dir=temp_dir,
        url="http://127.0.0.1:1",
        stop=temp_dir,
    )
    before = state.read("rayflow")
    backend = backend_for(compose_config("backend=vm", "ray_auth_mode=token"))
    temp_dirs = set(Path(tempfile.gettempdir()).glob("rf-vm-*"))
    with pytest.raises(ConfigError) as err:
        running(backend).__enter__()
    assert err.value.key == "backend.cluster_name" and "in use by another run" in str(err.value)
    assert f"pid {other_run.pid}" in str(err.value) and "\n" not in str(err.value)
    assert other_run.poll() is None and state.read("rayflow") == before  # left intact
    # nothing started: no cluster folder to tear down
    assert set(Path(tempfile.gettempdir()).glob("rf-vm-*")) == temp_dirs


def test_a_live_cluster_nobody_kept_is_refused_not_joined(other_run, tmp_path):
    """A run that died without its teardown left a cluster of the name: never joined, never stopped."""
    temp_dir = str(tmp_path / "rf-vm-other")
    write_state(
        "rayflow",
        provider="fake_multinode",
        kept=False,
        holder=None,
        temp_dir=temp_dir,
        url="http://127.0.0.1:1",
        stop=temp_dir,
    )
    with pytest.raises(
        ConfigError,
        match=r"no run of yours kept.*python -m rayflow\.backends\.vm\.teardown .*rf-vm-other",
    ):
        running(backend_for(compose_config("backend=vm", "ray_auth_mode=token"))).__enter__()
    assert other_run.poll() is None


def test_claims_and_releases(other_run):
    # new: the name is run-1's
    assert state.claim("c1", "run-1", "aws", False, lambda _: False) is None
    # same process, another run: still refused
    with pytest.raises(ConfigError, match="in use by another run"):
        state.claim("c1", "run-2", "aws", False, lambda _: True)
    state.release("c1", "run-2")  # not its record: left alone
    assert state.read("c1")["holder"]["run"] == "run-1"
    state.release("c1", "run-1")  # started and not kept: torn down, the record goes
    assert state.read("c1") is None
    # a kept cluster, held by nobody: joined, then let go of, and it stays recorded
    state.claim("c2", "run-1", "aws", True, lambda _: False)
    state.release("c2", "run-1")
    joined = state.claim("c2", "run-3", "aws", False, lambda _: True)
    assert joined and joined["owner_run"] == "run-1" and joined["holder"]["run"] == "run-3"
    state.release("c2", "run-3")
    assert state.read("c2")["holder"] is None and state.read("c2")["kept"] is True
    # a holder whose process is gone does not hold it
    write_state(
        "c3", provider="aws", kept=True, holder={"run": "x", "pid": other_run.pid, "started": 1.0}
    )
    assert state.claim("c3", "run-4", "aws", False, lambda _: True)["holder"]["run"] == "run-4"


def test_sdk_providers_never_run_ray_up_over_a_live_cluster_this_run_did_not_start(
    tmp_path, monkeypatch
):
    from ray.autoscaler import sdk

    from rayflow.backends.vm import sdk_start

    calls = []
    monkeypatch.setattr(
        sdk_start, "_head_running", lambda config: True
    )  # a head of this name is up
    monkeypatch.setattr(sdk, "create_or_update_cluster", lambda *a, **k: calls.append(("up", k)))
    monkeypatch.setattr(sdk, "teardown_cluster", lambda *a, **k: calls.append(("down", a)))
    cfg = compose_config(
        *local_hosts(tmp_path, "ray_auth_mode=token", "backend.cluster_name=shared")
    )
    with pytest.raises(
        ConfigError, match=r"^.*'shared' is running \(local\) that no run of yours kept"
    ) as err:
        running(backend_for(cfg)).__enter__()
    # nothing restarted, nothing torn down
    assert err.value.key == "backend.cluster_name" and calls == []

    # kept by an earlier run of this user, held by none: joined with no_restart=True, never torn down
    config_file = tmp_path / "kept" / "shared.yaml"
    config_file.parent.mkdir()
    write_state("shared", provider="local", kept=True, holder=None, stop=str(config_file))
    monkeypatch.setattr(sdk, "get_head_node_ip", lambda path: "10.99.0.11")
    monkeypatch.setattr(sdk_start, "_tunnel", lambda vm, handle, config, ip: "http://127.0.0.1:9")
    with running(backend_for(cfg)) as handle:
        assert handle.address == "http://127.0.0.1:9"
        assert state.read("shared")["holder"]["pid"] == os.getpid()
    assert calls == [("up", {"no_restart": True, "restart_only": False, "no_config_cache": True})]
    assert state.read("shared")["holder"] is None and config_file.is_file()


def test_a_kept_sdk_cluster_joined_without_a_recorded_config_is_never_torn_down(
    tmp_path, monkeypatch
):
    from ray.autoscaler import sdk

    from rayflow.backends.vm import sdk_start

    calls = []
    monkeypatch.setattr(sdk_start, "_head_running", lambda config: True)
    monkeypatch.setattr(
        sdk, "create_or_update_cluster", lambda *a, **k: calls.append(("up", k["no_restart"]))
    )
    monkeypatch.setattr(sdk, "teardown_cluster", lambda *a, **k: calls.append(("down",)))
    monkeypatch.setattr(sdk, "get_head_node_ip", lambda path: "10.99.0.11")
    monkeypatch.setattr(sdk_start, "_tunnel", lambda vm, handle, config, ip: "http://127.0.0.1:9")
    # its run died before it recorded its config
    write_state("kept", provider="local", kept=True, holder=None)
    with running(
        backend_for(
            compose_config(
                *local_hosts(tmp_path, "ray_auth_mode=token", "backend.cluster_name=kept")
            )
        )
    ):
        pass
    assert calls == [("up", True)] and state.read("kept")["stop"].endswith("kept.yaml")


def test_a_new_sdk_cluster_is_recorded_while_it_starts_and_forgotten_after_its_teardown(
    tmp_path, monkeypatch
):
    from ray.autoscaler import sdk

    from rayflow.backends.vm import sdk_start

    seen = {}
    monkeypatch.setattr(sdk_start, "_head_running", lambda config: False)
    monkeypatch.setattr(
        sdk,
        "create_or_update_cluster",
        lambda *a, **k: seen.update(up=k, during=state.read("mine")),
    )
    monkeypatch.setattr(sdk, "teardown_cluster", lambda path: seen.update(down=path))
    monkeypatch.setattr(sdk, "get_head_node_ip", lambda path: "10.99.0.11")
    monkeypatch.setattr(sdk_start, "stop_local_workers", lambda config: None)
    monkeypatch.setattr(sdk_start, "_tunnel", lambda vm, handle, config, ip: "http://127.0.0.1:9")
    with running(
        backend_for(
            compose_config(
                *local_hosts(tmp_path, "ray_auth_mode=token", "backend.cluster_name=mine")
            )
        )
    ):
        pass
    # a concurrent run is refused
    assert seen["up"]["no_restart"] is False and seen["during"]["holder"]["pid"] == os.getpid()
    assert seen["down"] and state.read("mine") is None


# --- cluster names, wherever they come from ---------------------------------------------------


def test_a_cluster_name_from_overrides_is_validated(tmp_path):
    cfg = compose_config("backend=vm", "+backend.overrides={cluster_name: ../../x}")
    with pytest.raises(ConfigError) as err:
        backend_for(cfg).check()
    assert err.value.key.startswith(
        "backend.overrides"
    ) and "'../../x' is not a cluster name" in str(err.value)


@pytest.mark.parametrize("name", ["../../x", "a/b", "x" * 300, "-lead", ""])
def test_a_cluster_name_from_the_users_file_is_validated(name, tmp_path):
    doc = yaml.safe_load(
        backend_for(compose_config("backend=vm", "ray_auth_mode=token")).render().text
    )  # a dry run's file
    doc["cluster_name"] = name
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        backend_for(compose_config("backend=vm", f"backend.cluster_yaml={path}")).check()
    assert err.value.key == "backend.cluster_yaml" and f"{path}: cluster_name: " in str(err.value)
    assert "\n" not in str(err.value)


def test_state_paths_are_built_from_valid_names_only():
    with pytest.raises(ConfigError, match="is not a cluster name"):
        state.state_file("../../x")


# --- auth off, the token on the nodes, the tunnel ---------------------------------------------


EXPOSED = "{head_start_ray_commands: ['ray stop', 'ray start --head --port=6379 --dashboard-host=0.0.0.0 --autoscaling-config=~/ray_bootstrap_config.yaml']}"


def test_overrides_that_put_the_dashboard_back_on_the_network_with_auth_off_are_refused(tmp_path):
    """Issue 43: the refusal names ray_auth_mode first, not the overrides."""
    cfg = compose_config(
        *local_hosts(tmp_path, "ray_auth_mode=disabled", f"+backend.overrides={EXPOSED}")
    )
    with pytest.raises(ConfigError) as err:
        backend_for(cfg).check()
    assert err.value.key == "ray_auth_mode" and "\n" not in str(err.value)
    assert str(err.value).startswith("ray_auth_mode: disabled, but with provider=local ")


def test_overrides_that_drop_the_auth_export_beside_an_exposed_dashboard_are_refused(tmp_path):
    cfg = compose_config(
        *local_hosts(tmp_path, "ray_auth_mode=token", f"+backend.overrides={EXPOSED}")
    )
    with pytest.raises(ConfigError, match=r"without `export RAY_AUTH_MODE=token;`") as err:
        backend_for(cfg).check()
    assert err.value.key == "ray_auth_mode"
    assert "token auth is off (backend.overrides.head_start_ray_commands: " in str(err.value)


def test_a_head_started_without_token_auth_is_refused_whatever_its_dashboard_host(tmp_path):
    """Issue 43: the head's GCS and Ray Client listen on its node address whatever the dashboard
    does, so a `ray start --head` without `export RAY_AUTH_MODE=token;` is refused even with the
    dashboard on loopback or a host only the head knows (until now a warning, or nothing)."""
    for host in ("$MY_HOST", "127.0.0.1"):
        bare = f"{{head_start_ray_commands: ['ray start --head --dashboard-host={host}']}}"
        with pytest.raises(ConfigError) as err:
            backend_for(
                compose_config(
                    *local_hosts(tmp_path, "ray_auth_mode=token", f"+backend.overrides={bare}")
                )
            ).check()
        assert err.value.key == "ray_auth_mode" and "head_start_ray_commands" in str(err.value)
        exported = bare.replace("'ray start", "'export RAY_AUTH_MODE=token; ray start")
        backend_for(
            compose_config(
                *local_hosts(tmp_path, "ray_auth_mode=token", f"+backend.overrides={exported}")
            )
        ).check()


@pytest.mark.parametrize("provider", ["local", "aws", "gcp", "fake_multinode"])
def test_auth_off_on_a_head_that_other_machines_reach_is_refused(provider, tmp_path):
    """Ray Client and the GCS listen on a remote head's node address whatever the dashboard does;
    fake_multinode's nodes on this machine's interfaces (issue 43: allowed until now)."""
    extra = {
        "local": local_hosts(tmp_path),
        "aws": ["backend=vm", "backend.provider=aws"],
        "gcp": ["backend=vm", "backend.provider=gcp", "backend.project_id=p-123456"],
        "fake_multinode": ["backend=vm"],
    }[provider]
    with pytest.raises(ConfigError) as err:
        backend_for(compose_config(*extra, "ray_auth_mode=disabled")).check()
    assert err.value.key == "ray_auth_mode" and f"with provider={provider} " in str(err.value)
    backend_for(compose_config(*extra, "ray_auth_mode=token")).check()  # token auth: fine


def test_auth_off_with_a_users_file_for_hosts_is_refused_naming_the_file(tmp_path):
    from tests.test_vm_user_file import RAY_DEFAULTS

    cfg = compose_config(
        "backend=vm",
        f"backend.cluster_yaml={RAY_DEFAULTS.joinpath('aws', 'defaults.yaml')}",
        "ray_auth_mode=disabled",
    )
    with pytest.raises(ConfigError, match="the cluster of backend.cluster_yaml the head's") as err:
        backend_for(cfg).check()
    assert err.value.key == "ray_auth_mode"


def test_the_head_dashboard_stays_on_loopback_and_the_token_is_made_private_on_every_node(tmp_path):
    token = tmp_path / "auth_token"
    token.write_text("x" * 32)
    for overrides in ([], ["+backend.overrides={setup_commands: ['echo mine']}"]):
        cfg = compose_config(*local_hosts(tmp_path, "ray_auth_mode=token", *overrides))
        from rayflow.backends.vm.config import render

        config = render(cfg.backend, False, "token", token_file=str(token))
        assert (
            config["setup_commands"][0] == NODE_TOKEN_MODES
            and config["setup_commands"].count(NODE_TOKEN_MODES) == 1
        )
        head = [c for c in config["head_start_ray_commands"] if "--head" in c][0]
        assert "--dashboard-host=127.0.0.1" in head


def test_the_tunnel_forwards_a_private_socket_to_the_heads_loopback():
    sock = "/tmp/rf-tunnel-x/dashboard.sock"
    command = tunnel.tunnel_command(
        {"ssh_user": "me", "ssh_private_key": "~/.ssh/k"}, "10.0.0.5", sock, 8265, "rayflow"
    )
    assert command[0] == "ssh" and "-N" in command and command[-2:] == ["--", "me@10.0.0.5"]
    # issue 43: a socket in a private folder, not a local port chosen before ssh binds it
    assert command[command.index("-L") + 1] == f"{sock}:127.0.0.1:8265"
    assert "ExitOnForwardFailure=yes" in command and "BatchMode=yes" in command
    assert command[command.index("-i") + 1] == os.path.expanduser("~/.ssh/k")


def test_a_tunnel_that_fails_is_one_line(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; sys.stderr.write('ssh: connect to host 10.0.0.5 port 22: No route to host\\n'); sys.exit(255)",
        ],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    proc.wait(timeout=30)
    relay = tunnel.Relay(str(tmp_path / "dashboard.sock"))  # the tunnel's URL, held here
    opened = tunnel.Tunnel(proc, str(tmp_path / "tunnel"), relay, "10.0.0.5", "rayflow")
    err = tunnel.tunnel_failed(opened)
    assert (
        str(err)
        == "backend=vm: the SSH tunnel to the head's dashboard failed: ssh: connect to host 10.0.0.5 port 22: No route to host"
    )
    tunnel.close_tunnel(opened)


def test_teardown_stops_only_a_folder_rayflow_made(tmp_path):
    """`python -m rayflow.backends.vm.teardown PATH` removes the folder: never one that is not a
    fake cluster's."""
    folder = tmp_path / "precious"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    out = subprocess.run(
        [sys.executable, "-m", "rayflow.backends.vm.teardown", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and (folder / "keep.txt").is_file()
    assert (
        out.stderr.strip()
        == f"rayflow.backends.vm.teardown: {folder} is not a fake_multinode cluster's temp dir of yours (rf-vm-*, with its autoscaling.yaml): nothing stopped"
    )


def test_a_job_on_aws_vms_gets_no_keys_of_this_machine(monkeypatch):
    """The nodes of an aws cluster have the instance profile of Ray's role: a job there is handed
    the store's endpoint and region, never this machine's keys; elsewhere it gets them (the
    nodes have no identity of their own)."""
    from types import SimpleNamespace

    from rayflow.backends import ClusterHandle
    from rayflow.backends.handle import Submission
    from rayflow.backends.vm.kept import NODE_IDENTITY
    from rayflow.orchestrator import remote_run

    for name, value in {
        "AWS_ACCESS_KEY_ID": "AKIAPLANTED",
        "AWS_SECRET_ACCESS_KEY": "planted-secret",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_REGION": "us-west-2",
    }.items():
        monkeypatch.setenv(name, value)
    cfg = compose_config("backend=vm", "storage_path=s3://bucket/runs")
    plan = SimpleNamespace(overrides=["backend=vm"], cfg=cfg)
    for provider, keys in (("aws", False), ("local", True)):
        handle = ClusterHandle("vm")
        handle.submission = Submission(withheld=NODE_IDENTITY.get(provider, ()))
        cluster = SimpleNamespace(handle=handle, backend=SimpleNamespace(name="vm"), spec="")
        env = remote_run._env(plan, cluster, started=False)
        assert (
            env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000" and env["AWS_REGION"] == "us-west-2"
        )
        assert ("AWS_SECRET_ACCESS_KEY" in env) is keys and ("AWS_ACCESS_KEY_ID" in env) is keys
