"""`hydra.sweeper.params` as Hydra's Optuna sweeper users write them, read into rayflow's search-space
vocabulary (the table of the Optuna sweeper's own tests, plugins/hydra_optuna_sweeper/tests, with
the same meaning: a range includes its stop), the fixed overrides beside them, and bad params
refused in one line naming the key. No cluster."""

from __future__ import annotations

import numpy as np
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from rayflow.errors import ConfigError
from rayflow.sweeper.params import Search, hydra_value, read_search
from rayflow.workloads.tune_search import to_tune


@pytest.mark.parametrize(
    "given, entry",
    [
        ("key=choice(1,2)", {"choice": [1, 2]}),
        ("key=choice(true, false)", {"choice": [True, False]}),
        ("key=choice('hello', 'world')", {"choice": ["hello", "world"]}),
        ("key=1,2,3", {"choice": [1, 2, 3]}),
        ("key=shuffle(range(1,3))", {"choice": [1, 2]}),
        ("key=range(1,3)", {"randint": [1, 4]}),  # Optuna's IntDistribution(1, 3): 3 included
        ("key=range(0,10,step=5)", {"choice": [0, 5, 10]}),
        ("key=interval(1, 5)", {"uniform": [1.0, 5.0]}),
        ("key=int(interval(1, 5))", {"randint": [1, 6]}),
        ("key=tag(log, interval(1, 5))", {"loguniform": [1.0, 5.0]}),
        ("key=tag(log, int(interval(1, 5)))", {"lograndint": [1, 6]}),
        ("key=range(0.5, 2.5, step=1)", {"choice": [0.5, 1.5, 2.5]}),
        ("key=range(-5.5, 5.5, step=0.5)", {"choice": [-5.5 + i / 2 for i in range(23)]}),
    ],
)
def test_each_optuna_sweeper_expression_becomes_the_same_distribution(given, entry):
    search = read_search({}, [given])
    if "shuffle" in given:  # the values in any order, as the Optuna sweeper's test compares them
        search.space["key"]["choice"].sort()
    assert search.space == {"key": entry} and search.fixed == []
    # and Tune builds it, drawing only values the Optuna sweeper would
    domain = to_tune(search.space)["key"]
    drawn = set(domain.sample(size=300, random_state=np.random.default_rng(0)))
    if "choice" in entry:
        assert drawn <= set(entry["choice"])
    elif "randint" in entry or "lograndint" in entry:
        low, high = next(iter(entry.values()))
        assert drawn <= set(range(low, high)) and max(drawn) == high - 1
    else:
        low, high = next(iter(entry.values()))
        assert all(low <= v <= high for v in drawn)


@pytest.mark.parametrize(
    "given, space, fixed",
    [
        (["key=choice(1,2)"], {"key": {"choice": [1, 2]}}, []),
        (["key=5"], {}, ["key=5"]),
        (["key1=choice(1,2)", "key2=5"], {"key1": {"choice": [1, 2]}}, ["key2=5"]),
        (
            ["key1=choice(1,2)", "key2=5", "key3=range(1,3)"],
            {"key1": {"choice": [1, 2]}, "key3": {"randint": [1, 4]}},
            ["key2=5"],
        ),
        (["~z"], {}, ["~z"]),
        (["~z=10"], {}, ["~z=10"]),
    ],
)
def test_searched_and_fixed_overrides_split_as_the_optuna_sweeper_splits_them(given, space, fixed):
    search = read_search({}, given)
    assert (search.space, search.fixed) == (space, fixed)


def test_the_command_line_wins_over_params_and_each_trial_gets_its_overrides():
    search = read_search(
        {"x": "range(-5.5, 5.5, step=0.5)", "y": "choice(-5, 0, 5)", "db.lr": "interval(0, 1)"},
        ["y=0", "+w=interval(0,1)", "name='a b'"],
    )
    assert set(search.space) == {"x", "db.lr", "w"} and search.fixed == ["y=0", "name='a b'"]
    assert search.names["w"] == "+w"  # added to the config, as the user wrote it
    overrides = search.overrides({"x": -5.5, "db.lr": 0.25, "w": 0.5})
    assert overrides == ["x=-5.5", "db.lr=0.25", "+w=0.5", "y=0", "name='a b'"]
    parsed = OverridesParser.create().parse_overrides(overrides)
    assert [o.value() for o in parsed] == [-5.5, 0.25, 0.5, 0, "a b"]
    assert search.params({"x": -5.5, "db.lr": 0.25, "w": 0.5}) == {
        "x": -5.5,
        "db.lr": 0.25,
        "+w": 0.5,
    }


