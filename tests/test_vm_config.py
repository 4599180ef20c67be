"""backend=vm offline: config -> Ray cluster YAML, checked by Ray's own validation.

Nothing is started: every provider's rendering goes through Ray's prepare_config and
validate_config (ray-schema.json); fake_multinode's goes to Ray's FakeMultiNodeProvider and
the v1 autoscaler's ResourceDemandScheduler, which are built here without a cluster.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from rayflow.backends.vm import checks, commands, defaults, providers
from rayflow.backends.vm import config as vm_config
from rayflow.backends.vm.rules import REMOVED
from rayflow.errors import ConfigError
from rayflow.orchestrator.compose import compose_config
from rayflow.runtime import requirements as deps
from rayflow.security.redaction import redact
from tests.harness import REPO

RAY_VERSION = version("ray")
PYTHON_VERSION = "3.11"
PROVIDERS = ("fake_multinode", "local", "aws", "gcp")
SECRET = "rayflow-test-token-3f9c1d77e2b84a05"


def section(*overrides: str):
    return compose_config("backend=vm", *overrides).backend


@pytest.fixture
def ssh_tools(tmp_path, monkeypatch):
    """`ssh` and `rsync` on PATH, whether or not this machine has them (check() only looks)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ssh", "rsync"):
        path = bin_dir / tool
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "id_test"
    path.write_text(
        "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n-----END OPENSSH PRIVATE KEY-----\n"
    )
    path.chmod(0o600)
    return path


@pytest.fixture
def token_file(tmp_path) -> Path:
    path = tmp_path / "auth_token"
    path.write_text(SECRET)
    return path


def filled(provider: str, key_file: Path) -> list[str]:
    """Overrides that fill in what only a user can for `provider`."""
    return {
        "local": [
            "backend.head_ip=10.213.0.11",
            "backend.worker_ips=[10.213.0.12,10.213.0.13]",
            "backend.ssh_user=rayhost",
            f"backend.ssh_private_key={key_file}",
        ],
        "gcp": ["backend.project_id=rayflow-test-123456"],
    }.get(provider, [])


def start_commands(config: dict) -> list[str]:
    return [
        c
        for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"]
        if "ray start" in c
    ]


# --- every provider, CPU and GPU, passes Ray's validation --------------------------------


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_rendered_config_passes_rays_validation(provider, gpu, ssh_tools, key_file, token_file):
    b = section(f"backend.provider={provider}", *filled(provider, key_file))
    checks.check(b, gpu)
    assert checks.placeholders(b) == []
    checks.require_filled(b)
    config = vm_config.render(b, gpu, "token", RAY_VERSION, PYTHON_VERSION, str(token_file))
    vm_config.validate(config)
    if provider != "local":
        types = config["available_node_types"]
        assert set(types) == {
            config["head_node_type"],
            *(defaults.WORKER_TYPES[k] for k in (("cpu", "gpu") if gpu else ("cpu",))),
        }
        assert types[config["head_node_type"]]["resources"] == {"CPU": 0, "GPU": 0}
        if gpu:
            assert types["rayflow_worker_gpu"]["resources"]["GPU"] == 1
    else:
        # Ray refuses node types for on-premise clusters
        assert "available_node_types" not in config
        assert config["provider"]["worker_ips"] == ["10.213.0.12", "10.213.0.13"]
        assert config["auth"] == {"ssh_user": "rayhost", "ssh_private_key": str(key_file)}


@pytest.mark.parametrize("provider", ["local", "gcp"])
def test_defaults_alone_render_with_placeholders_and_pass_rays_validation(provider, ssh_tools):
    b = section(f"backend.provider={provider}")
    checks.check(b, gpu=False)  # placeholders are not errors: a dry run renders them
    keys = checks.placeholders(b)
    assert keys == (
        ["backend.project_id"]
        if provider == "gcp"
        else [
            "backend.head_ip",
            "backend.worker_ips",
            "backend.ssh_user",
            "backend.ssh_private_key",
        ]
    )
    config = vm_config.render(b, False, "token", RAY_VERSION, PYTHON_VERSION, None)
    text = yaml.safe_dump(config)
    for key in keys:
        assert f"<fill in: {key}>" in text
    vm_config.validate(config)  # Ray's schema takes the placeholder strings
    note = checks.placeholder_note(b)
    assert "\n" not in note and all(key in note for key in keys)
    with pytest.raises(ConfigError) as raised:
        checks.require_filled(b)
    assert raised.value.key == keys[0]


