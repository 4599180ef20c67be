"""backend=vm backend.cluster_yaml: the user's own Ray cluster YAML, started as it is.

Offline (no cluster): Ray's shipped provider defaults through cluster_yaml, the precedence of
rayflow's keys over the file, what rayflow adds (idempotently), the refusals, and the round trip
of a dry run's document fed back as cluster_yaml. Started for real: tests/test_vm.py's shared
fake_multinode cluster comes from a dry run's output fed back as cluster_yaml, and the SSH hosts'
run of a hand-written file is in test_vm_ssh.py.
"""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path

import pytest
import yaml

from rayflow.backends import backend_for
from rayflow.backends.vm import user_file
from rayflow.backends.vm.commands import pin_command
from rayflow.errors import ConfigError
from rayflow.orchestrator.compose import compose_config
from rayflow.security.auth import NODE_TOKEN_MODES

# Ray's own provider defaults, beside ray-schema.json
RAY_DEFAULTS = resources.files("ray.autoscaler")
SECRET = "rayflow-test-token-0c5e2f9a11b34d6e"


@pytest.fixture(autouse=True)
def token(tmp_path, monkeypatch) -> Path:
    """A token file of this test's own (its path is what the cluster YAML mounts)."""
    path = tmp_path / "auth_token"
    path.write_text(SECRET)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    return path


@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "id_test"
    path.write_text("not a real key\n")
    path.chmod(0o600)
    return path


def backend(*overrides: str):
    cfg = compose_config("backend=vm", *overrides)
    if "compute=gpu" in overrides:  # no GPU here: the device compute=gpu would resolve to
        cfg.backend.compute_device = "cuda"
    return backend_for(cfg)


