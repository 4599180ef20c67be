"""Nothing from a shared place is executed or trusted (issue 43, classes 4 and 6), without a
cluster: cluster YAMLs and folders in /tmp that are not privately this user's are refused by
`rayflow status`, `logs`, `down` and `python -m rayflow.backends.vm.teardown`, which run nothing
and delete nothing; a kept cluster's record outlives a /tmp wipe; `down` never says "torn down" for what it
did not reach; every cloud VM carries its run's owner tag. The same selection against an EC2 API
is in tests/test_vm_aws.py (its emulator's turn)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

from rayflow.backends import kept
from tests.harness.needs import NOBODY, need_root
from tests.harness.vm_hosts import local_hosts


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """This user's cache and HOME of the test's own, for this process and its commands."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return folder


@pytest.fixture
def shared_tmp():
    """A folder as a run made one in /tmp (`rf-vm-*`), removed afterwards whoever owns it."""
    folder = Path(tempfile.mkdtemp(prefix="rf-vm-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def command(*args: str, module: str = "rayflow") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )


def _lines(out: subprocess.CompletedProcess) -> list[str]:
    return [line for line in out.stderr.splitlines() if line.strip()]


def _record(name: str, where: dict, provider: str = "local") -> kept.KeptCluster:
    record = kept.KeptCluster(
        backend="vm",
        name=name,
        owner_run=f"{name}-run",
        section={"name": "vm", "provider": provider},
        where=where,
    )
    kept.keep(record)
    return record


def _planted(folder: Path, name: str, marker: Path) -> Path:
    """The cluster YAML another party left: its proxy command would write `marker` as whoever
    runs SSH with it; Ray's own state says the head runs, so the code before the fix used it."""
    config = {
        "cluster_name": name,
        "provider": {"type": "local", "head_ip": "127.0.0.1", "worker_ips": ["127.0.0.2"]},
        "auth": {"ssh_user": "me", "ssh_proxy_command": f"touch {marker}; false"},
        "head_start_ray_commands": [f"touch {marker}"],
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def ray_state():
    """Ray's local-provider state of a cluster name (in /tmp/ray), removed afterwards."""
    from ray.autoscaler._private.local.config import get_lock_path, get_state_path

    made: list[str] = []

    def plant(name: str) -> None:
        path = get_state_path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        up = {"state": "running"}
        nodes = {
            "127.0.0.1": {"tags": {"ray-node-type": "head", "ray-node-status": "up-to-date"}, **up},
            "127.0.0.2": {"tags": {"ray-node-type": "worker"}, **up},
        }
        Path(path).write_text(json.dumps(nodes))
        made.extend([path, get_lock_path(name)])

    yield plant
    for path in made:
        Path(path).unlink(missing_ok=True)


# --- 1. a cluster YAML or folder that is not privately yours: read by nothing --------------------


def test_another_users_cluster_folder_is_refused_by_status_logs_down_and_teardown(
    cache, shared_tmp, tmp_path, ray_state
):
    """The folder a record names was recreated by `nobody`, with a cluster YAML whose
    ssh_proxy_command would run as this user: each command says so in one line, runs nothing
    and deletes nothing."""
    need_root()
    name = f"rf-shared-{uuid.uuid4().hex[:6]}"
    marker = tmp_path / "marker"
    planted = _planted(shared_tmp, name, marker)
    ray_state(name)
    os.chown(planted, NOBODY, NOBODY)
    os.chown(shared_tmp, NOBODY, NOBODY)
    _record(name, {"provider": "local", "config_file": str(planted)})
    why = f"{shared_tmp} is owned by uid {NOBODY}, not by you"

    status = command("status")
    assert not marker.exists(), "the planted proxy command ran"
    assert status.returncode == 0, status.stderr
    [row] = [line for line in status.stdout.splitlines() if line.startswith("vm ")]
    assert row.split()[2] == "unreachable", status.stdout
    assert f"  {name}: vm cluster {name}: {why}: not read" in status.stdout

    logs = command("logs", name)
    assert logs.returncode == 1 and _lines(logs) == [
        f"rayflow: error: vm cluster {name}: {why}: not read (rayflow reads and runs cluster "
        "YAMLs of yours only)"
    ], logs.stderr

    down = command("down", name)
    assert down.returncode == 1 and "torn down" not in down.stdout, down.stdout + down.stderr
    [line] = _lines(down)
    assert line.startswith(f"rayflow: error: vm cluster {name}: {why}: not read") and (
        f"{name} is not torn down, its record is kept" in line
    )
    assert [r.name for r in kept.records()] == [name]

    teardown = command(str(planted), module="rayflow.backends.vm.teardown")
    assert teardown.returncode == 2 and _lines(teardown) == [
        f"rayflow.backends.vm.teardown: {why}: nothing stopped"
    ], teardown.stderr
    assert not marker.exists(), "the planted proxy command ran"
    assert planted.is_file() and shared_tmp.stat().st_uid == NOBODY  # nothing deleted


@pytest.mark.parametrize("variant", ["folder others may write", "file of another user"])
def test_a_cluster_yaml_not_privately_yours_is_read_by_nothing(
    variant, cache, shared_tmp, tmp_path, ray_state
):
    """The same refusal where the folder is yours but others may write it (they can swap the
    file), or the file in your folder is another user's: in process, as `rayflow.status()`,
    `logs()`, `down()` and the teardown's main() see it."""
    from rayflow.backends.vm import teardown
    from rayflow.errors import ClusterError
    from rayflow.orchestrator import clusters

    name = f"rf-shared-{uuid.uuid4().hex[:6]}"
    marker = tmp_path / "marker"
    planted = _planted(shared_tmp, name, marker)
    ray_state(name)
    if variant == "file of another user":
        need_root()
        os.chown(planted, NOBODY, NOBODY)
        why = f"{planted} is owned by uid {NOBODY}, not by you"
    else:
        shared_tmp.chmod(0o777)
        why = f"{shared_tmp} is writable by others (mode 0777)"
    _record(name, {"provider": "local", "config_file": str(planted)})

    [row] = clusters.clusters()
    assert not marker.exists(), "the planted proxy command ran"
    assert row.state == "unreachable" and row.detail.startswith(f"vm cluster {name}: {why}")
    with pytest.raises(ClusterError, match="not read"):
        clusters.logs(name)
    done, failed = clusters.down_each(name, force=True)
    assert done == [] and len(failed) == 1 and why in failed[0]
    assert teardown.main([str(planted)]) == 2
    assert not marker.exists() and planted.is_file() and [r.name for r in kept.records()] == [name]


def test_a_fake_clusters_temp_dir_others_may_write_is_neither_stopped_nor_removed(
    cache, shared_tmp, capsys
):
    """A fake_multinode cluster's temp dir (in /tmp, kept short for Ray's socket paths) that
    others may write: `down`, the teardown command and the head's autostop stop no process by it
    and remove nothing."""
    from rayflow.backends import idle_stop
    from rayflow.backends.vm import teardown
    from rayflow.errors import ClusterError
    from rayflow.orchestrator import clusters

    (shared_tmp / "autoscaling.yaml").write_text("provider: {type: fake_multinode}\n")
    shared_tmp.chmod(0o777)
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", str(shared_tmp)]
    )
    try:
        _record(
            "rf-fake",
            {
                "provider": "fake_multinode",
                "temp_dir": str(shared_tmp),
                "url": "http://127.0.0.1:9",
            },
            provider="fake_multinode",
        )
        why = f"{shared_tmp} is writable by others (mode 0777)"
        assert teardown.main([str(shared_tmp)]) == 2
        assert f"rayflow.backends.vm.teardown: {why}: nothing stopped" in capsys.readouterr().err
        # the watcher's teardown on the head, found as the watcher finds it (the registry)
        idle_stop("vm")({"backend": "vm", "kind": "processes", "temp_dir": str(shared_tmp)})
        assert f"[autostop] {why}" in capsys.readouterr().out
        with pytest.raises(ClusterError) as refused:
            clusters.down("rf-fake", force=True)
        assert why in str(refused.value) and "rf-fake is not torn down" in str(refused.value)
        assert process.poll() is None and (shared_tmp / "autoscaling.yaml").is_file()
        assert [r.name for r in kept.records()] == ["rf-fake"]
    finally:
        process.kill()
        process.wait(timeout=10)


# --- 2. kept records in the cache: a /tmp wipe loses nothing ------------------------------------


def _local_hosts(tmp_path, *extra: str) -> list[str]:
    return local_hosts(tmp_path, "backend.autostop_idle_minutes=0", "ray_auth_mode=token", *extra)


def _wipe_tmp(before: set[str], name: str) -> list[str]:
    """What the run of cluster `name` left in /tmp since `before` (a temp dir `rf-vm-*` holding
    its cluster YAML, where runs wrote it before the cache), removed as a reboot or a tmp
    cleaner would; nothing else in /tmp is touched."""
    base = Path(tempfile.gettempdir())
    new = [
        p for p in base.glob("rf-vm-*") if p.name not in before and (p / f"{name}.yaml").exists()
    ]
    for path in new:
        shutil.rmtree(path, ignore_errors=True)
    return [p.name for p in new]


def test_a_kept_ssh_cluster_is_found_and_torn_down_after_tmp_is_wiped(cache, tmp_path, monkeypatch):
    """Kept by a run (Ray's SDK stubbed: no hosts here); then /tmp is wiped. `status` still
    lists it (its hosts out of reach, not gone), and `down` still finds every host to stop from
    the cluster YAML kept in the cache. A host SSH does not reach keeps the record, in one line
    that says which and what to run there; reached, it is torn down."""
    from ray.autoscaler import sdk

    from rayflow.backends import backend_for
    from rayflow.backends.vm import kept as vm_kept
    from rayflow.backends.vm import sdk_start, tunnel
    from rayflow.errors import ClusterError
    from rayflow.orchestrator import clusters
    from rayflow.orchestrator.cluster import running
    from rayflow.orchestrator.compose import compose_config

    monkeypatch.setenv("RAY_AUTH_TOKEN", "a-test-token")
    monkeypatch.setattr(sdk_start, "_head_running", lambda config: False)
    monkeypatch.setattr(sdk, "create_or_update_cluster", lambda *a, **k: None)
    monkeypatch.setattr(sdk, "get_head_node_ip", lambda config: "10.99.0.11")
    monkeypatch.setattr(sdk_start, "_tunnel", lambda vm, h, c, ip: "http://127.0.0.1:9")
    before = set(os.listdir(tempfile.gettempdir()))
    cfg = compose_config(
        *_local_hosts(tmp_path, "backend.cluster_name=rf-hosts", "backend.keep_cluster=true")
    )
    with running(backend_for(cfg)):
        pass
    _wipe_tmp(before, "rf-hosts")
    config_file = kept.records()[0].where["config_file"]
    assert Path(config_file).is_relative_to(cache)
    assert stat.S_IMODE(os.stat(config_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(Path(config_file).parent).st_mode) == 0o700

    tried = []

    def unreachable(auth, head_ip, port, name):
        tried.append(head_ip)
        raise ClusterError("ssh: connect to host 10.99.0.11 port 22: No route to host")

    monkeypatch.setattr(tunnel, "open_tunnel", unreachable)
    [row] = clusters.clusters()
    assert (row.name, row.state, tried) == ("rf-hosts", "unreachable", ["10.99.0.11"])

    stopped = []
    monkeypatch.setattr(
        vm_kept, "stop_local_workers", lambda c: stopped.append(c) or ["10.99.0.12"]
    )
    done, failed = clusters.down_each("rf-hosts", force=True)
    assert done == [] and [r.name for r in kept.records()] == ["rf-hosts"]
    [line] = failed
    assert line.startswith(
        "cluster rf-hosts: SSH did not reach 10.99.0.12: Ray may still run there; run `ray stop` "
        "on those hosts by hand; rf-hosts is not torn down, its record is kept"
    ), line
    monkeypatch.setattr(vm_kept, "stop_local_workers", lambda c: stopped.append(c) or [])
    assert clusters.down("rf-hosts", force=True) == ["rf-hosts"]
    assert stopped[-1]["provider"]["worker_ips"] == ["10.99.0.12", "10.99.0.11"]  # head last
    assert kept.records() == [] and not Path(config_file).exists()


def test_down_of_a_cluster_whose_yaml_is_gone_keeps_the_record_and_says_how_to_finish(
    cache, tmp_path
):
    """A record from before the cache (its cluster YAML in a /tmp folder a reboot removed):
    `down` cannot find the VMs, so it says so, and how to finish, in one line; it never prints
    "torn down", and `status` still lists the cluster."""
    gone = tmp_path / "rf-vm-wiped" / "rf-cloud.yaml"
    _record("rf-cloud", {"provider": "aws", "config_file": str(gone)}, provider="aws")
    out = command("down", "rf-cloud")
    assert out.returncode == 1 and "torn down" not in out.stdout, out.stdout + out.stderr
    [line] = _lines(out)
    assert line.startswith(
        f"rayflow: error: vm cluster rf-cloud: its cluster YAML {gone} is gone (kept before "
        "rayflow kept them in your cache, and /tmp was cleaned since): rayflow cannot find its "
        "VMs (tagged ray-cluster-name=rf-cloud: terminate them in the cloud console); stop them "
        "by hand; rf-cloud is not torn down, its record is kept"
    ), line
    status = json.loads(command("status", "--json").stdout)
    assert [(r["name"], r["state"]) for r in status] == [("rf-cloud", "unreachable")]


# --- 3. owner tags ------------------------------------------------------------------------------


def test_every_node_type_carries_the_owner_tag_as_rays_launchers_pass_it():
    """aws: the node_config's TagSpecifications, which Ray's AWSNodeProvider merges into the tags
    it creates an instance with (beside ray-cluster-name and a user's own tags); gcp: labels."""
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider

    from rayflow.backends import backend_for
    from rayflow.backends.vm import owner
    from rayflow.orchestrator.compose import compose_config

    aws = backend_for(compose_config("backend=vm", "backend.provider=aws")).cluster_config()
    head = aws["available_node_types"][aws["head_node_type"]]["node_config"]
    head["TagSpecifications"] = [
        {"ResourceType": "instance", "Tags": [{"Key": "team", "Value": "x"}]}
    ]
    tagged = owner.tag(aws, "run-1")
    assert owner.owner_of(tagged) == "run-1" and owner.owner_of(aws) is None
    for node_type in tagged["available_node_types"].values():
        base = [
            {"ResourceType": "instance", "Tags": [{"Key": "ray-cluster-name", "Value": "rayflow"}]}
        ]
        AWSNodeProvider._merge_tag_specs(base, node_type["node_config"]["TagSpecifications"])
        keys = {t["Key"]: t["Value"] for t in base[0]["Tags"]}
        assert keys["ray-cluster-name"] == "rayflow" and keys["rayflow-owner"] == "run-1"
    assert {"Key": "team", "Value": "x"} in owner.tag(tagged, "run-2")["available_node_types"][
        aws["head_node_type"]
    ]["node_config"]["TagSpecifications"][0]["Tags"]
    assert owner.owner_of(owner.tag(tagged, "run-2")) == "run-2"  # replaced, never doubled

    gcp = backend_for(
        compose_config("backend=vm", "backend.provider=gcp", "backend.project_id=p")
    ).cluster_config()
    tagged = owner.tag(gcp, "run-3")
    assert {
        t["node_config"]["labels"]["rayflow-owner"] for t in tagged["available_node_types"].values()
    } == {"run-3"}


def test_a_cloud_run_tags_its_vms_and_tears_down_only_those(cache, tmp_path, monkeypatch):
    """A start on aws (the cloud stubbed): the cluster YAML in the cache carries this run's owner
    on every node type, the teardown terminates by that owner, and the head is looked up by it;
    a run that joins a kept cluster renders the kept one's owner (Ray's launch hash unchanged)."""
    from ray.autoscaler import sdk

    from rayflow.backends import backend_for
    from rayflow.backends.vm import owner, sdk_start, state
    from rayflow.orchestrator.cluster import running
    from rayflow.orchestrator.compose import compose_config

    monkeypatch.setenv("RAY_AUTH_TOKEN", "a-test-token")
    seen: dict = {"terminated": [], "heads": []}
    monkeypatch.setattr(owner, "check_name_free", lambda config, recorded, hint="": bool(recorded))
    monkeypatch.setattr(
        sdk,
        "create_or_update_cluster",
        lambda path, **k: seen.update(
            up=yaml.safe_load(Path(path).read_text()), no_restart=k["no_restart"]
        ),
    )
    monkeypatch.setattr(
        owner, "head_ip", lambda config, who: seen["heads"].append(who) or "10.0.0.1"
    )
    monkeypatch.setattr(
        owner,
        "terminate",
        lambda config, who, stop_cached, busy=None, settle_s=0: seen["terminated"].append(who),
    )
    monkeypatch.setattr(sdk_start, "_tunnel", lambda vm, h, c, ip: "http://127.0.0.1:9")
    section = [
        "backend=vm",
        "backend.provider=aws",
        "backend.cluster_name=rf-cloud",
        "backend.autostop_idle_minutes=0",
    ]
    with running(backend_for(compose_config(*section))) as handle:
        run = handle.owner_run
        assert owner.owner_of(seen["up"]) == run and len(run) == 32
        assert all(
            {"Key": "rayflow-owner", "Value": run}
            in t["node_config"]["TagSpecifications"][0]["Tags"]
            for t in seen["up"]["available_node_types"].values()
        )
        assert Path(state.read("rf-cloud")["stop"]).is_relative_to(cache)
    assert seen["terminated"] == [run] and seen["heads"] == [run]

    state._write(
        "rf-cloud",
        {
            "cluster_name": "rf-cloud",
            "owner_run": "kept-run",
            "provider": "aws",
            "kept": True,
            "holder": None,
        },
    )
    with running(backend_for(compose_config(*section))) as joined:
        assert joined.joined and seen["no_restart"] is True
        assert owner.owner_of(seen["up"]) == "kept-run" and seen["heads"][-1] == "kept-run"
    assert seen["terminated"] == [run]  # a joined cluster is never torn down


def test_down_of_a_spark_cluster_it_has_nothing_to_stop_by_is_not_called_torn_down(cache):
    """A spark record that names no Ray-on-Spark temp dir (hand-edited, or another version's):
    `down` stops nothing and says so; the record stays."""
    from rayflow.errors import ClusterError
    from rayflow.orchestrator import clusters

    kept.keep(
        kept.KeptCluster(
            backend="spark",
            name="rf-spark",
            owner_run="rf-spark-run",
            section={"name": "spark"},
            where={"temp_dir": "/tmp/not-ray-on-spark"},
        )
    )
    with pytest.raises(ClusterError) as refused:
        clusters.down("rf-spark", force=True)
    assert str(refused.value).startswith(
        "spark cluster rf-spark: its record names no Ray-on-Spark temp dir (/tmp/not-ray-on-spark): "
        "nothing stopped"
    ) and "rf-spark is not torn down, its record is kept" in str(refused.value)
    assert [r.name for r in kept.records()] == ["rf-spark"]
