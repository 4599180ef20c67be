"""Every config file composes; bad input is refused before anything starts, naming the key."""

from __future__ import annotations

import pytest
import yaml
from omegaconf import OmegaConf

from rayflow.errors import ConfigError
from rayflow.orchestrator.compose import compose_config, one_line
from rayflow.orchestrator.preflight import plan_job, preflight
from rayflow.schema.values import safe_yaml
from rayflow.security.redaction import REDACTED, redact
from rayflow.security.secret_names import is_secret_name
from tests.harness import REPO

GROUPS = {
    group.name: sorted(p.stem for p in group.glob("*.yaml"))
    for group in sorted((REPO / "conf").iterdir())
    if group.is_dir() and not group.name.startswith("_")
}


@pytest.mark.parametrize(
    "override", [f"{group}={option}" for group, options in GROUPS.items() for option in options]
)
def test_every_config_file_composes_and_resolves(override):
    cfg = compose_config(
        override, "backend.address=127.0.0.1:6379" if override == "backend=attach" else "seed=0"
    )
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved[override.split("=")[0]] is not None


def test_each_config_says_which_command_uses_it():
    for path in (REPO / "conf").rglob("*.yaml"):
        head = "\n".join(path.read_text().splitlines()[:2])
        assert "python -m rayflow" in head, f"{path} does not say which command uses it"


def test_groups_are_the_contract():
    assert {"local", "attach"} <= set(GROUPS["backend"])
    assert {"cpu", "gpu", "auto"} == set(GROUPS["compute"])
    assert {"mlflow", "none"} == set(GROUPS["tracking"])
    assert {"cifar", "ddp", "ppo"} <= set(GROUPS["workload"])


def test_defaults(default_config):
    cfg = default_config
    assert cfg.backend.name == "local" and cfg.workload.name == "cifar"
    assert cfg.compute.device == "cpu" and cfg.tracking.enabled
    assert cfg.workload.metric == "val_loss" and cfg.workload.mode == "min"
    assert cfg.tracking.experiment == "cifar"
    plan_job(cfg, [])  # the defaults pass every check


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["workload.num_samples=0"], "workload.num_samples"),
        (["workload.max_epochs=-1"], "workload.max_epochs"),
        (
            ["workload.max_epochs=2", "workload.scheduler.grace_period=3"],
            "workload.scheduler.grace_period",
        ),
        (["workload.scheduler.reduction_factor=1"], "workload.scheduler.reduction_factor"),
        (["workload.search_space.lr.min=0.5"], "workload.search_space.lr"),
        (
            ["workload.search_space.l1.min=300", "workload.search_space.l1.max=200"],
            "workload.search_space.l1",
        ),
        (
            ["workload.search_space.l2.min=5", "workload.search_space.l2.max=7"],
            "workload.search_space.l2",
        ),
        (["workload.search_space.batch_size=[]"], "workload.search_space.batch_size"),
        (["workload.metric=accuracy"], "workload.metric"),
        (["workload.resources_per_trial.cpu=0"], "workload.resources_per_trial.cpu"),
        (["workload.resources_per_trial.gpu=1"], "workload.resources_per_trial.gpu"),
        (["data.val_fraction=1.5"], "data.val_fraction"),
        (["ray_auth_mode=maybe"], "ray_auth_mode"),
        (["backend.num_cpus=0"], "backend.num_cpus"),
        (["backend=attach", "backend.address=nonsense"], "backend.address"),
        (["backend=attach", "backend.address=127.0.0.1:1"], "backend.address"),
        (["workload=ddp", "workload.num_workers=0"], "workload.num_workers"),
        (["workload=ddp", "workload.model=vgg"], "workload.model"),
        (["workload=ddp", "workload.batch_size=0"], "workload.batch_size"),
        (["workload=ddp", "workload.lr=-0.1"], "workload.lr"),
        (["workload=ddp", "workload.lr_schedule=linear"], "workload.lr_schedule"),
        (["workload=ddp", "workload.warmup_epochs=10"], "workload.warmup_epochs"),
        (["workload=ddp", "workload.amp=maybe"], "workload.amp"),
        (["workload=ddp", "workload.checkpoint.keep_best=0"], "workload.checkpoint.keep_best"),
        (["workload=ddp", "workload.max_failures=-1"], "workload.max_failures"),
        (
            ["workload=ddp", "workload.resources_per_worker.gpu=1"],
            "workload.resources_per_worker.gpu",
        ),
        (
            ["workload=ddp", "workload.tune=true", "workload.sweep.grace_period=20"],
            "workload.sweep.grace_period",
        ),
        (
            ["workload=ddp", "workload.tune=true", "backend.include_dashboard=false"],
            "backend.include_dashboard",
        ),
        (["workload=ppo", "workload.env=NoSuchEnv-v0"], "workload.env"),
        (["workload=ppo", "workload.gamma=1.5"], "workload.gamma"),
        (["workload=ppo", "workload.minibatch_size=8000"], "workload.minibatch_size"),
        (["workload=ppo", "workload.lr=0"], "workload.lr"),
        (["workload=ppo", "workload.lr_grid=[0.1,-1]"], "workload.lr_grid"),
        (["workload=ppo", "workload.hidden=[]"], "workload.hidden"),
        (["workload=ppo", "workload.num_env_runners=-1"], "workload.num_env_runners"),
        (
            [
                "workload=ppo",
                "workload.stop.episode_return_mean=null",
                "workload.stop.env_steps=null",
            ],
            "workload.stop",
        ),
    ],
)
def test_bad_values_name_their_key(overrides, key):
    with pytest.raises(ConfigError) as raised:
        plan_job(compose_config(*overrides), [])
    assert raised.value.key == key
    assert "\n" not in str(raised.value)