def write(tmp_path: Path, doc, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def from_file(path: Path, *overrides: str) -> dict:
    b = backend(f"backend.cluster_yaml={path}", *overrides)
    b.check()
    return yaml.safe_load(b.render().text)


def refused(path: Path, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as raised:
        backend(f"backend.cluster_yaml={path}", *overrides).check()
    assert raised.value.key == "backend.cluster_yaml" and str(path) in str(raised.value)
    assert "\n" not in str(raised.value)
    return raised.value


def ray_default(provider: str) -> dict:
    return yaml.safe_load(RAY_DEFAULTS.joinpath(provider, "defaults.yaml").read_text())


def filled_local(key_file: Path) -> dict:
    doc = ray_default("local")  # ships without a provider: its hosts are the user's to name
    doc["provider"] = {"type": "local", "head_ip": "10.213.0.11", "worker_ips": ["10.213.0.12"]}
    doc["auth"] = {"ssh_user": "rayhost", "ssh_private_key": str(key_file)}
    return doc


# --- Ray's shipped provider defaults --------------------------------------------------------


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure", "local"])
def test_rays_provider_defaults_render_validate_and_round_trip(provider, tmp_path, key_file, token):
    doc = {
        "local": lambda: filled_local(key_file),
        "gcp": lambda: {
            **ray_default("gcp"),
            "provider": {**ray_default("gcp")["provider"], "project_id": "rayflow-test-123456"},
        },
    }.get(provider, lambda: ray_default(provider))()
    path = (
        write(tmp_path, doc)
        if provider in ("local", "gcp")
        else Path(str(RAY_DEFAULTS.joinpath(provider, "defaults.yaml")))
    )
    config = from_file(path)
    # Ray's prepare_config, validate_config, check_legacy_fields
    user_file.check_final(config, str(path), provider)
    assert (
        config["provider"]["type"] == provider
        and config["metadata"]["rayflow"]["provider"] == provider
    )
    assert config["file_mounts"]["~/.ray/auth_token"] == str(
        token
    ) and SECRET not in yaml.safe_dump(config)
    starts = [
        c
        for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"]
        if "ray start" in c
    ]
    assert len(starts) == 2 and all(c.startswith("export RAY_AUTH_MODE=token; ") for c in starts)
    # the head's loopback, reached through an SSH tunnel
    assert "--dashboard-host=127.0.0.1" in starts[0]
    # the file's own setup (local's: none) is kept, with a note, after the line that makes the synced token private
    assert config["setup_commands"] == [NODE_TOKEN_MODES, *doc["setup_commands"]]
    again = write(tmp_path, yaml.safe_dump(config, sort_keys=False), "again.yaml")
    assert from_file(again) == config  # idempotent: rayflow's additions applied twice are the same


def test_the_untouched_local_and_gcp_defaults_are_refused_naming_what_to_fill_in():
    local = refused(Path(str(RAY_DEFAULTS.joinpath("local", "defaults.yaml"))))
    assert ": provider: missing" in str(local)
    gcp = refused(Path(str(RAY_DEFAULTS.joinpath("gcp", "defaults.yaml"))))
    assert "provider.project_id: missing: fill in your GCP project id" in str(gcp)


@pytest.mark.parametrize(
    "provider, why",
    [
        ("spark", "use backend=spark"),
        ("vsphere", "rayflow starts aws, gcp, azure, local and fake_multinode"),
    ],
)
def test_providers_rayflow_does_not_launch_are_refused_in_one_line(provider, why):
    error = refused(Path(str(RAY_DEFAULTS.joinpath(provider, "defaults.yaml"))))
    assert f"provider.type: '{provider}' is not a provider rayflow launches" in str(
        error
    ) and why in str(error)


# --- the round trip: a dry run's document fed back --------------------------------------------


@pytest.mark.parametrize("case", ["fake_multinode", "local", "aws", "gcp"])
def test_a_dry_runs_document_fed_back_renders_the_same_document(case, tmp_path, key_file):
    from rayflow.orchestrator.cluster import spec_text

    overrides = {
        "fake_multinode": [],
        "aws": ["backend.provider=aws"],
        "gcp": ["backend.provider=gcp", "backend.project_id=p-123456"],
        "local": [
            "backend.provider=local",
            "backend.head_ip=10.213.0.11",
            "backend.worker_ips=[10.213.0.12]",
            "backend.max_worker_nodes=1",
            "backend.ssh_user=rayhost",
            f"backend.ssh_private_key={key_file}",
        ],
    }[case]
    rendered = backend(*overrides)
    rendered.check()
    # what dry_run=true prints: the document, secret-named values masked
    printed = spec_text(rendered)
    assert yaml.safe_load(printed) == yaml.safe_load(
        yaml.safe_dump(rayflow_masked(yaml.safe_load(rendered.render().text)))
    )
    path = write(tmp_path, printed)
    # the masked key's path, given back
    again = [f"backend.ssh_private_key={key_file}"] if case == "local" else []
    fed_back = backend(f"backend.cluster_yaml={path}", *again)
    fed_back.check()
    # the very document rayflow writes for `ray up`
    assert fed_back.render().text == rendered.render().text
    assert spec_text(fed_back) == printed


def rayflow_masked(doc: dict) -> dict:
    from rayflow.security.redaction import redact

    return redact(doc)


def test_the_dry_run_prints_exactly_the_cluster_yaml(rayflow):
    out = rayflow.run("backend=vm", "tracking=none", "dry_run=true")
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    assert (
        config["provider"]["type"] == "fake_multinode"
        and "cluster" not in config
        and "backend" not in config
    )
    assert (
        "RAY_FAKE_CLUSTER=1" in out.stderr
        and "ray start --head --autoscaling-config=cluster.yaml" in out.stderr
    )
    path = write(rayflow.workdir, out.stdout)
    again = rayflow.run(
        "backend=vm", "tracking=none", "dry_run=true", f"backend.cluster_yaml={path}"
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout == out.stdout and "rayflow adds nothing" in again.stderr


# --- precedence: the file < rayflow's keys set < backend.overrides ---------------------------


def test_rayflow_keys_apply_over_the_file_only_where_set(tmp_path, key_file):
    path = write(tmp_path, filled_local(key_file) | {"max_workers": 1, "idle_timeout_minutes": 9})
    config = from_file(path)
    assert (
        config["max_workers"] == 1
        and config["idle_timeout_minutes"] == 9
        and config["cluster_name"] == "default"
    )
    # rayflow's default: not an override of the file
    config = from_file(path, "backend.max_worker_nodes=2")
    assert config["max_workers"] == 1
    config = from_file(
        path,
        "backend.max_worker_nodes=0",
        "backend.autoscale_idle_timeout_minutes=1",
        "backend.cluster_name=mine",
        "backend.min_worker_nodes=0",
        "+backend.overrides.idle_timeout_minutes=3",
    )
    assert (
        config["max_workers"],
        config["idle_timeout_minutes"],
        config["cluster_name"],
        config["min_workers"],
    ) == (0, 3, "mine", 0)


def test_min_worker_nodes_and_compute_gpu_choose_the_files_node_types(tmp_path):
    doc = ray_default("aws")
    doc["available_node_types"]["gpu_workers"] = {
        "resources": {"CPU": 4, "GPU": 1},
        "node_config": {"InstanceType": "g4dn.xlarge"},
    }
    path = write(tmp_path, doc)
    config = from_file(path, "backend.min_worker_nodes=0", "backend.max_worker_nodes=3")
    assert (
        config["available_node_types"]["ray.worker.default"]["min_workers"] == 0
        and config["max_workers"] == 3
    )
    config = from_file(
        path, "compute=gpu", "backend.min_worker_nodes=2", "backend.max_worker_nodes=3"
    )
    assert config["available_node_types"]["gpu_workers"]["min_workers"] == 2
    assert config["metadata"]["rayflow"]["node_types"] == {
        "cpu": "ray.worker.default",
        "gpu": "gpu_workers",
    }
    error = refused(Path(str(RAY_DEFAULTS.joinpath("aws", "defaults.yaml"))), "compute=gpu")
    assert "available_node_types: no node type has GPUs" in str(error)


def test_setup_is_pinned_where_the_file_has_none_and_noted_where_it_has(tmp_path):
    doc = ray_default("aws")
    del doc["setup_commands"]
    b = backend(f"backend.cluster_yaml={write(tmp_path, doc)}")
    config = yaml.safe_load(b.render().text)
    assert config["setup_commands"][-1] == pin_command(config["metadata"]["rayflow"]["ray_version"])
    assert "setup_commands pinning ray" in " ".join(b.render().notes)
    b = backend(f"backend.cluster_yaml={RAY_DEFAULTS.joinpath('aws', 'defaults.yaml')}")
    assert any("the file's own setup_commands are kept" in note for note in b.render().notes)


def test_auth_disabled_exports_it_and_keeps_the_dashboard_on_loopback(tmp_path):
    """What the file renders with auth off; its check refuses it (issue 43: a head on another
    machine listens beyond loopback whatever its dashboard does)."""
    cfg = compose_config(
        "backend=vm",
        f"backend.cluster_yaml={RAY_DEFAULTS.joinpath('aws', 'defaults.yaml')}",
        "ray_auth_mode=disabled",
    )
    with pytest.raises(ConfigError) as refused:
        backend_for(cfg).check()
    assert refused.value.key == "ray_auth_mode"
    config = yaml.safe_load(backend_for(cfg).render().text)
    head = config["head_start_ray_commands"][-1]
    assert (
        head.startswith("export RAY_AUTH_MODE=disabled; ") and "--dashboard-host=127.0.0.1" in head
    )
    assert "~/.ray/auth_token" not in config["file_mounts"]


# --- refused in one line: the file, the key in it --------------------------------------------


def bad_files(tmp_path: Path, key_file: Path) -> dict[str, tuple[Path, str]]:
    """{case: (file, what the one line says)}: Ray's schema, legacy keys, placeholders, and files
    that are not cluster YAMLs (also the rows of tests/test_bad_input.py)."""
    aws = ray_default("aws")
    local = filled_local(key_file)
    gcp = ray_default("gcp")
    return {
        "missing": (tmp_path / "nowhere.yaml", "no such file"),
        "not yaml": (write(tmp_path, "cluster_name: [unclosed\n", "bad.yaml"), "line 2: not YAML"),
        "not a mapping": (write(tmp_path, "- a\n- b\n", "list.yaml"), "a mapping of keys"),
        "schema": (
            write(tmp_path, aws | {"max_workers": "lots"}, "schema.yaml"),
            "max_workers: Ray refuses it: 'lots' is not of type 'integer'",
        ),
        "node type schema": (
            write(
                tmp_path,
                copy.deepcopy(aws)
                | {
                    "available_node_types": {
                        **aws["available_node_types"],
                        "ray.worker.default": {"resources": {"CPU": 1.5}, "node_config": {}},
                    }
                },
                "cpu.yaml",
            ),
            "available_node_types.ray.worker.default.resources.CPU: Ray refuses it",
        ),
        "legacy": (
            write(tmp_path, aws | {"head_node": {"InstanceType": "m5.large"}}, "legacy.yaml"),
            "head_node: is a key of outdated (Ray 1) cluster files; use available_node_types and head_node_type",
        ),
        "head placeholder": (
            write(
                tmp_path,
                local | {"provider": {**local["provider"], "head_ip": "YOUR_HEAD_NODE_HOSTNAME"}},
                "ph.yaml",
            ),
            "provider.head_ip: 'YOUR_HEAD_NODE_HOSTNAME' is a placeholder",
        ),
        "head null": (
            write(
                tmp_path, local | {"provider": {**local["provider"], "head_ip": None}}, "null.yaml"
            ),
            "provider.head_ip: missing",
        ),
        "worker placeholder": (
            write(
                tmp_path,
                local
                | {
                    "provider": {
                        **local["provider"],
                        "worker_ips": ["WORKER_NODE_1_HOSTNAME", "..."],
                    }
                },
                "workers.yaml",
            ),
            "provider.worker_ips[0]: 'WORKER_NODE_1_HOSTNAME' is a placeholder",
        ),
        "gcp project": (
            write(
                tmp_path,
                gcp | {"provider": {**gcp["provider"], "project_id": "<project_id>"}},
                "gcp.yaml",
            ),
            "provider.project_id: '<project_id>' is a placeholder",
        ),
        "gcp null string": (
            write(
                tmp_path,
                gcp | {"provider": {**gcp["provider"], "project_id": "null"}},
                "gcpnull.yaml",
            ),
            "provider.project_id: 'null' is a placeholder",
        ),
        "user placeholder": (
            write(tmp_path, aws | {"auth": {"ssh_user": "YOUR_USERNAME"}}, "user.yaml"),
            "auth.ssh_user: 'YOUR_USERNAME'",
        ),
        "unreadable key": (
            write(
                tmp_path,
                local | {"auth": {"ssh_user": "u", "ssh_private_key": "/nonexistent/id_rsa"}},
                "key.yaml",
            ),
            "auth.ssh_private_key: cannot be read",
        ),
    }


def test_bad_files_are_refused_in_one_line_naming_the_key_in_them(tmp_path, key_file):
    for case, (path, says) in bad_files(tmp_path, key_file).items():
        error = refused(path)
        assert says in str(error), (case, str(error))


def test_fake_multinode_files_need_its_head_type_and_no_node_updaters(tmp_path):
    b = backend()
    doc = yaml.safe_load(b.render().text)
    renamed = copy.deepcopy(doc)
    renamed["available_node_types"]["head"] = renamed["available_node_types"].pop(
        "ray.head.default"
    )
    renamed["head_node_type"] = "head"
    assert "head_node_type: must be 'ray.head.default'" in str(
        refused(write(tmp_path, renamed, "head.yaml"))
    )
    doc["provider"]["disable_node_updaters"] = False
    assert "provider.disable_node_updaters: must be true" in str(
        refused(write(tmp_path, doc, "updaters.yaml"))
    )


@pytest.mark.parametrize(
    "override, key",
    [
        ("backend.provider=aws", "backend.provider"),
        ("backend.head_ip=10.0.0.1", "backend.head_ip"),
        ("backend.worker.cpu.num_cpus=4", "backend.worker.cpu.num_cpus"),
        ("backend.region=us-east-1", "backend.region"),
    ],
)
def test_rendering_keys_beside_cluster_yaml_are_refused(override, key, tmp_path):
    from rayflow.orchestrator.compose import validate

    with pytest.raises(ConfigError) as raised:
        validate(
            compose_config("backend=vm", f"backend.cluster_yaml={tmp_path / 'c.yaml'}", override)
        )
    assert raised.value.key == key and "has no effect with backend.cluster_yaml" in str(
        raised.value
    )
