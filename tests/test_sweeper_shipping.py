"""A search's driver on a cluster's head composes each trial's job from the app's config files,
copied there (rayflow.sweeper.shipping): the same job config as on this machine, with the
originals gone, and nothing but YAML taken along."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rayflow.errors import ConfigError
from rayflow.sweeper import shipping


def _app(root: Path) -> Path:
    conf = root / "conf"
    (conf / "db").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - db: mysql\n  - _self_\nlr: 0.1\n")
    (conf / "db" / "mysql.yaml").write_text("driver: mysql\nport: 3306\n")
    (conf / "db" / "postgres.yaml").write_text("driver: postgres\nport: 5432\n")
    (conf / "data.bin").write_bytes(b"\0" * 1000)  # not a config: stays here
    (conf / ".hidden").mkdir()
    (conf / ".hidden" / "x.yaml").write_text("secret: 1\n")
    (conf / "linked.yaml").symlink_to(root / "elsewhere.yaml")
    (root / "elsewhere.yaml").write_text("outside: 1\n")
    return conf


@pytest.fixture
def loader(tmp_path):
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    conf = _app(tmp_path / "app")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        yield GlobalHydra.instance().config_loader(), conf


def _job(config_loader, overrides: list[str]):
    from hydra.types import RunMode

    master = config_loader.load_configuration("config", [], run_mode=RunMode.MULTIRUN)
    job = config_loader.load_sweep_config(master, overrides)
    return {k: v for k, v in OmegaConf.to_container(job).items() if k != "hydra"}


def test_a_trials_job_composes_from_the_copies_once_the_originals_are_gone(loader, tmp_path):
    config_loader, conf = loader
    here = _job(config_loader, ["db=postgres", "lr=0.5"])
    bundle = tmp_path / "bundle"
    shipped = shipping.ship_configs(config_loader, bundle)
    conf.rename(tmp_path / "gone")
    there = shipping.loader_at(config_loader, bundle, shipped)
    assert (
        _job(there, ["db=postgres", "lr=0.5"])
        == here
        == {
            "db": {"driver": "postgres", "port": 5432},
            "lr": 0.5,
        }
    )
    copied = sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file())
    # YAML only: no data file, hidden folder or link to elsewhere on this machine
    assert [Path(p).parts[2:] for p in copied] == [
        ("config.yaml",),
        ("db", "mysql.yaml"),
        ("db", "postgres.yaml"),
    ]
    # the loader this process composes with is left as it was
    assert any(e.path == str(conf) for e in config_loader.config_search_path.get_path())


def test_config_folders_past_the_limit_are_refused_naming_the_file(loader, tmp_path, monkeypatch):
    config_loader, conf = loader
    monkeypatch.setattr(shipping, "LIMIT", 40)
    with pytest.raises(ConfigError, match=r"over 0 MiB of YAML \(at .*config\.yaml\)") as err:
        shipping.ship_configs(config_loader, tmp_path / "bundle")
    assert err.value.key == "hydra.searchpath"


def test_a_composer_pickled_on_a_head_unpickles_at_the_resumed_jobs_own_bundle(
    loader, tmp_path, monkeypatch
):
    """Tune keeps the search algorithm, this composer with it, in the experiment's tuner.pkl; the
    first job's bundle goes with its cluster, so a resumed search (a new cluster, a new job)
    composes from its own bundle, not the path the pickle was written at (seen on vm: "Primary
    config directory not found" at the first cluster's folder)."""
    import cloudpickle  # as Tune writes tuner.pkl and the sweeper its spec (Hydra reloads its
    from hydra.types import HydraContext  # plugins' modules: their classes travel by value)

    from rayflow.sweeper.sweep import JobComposer
    from rayflow.workloads import hydra_sweep

    config_loader, _ = loader
    shipped = shipping.ship_configs(config_loader, tmp_path / "first")
    composer = JobComposer(
        HydraContext(config_loader=config_loader, callbacks=None),
        OmegaConf.create({}),
        None,
        str(tmp_path / "sweep"),
        shipped,
    )
    first = composer.at(tmp_path / "first")
    resumed = composer.at(tmp_path / "second")
    monkeypatch.setattr(hydra_sweep, "shipped_spec", lambda: type("Spec", (), {"compose": resumed}))
    assert cloudpickle.loads(cloudpickle.dumps(first)).bundle == str(tmp_path / "second")
    # here, where nothing was shipped, a composer pickles as itself
    assert cloudpickle.loads(cloudpickle.dumps(composer)).sweep_dir == composer.sweep_dir