def test_gpu_without_cuda_is_refused_before_start():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError) as raised:
        plan_job(compose_config("compute=gpu"), [])
    assert raised.value.key == "compute"


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["workload.nosuch=1"], "workload.nosuch"),
        (["backend=nosuch"], "backend=nosuch"),
        (["workload.scheduler.reduction_factor=2,4"], "workload.scheduler.reduction_factor=2,4"),
    ],
)
def test_hydra_errors_become_one_line(overrides, key):
    with pytest.raises(ConfigError) as raised:
        preflight(overrides, multirun=False)
    assert raised.value.key == key and "\n" not in str(raised.value)


def test_multirun_checks_every_job_before_the_first_starts():
    preflight(["workload.scheduler.reduction_factor=2,4"], multirun=True)
    with pytest.raises(ConfigError, match="workload.num_samples"):
        preflight(["workload.num_samples=2,0"], multirun=True)


def test_one_line_keeps_unknown_errors_on_one_line():
    err = one_line(RuntimeError("first\n\n  second"))
    assert str(err) == "config: first second"


@pytest.mark.parametrize(
    "name",
    [
        "token",
        "api_key",
        "MLFLOW_TRACKING_TOKEN",
        "db.password",
        "aws-secret",
        "spark.hadoop.fs.s3a.secret.key",
    ],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name", ["monkey", "keyboard_layout", "tokenizer", "num_samples", "metric"]
)
def test_not_secret_names(name):
    assert not is_secret_name(name)


def test_redaction_masks_nested_secrets_only():
    config = {
        "tracking": {"uri": "sqlite:///x", "token": "abc"},
        "spark_conf": {"fs.s3a.secret.key": "xyz", "x": 1},
    }
    masked = redact(config)
    assert masked["tracking"] == {"uri": "sqlite:///x", "token": REDACTED}
    assert masked["spark_conf"] == {"fs.s3a.secret.key": REDACTED, "x": 1}
    assert config["tracking"]["token"] == "abc"  # the original is untouched
    text = safe_yaml(OmegaConf.create(config))
    assert "abc" not in text and "xyz" not in text and "sqlite:///x" in text


def test_a_bug_in_a_check_is_not_reported_as_bad_input(monkeypatch):
    """Only configuration errors become `rayflow: error: <key>`; a bug keeps its traceback."""
    import rayflow.orchestrator.preflight

    def broken_check(cfg, overrides, on_head=None):
        raise ZeroDivisionError("a bug in rayflow")

    monkeypatch.setattr(rayflow.orchestrator.preflight, "plan_job", broken_check)
    with pytest.raises(ZeroDivisionError):
        preflight([], multirun=False)


def _yaml_keys(node, prefix=""):
    """Dotted keys of a YAML option (a mapping's keys; free-form mappings stop at their own key)."""
    for key, value in (node or {}).items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key in ("defaults", "hydra"):
            continue
        yield path
        if isinstance(value, dict) and value:
            yield from _yaml_keys(value, path)