def test_tunes_own_vocabulary_is_taken_as_workload_search_space_takes_it():
    search = read_search({"lr": {"loguniform": [1e-4, 1e-1]}, "batch": {"choice": [64, 128]}}, [])
    assert search.space == {"lr": {"loguniform": [1e-4, 1e-1]}, "batch": {"choice": [64, 128]}}
    assert to_tune(search.space)["lr"].lower == 1e-4


@pytest.mark.parametrize(
    "value",
    ["a b", "it's", "x,y", "true", "1", "null", "a=b", "(p)", "", 0.1, True, None, [1, "a"]],
)
def test_a_sampled_value_reads_back_as_itself_on_the_command_line(value):
    [parsed] = OverridesParser.create().parse_overrides([f"k={hydra_value(value)}"])
    assert parsed.value() == value and not parsed.is_sweep_override()


@pytest.mark.parametrize(
    "params, arguments, key, words",
    [
        ({"lr": "tag(log, interval(0, 1))"}, [], "hydra.sweeper.params.lr", "lower must be > 0"),
        ({"x": "range(5, 1)"}, [], "hydra.sweeper.params.x", "is empty"),
        ({"x": "range(0.5, 0.1, step=0.5)"}, [], "hydra.sweeper.params.x", "holds no value"),
        ({"x": "choice(1, 2"}, [], "hydra.sweeper.params.x", "no viable alternative"),
        ({"x": "glob(*)"}, [], "hydra.sweeper.params.x", "is not searched"),
        ({"lr": {"loguniform": [1, 0.1]}}, [], "hydra.sweeper.params.lr", "must be < upper"),
        ({"db": {"lr": 0.1}}, [], "hydra.sweeper.params.db", "write a nested key dotted"),
        ({"lr": {"logunifrom": [1e-4, 0.1]}}, [], "hydra.sweeper.params.lr", "did you mean"),
        ({}, ["x=interval(2, 1)"], "hydra.sweeper.params.x", "lower (2.0) must be < upper"),
    ],
)
def test_bad_params_are_refused_in_one_line_naming_the_key(params, arguments, key, words):
    with pytest.raises(ConfigError) as err:
        read_search(params, arguments)
    assert err.value.key == key and words in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_an_empty_search_has_nothing_to_vary():
    assert read_search(None, []) == Search()


def test_the_searchs_config_is_its_command_line_for_a_driver_on_a_head():
    """A search on vm or kuberay runs as a Ray Job whose driver composes rayflow's config again
    from a command line: those overrides compose the same config (backend aside: the head joins
    its own cluster)."""
    from omegaconf import OmegaConf

    from rayflow.orchestrator.compose import compose_config, plain
    from rayflow.sweeper.node import sweeper_node
    from rayflow.sweeper.settings import rayflow_config, read_settings

    node = {k: v for k, v in sweeper_node().items() if k != "defaults"}
    node.update(
        backend="vm",
        n_trials=7,
        direction="maximize",
        scheduler={"name": "asha", "grace_period": 2},
        search_alg={"name": "optuna", "seed": 3},
        storage_path="s3://bucket/sweeps",
        experiment="my search",
        resources={"cpu": 2, "gpu": 0, "memory": None, "custom": {"special": 1}},
    )
    search = read_search(
        {"x": "interval(0, 1)", "db": "choice(a, 'b c')"}, ["lr=tag(log, interval(0.001, 0.1))"]
    )
    made = rayflow_config(
        read_settings(OmegaConf.create(node)), search, "pkg.mod:fn", "/tmp/sweep", "app"
    )
    made.set("workload.trainable", "rayflow.workloads.hydra_sweep:shipped")
    again = compose_config(*made.overrides)
    mine, theirs = plain(made.cfg), plain(again)
    mine.pop("backend"), theirs.pop("backend")
    assert mine == theirs
    assert mine["workload"]["trainable"] == "rayflow.workloads.hydra_sweep:shipped"
    assert mine["tracking"]["experiment"] == "my search" and mine["workload"]["num_samples"] == 7