def test_aws_defaults_need_nothing_filled_in():
    b = section("backend.provider=aws")
    assert checks.placeholders(b) == [] and checks.placeholder_note(b) is None
    config = vm_config.render(b, True, "token", RAY_VERSION, PYTHON_VERSION, None)
    vm_config.validate(config)
    assert config["provider"]["region"] == "us-west-2"
    assert (
        config["available_node_types"]["rayflow_worker_gpu"]["node_config"]["InstanceType"]
        == "g4dn.xlarge"
    )


def test_gcp_gpu_type_has_a_t4_and_an_overridable_machine_type():
    config = vm_config.render(
        section("backend.provider=gcp", "backend.project_id=p-1"), True, "token"
    )
    gpu = config["available_node_types"]["rayflow_worker_gpu"]["node_config"]
    assert gpu["machineType"] == "n1-standard-4"
    assert gpu["guestAccelerators"] == [
        {"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}
    ]
    config = vm_config.render(
        section(
            "backend.provider=gcp",
            "backend.project_id=p-1",
            "backend.worker.gpu.instance_type=n1-standard-8",
            "backend.worker.gpu.accelerator_type=nvidia-l4",
            "backend.worker.gpu.num_gpus=2",
        ),
        True,
        "token",
    )
    gpu = config["available_node_types"]["rayflow_worker_gpu"]
    assert gpu["node_config"]["machineType"] == "n1-standard-8" and gpu["resources"]["GPU"] == 2
    assert gpu["node_config"]["guestAccelerators"] == [
        {"acceleratorType": "nvidia-l4", "acceleratorCount": 2}
    ]
    vm_config.validate(config)


def test_a_spot_worker_type_asks_each_cloud_for_spot_capacity_and_the_head_stays_on_demand():
    config = vm_config.render(
        section("backend.provider=aws", "backend.worker.cpu.spot=true"), True, "token"
    )
    types = config["available_node_types"]
    assert types["rayflow_worker_cpu"]["node_config"]["InstanceMarketOptions"] == {
        "MarketType": "spot"
    }
    assert "InstanceMarketOptions" not in types["rayflow_worker_gpu"]["node_config"]
    assert "InstanceMarketOptions" not in types["rayflow_head"]["node_config"]
    vm_config.validate(config)
    config = vm_config.render(
        section("backend.provider=gcp", "backend.project_id=p-1", "backend.worker.gpu.spot=true"),
        True,
        "token",
    )
    gpu = config["available_node_types"]["rayflow_worker_gpu"]["node_config"]
    assert gpu["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",  # a GPU VM cannot live-migrate, spot or not
    }
    assert "scheduling" not in config["available_node_types"]["rayflow_head"]["node_config"]
    vm_config.validate(config)


def test_gcp_zone_outside_the_default_region_is_a_placeholder():
    b = section("backend.provider=gcp", "backend.project_id=p-1", "backend.region=europe-west4")
    assert checks.placeholders(b) == ["backend.availability_zone"]
    b = section(
        "backend.provider=gcp", "backend.project_id=p-1", "backend.availability_zone=europe-west4-a"
    )
    config = vm_config.render(b, False, "token")
    assert config["provider"]["region"] == "europe-west4" and checks.placeholders(b) == []


# --- fake_multinode: what Ray's fake provider and v1 autoscaler make of it -----------------


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_fake_multinode_config_is_accepted_by_rays_fake_provider_and_scheduler(gpu, monkeypatch):
    from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
    from ray.autoscaler._private.providers import _get_node_provider_cls
    from ray.autoscaler._private.resource_demand_scheduler import ResourceDemandScheduler
    from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

    config = vm_config.render(section(), gpu, "token", RAY_VERSION, PYTHON_VERSION, None)
    vm_config.validate(config)
    assert config["provider"] == {
        "type": "fake_multinode",
        "use_node_id_as_ip": True,
        "disable_node_updaters": True,
        "disable_launch_config_check": True,
    }
    assert config["head_start_ray_commands"] == [] and config["setup_commands"] == []

    monkeypatch.setenv("RAY_FAKE_CLUSTER", "1")  # what the head's monitor runs under
    provider = _get_node_provider_cls(config["provider"])(
        config["provider"], config["cluster_name"]
    )
    head = provider.non_terminated_nodes({})
    # the fake head's type
    assert provider.node_tags(head[0])[TAG_RAY_USER_NODE_TYPE] == config["head_node_type"]

    scheduler = ResourceDemandScheduler(
        provider,
        config["available_node_types"],
        config["max_workers"],
        config["head_node_type"],
        config["upscaling_speed"],
    )
    head_resources = {
        head[0]: config["available_node_types"][config["head_node_type"]]["resources"]
    }

    def launches(demands):
        to_launch, _ = scheduler.get_nodes_to_launch(
            head, {}, demands, {}, [], head_resources, [], NodeAvailabilitySummary({})
        )
        return to_launch

    runs_on = "rayflow_worker_gpu" if gpu else "rayflow_worker_cpu"
    assert launches([]) == {runs_on: 1}  # min_worker_nodes of the type the run uses
    assert launches([{"CPU": 1, "GPU": 1}] * 2) == (
        {"rayflow_worker_gpu": 2} if gpu else {runs_on: 1}
    )
    assert sum(launches([{"CPU": 1}] * 8).values()) == 2  # max_worker_nodes
    assert commands.head_start_args(section()) == ["--num-cpus=0", "--num-gpus=0"]


def test_fake_multinode_needs_rays_example_yaml_for_prepare_config():
    """Why validate() skips prepare_config for fake_multinode: Ray's defaults file for it is
    not in the wheel, so rayflow writes the whole config itself."""
    from ray.autoscaler._private.util import prepare_config

    with pytest.raises(FileNotFoundError, match="example.yaml"):
        prepare_config(vm_config.render(section(), False, "token"))


# --- what every rendering promises ---------------------------------------------------------


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_cloud_setup_pins_this_ray_and_the_runtime_dependencies(provider):
    from ray.autoscaler._private.util import prepare_config

    config = vm_config.render(
        section(f"backend.provider={provider}", "backend.project_id=p-1"),
        True,
        "token",
        RAY_VERSION,
        PYTHON_VERSION,
        None,
    )
    install = [c for c in config["setup_commands"] if "pip install" in c]
    assert len(install) == 1 and f'pip install -U "ray[default,tune]=={RAY_VERSION}"' in install[0]
    for package in deps.RUNTIME_PACKAGES:
        assert re.search(rf'"{package}==[0-9][^"+]*"', install[0]), package
    prepared = prepare_config(config)  # Ray merges setup_commands into head/worker setup
    for key in ("head_setup_commands", "worker_setup_commands"):
        assert install[0] in prepared[key]
    text = yaml.safe_dump(prepared)
    for nightly in ("ray-wheels", "dev0", "nightly", "latest/ray-"):
        assert nightly not in text
    assert config["metadata"]["rayflow"]["ray_version"] == RAY_VERSION
    assert config["metadata"]["rayflow"]["python_version"] == PYTHON_VERSION


def test_local_setup_checks_this_ray_version_and_installs_nothing(ssh_tools, key_file):
    config = vm_config.render(
        section("backend.provider=local", *filled("local", key_file)), False, "token", RAY_VERSION
    )
    assert (
        len(config["setup_commands"]) == 1 and f"= {RAY_VERSION} ||" in config["setup_commands"][0]
    )
    assert not any('pip install -U "ray' in c and "||" not in c for c in config["setup_commands"])


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_stopped_nodes_are_not_cached_unless_asked(provider):
    b = section(f"backend.provider={provider}", "backend.project_id=p-1")
    assert vm_config.render(b, False, "token")["provider"]["cache_stopped_nodes"] is False
    b = section(
        f"backend.provider={provider}", "backend.project_id=p-1", "backend.cache_stopped_nodes=true"
    )
    assert vm_config.render(b, False, "token")["provider"]["cache_stopped_nodes"] is True


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_resources_are_whole_numbers(provider, gpu):
    config = vm_config.render(
        section(f"backend.provider={provider}", "backend.worker.cpu.memory=4000000000"),
        gpu,
        "token",
    )
    for node_type in config.get("available_node_types", {}).values():
        assert all(type(v) is int for v in node_type["resources"].values()), node_type
        assert type(node_type["min_workers"]) is int and type(node_type["max_workers"]) is int
    assert type(config["max_workers"]) is int


@pytest.mark.parametrize("auth_mode", ["token", "disabled"])
@pytest.mark.parametrize("provider", ["local", "aws", "gcp"])
def test_every_ray_start_exports_the_auth_mode(provider, auth_mode):
    config = vm_config.render(section(f"backend.provider={provider}"), True, auth_mode)
    commands = start_commands(config)
    assert len(commands) == 2  # head and workers
    for command in commands:
        export = command.find(f"export RAY_AUTH_MODE={auth_mode};")
        assert 0 <= export < command.find("ray start"), command
    head = config["head_start_ray_commands"][-1]
    assert "--num-cpus=0" in head and "--num-gpus=0" in head
    # the head's loopback: rayflow reaches it through an SSH tunnel
    assert "--dashboard-host=127.0.0.1" in head


def test_fake_multinode_gets_the_auth_mode_from_the_launcher(token_file):
    env = vm_config.launcher_env(section(), "token", str(token_file))
    assert env == {
        "RAY_AUTH_MODE": "token",
        "RAY_FAKE_CLUSTER": "1",
        "RAY_enable_autoscaler_v2": "0",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
    }


def test_local_provider_runs_autoscaler_v1_and_names_node_addresses(ssh_tools, key_file):
    b = section("backend.provider=local", *filled("local", key_file))
    assert vm_config.launcher_env(b, "token")["RAY_UP_enable_autoscaler_v2"] == "0"
    config = vm_config.render(b, False, "token")
    assert config["metadata"]["rayflow"]["autoscaler"] == "v1"
    head, worker = start_commands(config)
    assert "--node-ip-address=10.213.0.11" in head
    assert "--node-ip-address=$(hostname -I | cut -d' ' -f1)" in worker
    assert "--num-cpus=2" in worker  # backend.worker.cpu.num_cpus; null leaves it to Ray
    config = vm_config.render(
        section("backend.provider=local", "backend.worker.cpu.num_cpus=null"), False, "token"
    )
    assert "--num-cpus" not in start_commands(config)[1]


@pytest.mark.parametrize("provider", ["local", "aws", "gcp"])
def test_token_is_mounted_by_path_and_never_rendered(provider, token_file):
    b = section(f"backend.provider={provider}")
    config = vm_config.render(b, True, "token", RAY_VERSION, PYTHON_VERSION, str(token_file))
    assert config["file_mounts"] == {"~/.ray/auth_token": str(token_file)}
    vm_config.validate(config)
    assert SECRET not in yaml.safe_dump(config)
    dry_run = yaml.safe_dump(redact(config))  # what the lead prints for dry_run=true
    assert SECRET not in dry_run
    assert ("<fill in:" in dry_run) == (provider != "aws")  # placeholders stay visible
    assert (
        vm_config.render(b, True, "disabled", RAY_VERSION, PYTHON_VERSION, str(token_file))[
            "file_mounts"
        ]
        == {}
    )


def test_overrides_are_deep_merged_last_and_null_deletes():
    b = section(
        "backend.provider=aws",
        "+backend.overrides.provider.use_internal_ips=true",
        "+backend.overrides.available_node_types.rayflow_worker_cpu.node_config.InstanceMarketOptions.MarketType=spot",
        "+backend.overrides.head_setup_commands=null",
    )
    config = vm_config.render(b, False, "token")
    assert (
        config["provider"]["use_internal_ips"] is True
        and config["provider"]["region"] == "us-west-2"
    )
    node_config = config["available_node_types"]["rayflow_worker_cpu"]["node_config"]
    assert node_config == {
        "InstanceType": "m5.large",
        "InstanceMarketOptions": {"MarketType": "spot"},
    }
    assert "head_setup_commands" not in config
    vm_config.validate(config)
    bad = vm_config.render(section("+backend.overrides.bogus_key=1"), False, "token")
    with pytest.raises(ConfigError) as raised:
        vm_config.validate(bad)
    assert (
        raised.value.key == "backend"
        and "bogus_key" in str(raised.value)
        and "\n" not in str(raised.value)
    )


def test_rays_refusal_is_one_line_naming_the_place():
    config = vm_config.render(section("backend.provider=aws"), False, "token")
    config["available_node_types"]["rayflow_worker_cpu"]["resources"]["CPU"] = 1.5
    with pytest.raises(ConfigError) as raised:
        vm_config.validate(config)
    assert "available_node_types.rayflow_worker_cpu.resources.CPU" in str(raised.value)
    local = vm_config.render(section("backend.provider=local"), False, "token")
    local["available_node_types"] = {"x": {"resources": {}, "node_config": {}}}
    with pytest.raises(ConfigError, match="not supported for on-premise"):
        vm_config.validate(local)


# --- refused before anything starts, naming the key --------------------------------------


@pytest.mark.parametrize("key", sorted(REMOVED))
def test_keys_of_outdated_guides_name_their_replacement(key):
    with pytest.raises(ConfigError) as raised:
        checks.check(section(f"+backend.{key}=2"), gpu=False)
    assert raised.value.key == f"backend.{key}"
    assert (
        "outdated" in str(raised.value)
        and "use " in str(raised.value)
        and "\n" not in str(raised.value)
    )


def test_seed_004_keys_name_what_replaced_them():
    with pytest.raises(ConfigError, match="backend.min_worker_nodes"):
        checks.check(section("backend.provider=aws", "+backend.initial_workers=2"), gpu=False)
    with pytest.raises(ConfigError, match="backend.worker.cpu.instance_type"):
        checks.check(section("backend.provider=aws", "+backend.instance_type=m5.large"), gpu=False)
    with pytest.raises(ConfigError, match="GOOGLE_APPLICATION_CREDENTIALS"):
        checks.check(
            section("backend.provider=gcp", "+backend.gcp_service_account_key=/k.json"), gpu=False
        )


def test_unknown_keys_point_to_overrides():
    for override, key in (
        ("+backend.tags.Name=ray", "backend.tags"),
        ("+backend.worker.tpu.num_cpus=1", "backend.worker.tpu"),
        ("+backend.worker.cpu.cores=1", "backend.worker.cpu.cores"),
    ):
        with pytest.raises(ConfigError) as raised:
            checks.check(section(override), gpu=False)
        assert raised.value.key == key


@pytest.mark.parametrize(
    "overrides, gpu, key",
    [
        (["backend.provider=azure"], False, "backend.provider"),
        (
            ["backend.min_worker_nodes=3", "backend.max_worker_nodes=2"],
            False,
            "backend.min_worker_nodes",
        ),
        (
            ["backend.worker.cpu.min_workers=3", "backend.worker.cpu.max_workers=1"],
            False,
            "backend.worker.cpu.min_workers",
        ),
        (
            ["backend.worker.gpu.min_workers=2", "backend.worker.gpu.max_workers=1"],
            True,
            "backend.worker.gpu.min_workers",
        ),
        (
            ["backend.worker.cpu.min_workers=2", "backend.worker.gpu.min_workers=1"],
            True,
            "backend.max_worker_nodes",
        ),
        (
            ["backend.min_worker_nodes=2", "backend.worker.cpu.min_workers=1"],
            False,
            "backend.min_worker_nodes",
        ),
        (["backend.max_worker_nodes=-1"], False, "backend.max_worker_nodes"),
        (["backend.num_cpus_head_node=-1"], False, "backend.num_cpus_head_node"),
        (["backend.num_gpus_head_node=0.5"], False, "backend.num_gpus_head_node"),
        (["backend.worker.cpu.num_cpus=-2"], False, "backend.worker.cpu.num_cpus"),
        (["backend.worker.cpu.num_cpus=1.5"], False, "backend.worker.cpu.num_cpus"),
        (
            ["backend.worker.cpu.num_cpus=null"],
            False,
            "backend.worker.cpu.num_cpus",
        ),  # fake_multinode: nothing to detect
        (["backend.worker.gpu.num_gpus=0.5"], True, "backend.worker.gpu.num_gpus"),
        (["backend.worker.gpu.num_gpus=0"], True, "backend.worker.gpu.num_gpus"),
        (["backend.worker.cpu.memory=0"], False, "backend.worker.cpu.memory"),
        (
            ["backend.worker.cpu.object_store_memory=1000"],
            False,
            "backend.worker.cpu.object_store_memory",
        ),
        (["backend.autoscale_upscaling_speed=0"], False, "backend.autoscale_upscaling_speed"),
        (["backend.autoscale_upscaling_speed=-1"], False, "backend.autoscale_upscaling_speed"),
        (
            ["backend.autoscale_idle_timeout_minutes=-1"],
            False,
            "backend.autoscale_idle_timeout_minutes",
        ),
        (["backend.start_timeout_s=0"], False, "backend.start_timeout_s"),
        (["backend.keep_cluster=maybe"], False, "backend.keep_cluster"),
        (["backend.cluster_name=My_Cluster"], False, "backend.cluster_name"),
        (["backend.ami=ami-123"], False, "backend.ami"),  # fake_multinode has no AMI
        (["backend.provider=gcp", "backend.ami=ami-123"], False, "backend.ami"),
        (["backend.cache_stopped_nodes=true"], False, "backend.cache_stopped_nodes"),
        (
            [
                "backend.provider=aws",
                "backend.region=us-east-1",
                "backend.availability_zone=us-west-2a",
            ],
            False,
            "backend.availability_zone",
        ),
        (
            ["backend.provider=local", "backend.worker.cpu.instance_type=m5.large"],
            False,
            "backend.worker.cpu.instance_type",
        ),
        (
            ["backend.provider=local", "backend.worker.cpu.max_workers=3"],
            False,
            "backend.worker.cpu.max_workers",
        ),
        (
            [
                "backend.provider=local",
                "backend.worker_ips=[10.0.0.2]",
                "backend.max_worker_nodes=2",
            ],
            False,
            "backend.max_worker_nodes",
        ),
        (
            ["backend.provider=local", "backend.worker_ips=[10.0.0.2,10.0.0.2]"],
            False,
            "backend.worker_ips",
        ),
        (["backend.provider=local", "backend.worker_ips=10.0.0.2"], False, "backend.worker_ips"),
        (
            ["backend.provider=local", "backend.ssh_private_key=/nonexistent/id_rsa"],
            False,
            "backend.ssh_private_key",
        ),
        (["backend.provider=local", "backend.ssh_private_key=/"], False, "backend.ssh_private_key"),
        (
            ["backend.provider=aws", "backend.ssh_private_key=/nonexistent/id_rsa"],
            False,
            "backend.ssh_private_key",
        ),
        (
            [
                "backend.provider=gcp",
                "backend.region=us-west1",
                "backend.availability_zone=us-west10-a",
            ],
            False,
            "backend.availability_zone",
        ),
        (
            ["backend.min_worker_nodes=2", "backend.worker.cpu.max_workers=1"],
            False,
            "backend.worker.cpu.max_workers",
        ),
        (["backend.worker.cpu.spot=true"], False, "backend.worker.cpu.spot"),
        (["backend.provider=aws", "backend.region=us-weast-2"], False, "backend.region"),
    ],
)
def test_bad_values_name_their_key(overrides, gpu, key, ssh_tools):
    with pytest.raises(ConfigError) as raised:
        checks.check(section(*overrides), gpu)
    assert raised.value.key == key
    assert "\n" not in str(raised.value)


def test_the_ssh_key_path_stays_out_of_the_message(ssh_tools):
    with pytest.raises(ConfigError) as raised:
        checks.check(
            section(
                "backend.provider=local", "backend.ssh_private_key=/nonexistent/secret_dir/id_rsa"
            ),
            gpu=False,
        )
    assert "secret_dir" not in str(raised.value)


def test_an_exposed_dashboard_without_token_auth_is_refused():
    b = section("backend.dashboard_host=0.0.0.0")
    checks.check(b, gpu=False, auth_mode="token")
    with pytest.raises(ConfigError) as raised:
        checks.check(b, gpu=False, auth_mode="disabled")
    assert raised.value.key == "ray_auth_mode"  # issue 43: auth off is named first, everywhere


@pytest.mark.parametrize("provider", ["local", "aws"])
@pytest.mark.parametrize("present, missing", [((), "ssh"), (("ssh",), "rsync")])
def test_ray_up_needs_ssh_and_rsync_here(
    provider, present, missing, tmp_path, monkeypatch, key_file
):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in present:
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(ConfigError) as raised:
        checks.check(
            section(f"backend.provider={provider}", *filled(provider, key_file)), gpu=False
        )
    assert raised.value.key == "backend.provider" and f"`{missing}`" in str(raised.value)
    checks.check(section(), gpu=False)  # fake_multinode starts its nodes here: no ssh


def test_the_schema_takes_the_vm_booleans():
    from rayflow.orchestrator.compose import validate

    validate(compose_config("backend=vm"))
    with pytest.raises(ConfigError) as raised:
        validate(compose_config("backend=vm", "backend.cache_stopped_nodes=maybe"))
    assert raised.value.key == "backend.cache_stopped_nodes"


# --- the starting points users copy: backends/vm/*.yaml ------------------------------------


def fill_placeholders(text: str) -> str:
    values = {
        "backend.project_id": "rayflow-test-123456",
        "backend.head_ip": "10.213.0.11",
        "backend.worker_ips": "10.213.0.12",
        "backend.ssh_user": "rayhost",
        "backend.ssh_private_key": "~/.ssh/id_test",
    }
    return re.sub(r"<fill in: (backend\.[^>]+)>", lambda m: values[m.group(1)], text)


@pytest.mark.parametrize("name", ["aws", "gcp", "local"])
def test_starting_points_pass_rays_validation_once_filled_in(name):
    path = REPO / "backends" / "vm" / f"{name}.yaml"
    text = path.read_text()
    head = "\n".join(text.splitlines()[:12])
    assert "Fill in" in head and "ray up" in head  # says at the top what to fill in
    expected = [k for k in providers.get(name).user_keys]
    assert sorted(set(re.findall(r"<fill in: (backend\.[^>]+)>", text))) == sorted(
        f"backend.{k}" for k in expected
    )
    config = yaml.safe_load(fill_placeholders(text))
    vm_config.validate(config)
    assert config["provider"]["type"] == name
    assert config["file_mounts"] == {"~/.ray/auth_token": "~/.ray/auth_token"}
    for command in start_commands(config):
        assert command.index("export RAY_AUTH_MODE=token;") < command.index("ray start")
    setup = " ".join(config["setup_commands"])
    assert f"ray[default,tune]=={RAY_VERSION}" in setup and "ray-wheels" not in text
    rendered = vm_config.render(
        section(f"backend.provider={name}"),
        True,
        "token",
        RAY_VERSION,
        token_file="~/.ray/auth_token",
    )

    # what rayflow renders today: the same commands and packages; the starting points pin the
    # versions of the machine they were written on, which a newer release of a dependency (a
    # new filelock here) moves on from, so only Ray's own pin must match
    def unpinned(commands):
        return [re.sub(r'"([A-Za-z0-9_.\[\],-]+)==[^"]+"', r'"\1"', c) for c in commands]

    assert unpinned(config["setup_commands"]) == unpinned(rendered["setup_commands"])
    if name != "local":
        assert config["provider"]["cache_stopped_nodes"] is False
        assert set(config["available_node_types"]) == set(rendered["available_node_types"])
        assert config["head_node_type"] == rendered["head_node_type"]


def test_a_dashboard_that_never_answers_is_a_cluster_error_naming_the_key():
    """A failure the user can act on is rayflow's ClusterError (the CLI's one line, exit 1), not
    a RuntimeError with a traceback."""
    import socket

    from rayflow.backends.vm.start import wait_for_dashboard
    from rayflow.errors import ClusterError

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(
        ClusterError, match=r"did not answer within 0.5 s \(backend.start_timeout_s\)"
    ):
        wait_for_dashboard(f"http://127.0.0.1:{port}", 0.5, "backend=vm")


def test_a_head_vm_whose_create_call_ends_during_the_search_is_terminated_too(monkeypatch):
    """Ctrl-C or SIGTERM while Ray's launcher is inside its create call (cloud_up): the teardown's
    search lists the cluster's VMs while the call is in flight. When the call returns just after a
    listing came back empty, its VM must still be found (seen once in test_vm_aws under load: the
    head VM of a stopped start left running)."""
    from rayflow.backends.vm import owner

    cloud = {"vms": set(), "creating": True}

    class Provider:
        def non_terminated_nodes(self, tags):
            listed = sorted(cloud["vms"])
            if cloud["creating"]:  # the create call returns as this listing comes back
                cloud["vms"].add("i-head")
                cloud["creating"] = False
            return listed

        def terminate_nodes(self, ids):
            cloud["vms"] -= set(ids)

    monkeypatch.setattr(owner, "provider_of", lambda config, **_: Provider())
    monkeypatch.setattr(owner, "POLL_S", 0.0)
    config = {"cluster_name": "c", "provider": {"type": "aws"}}
    owner.terminate(config, "run-1", stop_cached=False, busy=lambda: cloud["creating"], settle_s=5)
    assert cloud["vms"] == set()