def _model_keys(model, prefix=""):
    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        yield path
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from _model_keys(kind, path)


@pytest.mark.parametrize(
    "group, option", [(g, o) for g in GROUPS for o in GROUPS[g]] + [("", "config")]
)
def test_the_yaml_defaults_and_the_schema_agree(group, option):
    """Every key of every shipped option is declared in its schema, every declared key is in the
    YAML, and the defaults validate."""
    from importlib import resources

    from rayflow.orchestrator.compose import section_models, validate

    root = resources.files("rayflow.conf")
    text = (root / group / f"{option}.yaml" if group else root / "config.yaml").read_text()
    data = yaml.safe_load(text) or {}
    overrides = [f"{group}={option}"] if group else []
    # what an option cannot default: the cluster to join, the user's code and what it optimises
    required = {
        "attach": ["backend.address=127.0.0.1:6379"],
        "tune": ["workload.trainable=train:objective", "workload.metric=loss", "workload.mode=min"],
        "train": ["workload.train_loop=loop:train_loop"],
    }
    cfg = compose_config(*overrides, *required.get(option, ["seed=0"]))
    models = section_models(OmegaConf.to_container(cfg, resolve=True))
    if group:
        model = models[group]
        declared, shipped = set(_model_keys(model)), set(_yaml_keys(data))
        leaves = {d for d in declared if not any(x.startswith(d + ".") for x in declared)}
        free = {
            k for k in shipped if any(k.startswith(leaf + ".") for leaf in leaves)
        }  # spark_conf's own keys
        assert shipped - free == declared, (shipped - free) ^ declared
    else:
        shipped = set(_yaml_keys(data))
        assert shipped == set(_model_keys(models[""])), shipped ^ set(_model_keys(models[""]))
        # the data set the default workload (cifar) brings: conf/workload/data/cifar10.yaml
        brought = yaml.safe_load((root / "workload" / "data" / "cifar10.yaml").read_text())
        assert set(_yaml_keys(brought)) == set(_model_keys(models["data"]))
    validate(cfg)


@pytest.mark.parametrize(
    "text, masked",
    [
        ("https://alice:hunter2@host:5000/x", "https://alice:***@host:5000/x"),
        ("ray://tok123@head:10001", "ray://***@head:10001"),
        ("http://host/p?token=abc&page=2", "http://host/p?token=***&page=2"),
        ("https://host/c.tgz?sig=ok&api_key=zzz", "https://host/c.tgz?sig=ok&api_key=***"),
        ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
    ],
)
def test_credentials_in_urls_are_masked(text, masked):
    from rayflow.security.redaction import mask_text

    assert mask_text(text) == masked


@pytest.mark.parametrize(
    "name",
    [
        "spark.ssl.keyPassword",
        "spark.ssl.trustStorePassword",
        "spark.authenticate.secret",
        "fs.azure.account.key.acct.blob.core.windows.net",
        "fs.azure.sas.c.acct.blob.core.windows.net",
    ],
)
def test_spark_and_hadoop_secret_names(name):
    assert is_secret_name(name)


def test_a_secret_word_above_the_leaf_masks_it():
    """Hydra nests `+backend.spark_conf.fs.azure.account.key.acct=...` as dicts: the word `key`
    sits above the leaf `acct`."""
    masked = redact({"spark_conf": {"fs": {"azure": {"account": {"key": {"acct": "s3cr3t"}}}}}})
    assert masked["spark_conf"]["fs"]["azure"]["account"]["key"]["acct"] == REDACTED


def test_every_point_of_a_sweep_is_a_job_with_hydras_own_splitting():
    """No silent cap: 3 x 100 points are 300 jobs, in Hydra's BasicSweeper order; hydra.* overrides
    stay Hydra's; without -m the overrides are one job as they are."""
    from rayflow.orchestrator.compose import sweep_points

    points = sweep_points(
        ["workload.scheduler.reduction_factor=2,3,4", "seed=range(0,100)", "hydra.verbose=true"],
        multirun=True,
    )
    assert len(points) == 300
    assert points[0] == ["workload.scheduler.reduction_factor=2", "seed=0"]
    assert points[-1] == ["workload.scheduler.reduction_factor=4", "seed=99"]
    assert sweep_points(["seed=1", "hydra.verbose=true"], multirun=False) == [["seed=1"]]
