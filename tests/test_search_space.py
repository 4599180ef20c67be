"""The search-space vocabulary, schedulers and search algorithms from YAML (no cluster): each sampler
becomes Tune's domain with its bounds, each malformed entry is one line naming its key, and the
schedulers and searchers are Tune's own objects, with unknown names and parameters refused."""

from __future__ import annotations

import math
import sys

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler, MedianStoppingRule, PopulationBasedTraining
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter
from ray.tune.search.sample import (
    Categorical,
    Float,
    Integer,
    LogUniform,
    Normal,
    Quantized,
    Uniform,
)

from rayflow.errors import ConfigError
from rayflow.schema.kinds import KeyedError
from rayflow.workloads.search_space import (
    SAMPLERS,
    check_space,
    has_grid,
    sampler_args,
    scheduler_spec,
    search_alg_spec,
)
from rayflow.workloads.tune_search import check_tune_parts, make_scheduler, make_search_alg, to_tune

# `base` must not reach Tune
pytestmark = pytest.mark.filterwarnings("error::ray.util.annotations.RayDeprecationWarning")


def _sampler(domain):
    """(outer sampler, inner sampler, q) of a domain: Tune wraps a quantized sampler."""
    outer = domain.get_sampler()
    return (outer, outer.sampler, outer.q) if isinstance(outer, Quantized) else (outer, outer, None)


DOMAINS = [  # entry, Tune's domain class, lower, upper, inner sampler class, q
    ({"uniform": [0.1, 0.9]}, Float, 0.1, 0.9, Uniform, None),
    ({"uniform": {"lower": -1, "upper": 1}}, Float, -1, 1, Uniform, None),
    ({"quniform": [0.0, 1.0, 0.25]}, Float, 0.0, 1.0, Uniform, 0.25),
    ({"loguniform": [1.0e-4, 1.0e-1]}, Float, 1.0e-4, 1.0e-1, LogUniform, None),
    (
        {"loguniform": {"lower": 1.0e-4, "upper": 0.1, "base": 10}},
        Float,
        1.0e-4,
        0.1,
        LogUniform,
        None,
    ),
    ({"qloguniform": [1.0, 1000.0, 1.0]}, Float, 1.0, 1000.0, LogUniform, 1.0),
    ({"randint": [1, 10]}, Integer, 1, 10, Uniform, None),
    ({"qrandint": [8, 256, 8]}, Integer, 8, 256, Uniform, 8),
    ({"qrandint": [0, 5]}, Integer, 0, 5, Uniform, 1),
    ({"lograndint": [1, 1024]}, Integer, 1, 1024, LogUniform, None),
    ({"qlograndint": {"lower": 2, "upper": 64, "q": 2}}, Integer, 2, 64, LogUniform, 2),
]


@pytest.mark.parametrize(
    "entry, cls, lower, upper, sampler, q", DOMAINS, ids=[str(d[0]) for d in DOMAINS]
)
def test_each_bounded_sampler_is_tunes_domain(entry, cls, lower, upper, sampler, q):
    domain = to_tune({"p": entry})["p"]
    assert type(domain) is cls and (domain.lower, domain.upper) == (lower, upper)
    outer, inner, got_q = _sampler(domain)
    assert isinstance(inner, sampler) and got_q == q
    assert all(domain.is_valid(domain.sample()) for _ in range(20))


def test_normal_samplers_keep_mean_and_sd():
    default, given, quantized = (
        to_tune({"p": e})["p"]
        for e in ({"randn": []}, {"randn": {"mean": 2, "sd": 0.5}}, {"qrandn": [0, 2, 0.5]})
    )
    assert (default.get_sampler().mean, default.get_sampler().sd) == (0.0, 1.0)
    assert (given.get_sampler().mean, given.get_sampler().sd) == (2, 0.5)
    outer, inner, q = _sampler(quantized)
    assert isinstance(inner, Normal) and (inner.mean, inner.sd, q) == (0, 2, 0.5)
    assert math.isinf(default.lower) and math.isinf(default.upper)


def test_choice_grid_nested_and_plain_values():
    space = {
        "batch": {"choice": [64, 128]},
        "act": {"choice": {"categories": ["relu", "tanh"]}},
        "seed": {"grid_search": [1, 2, 3]},
        "model": {"width": {"qrandint": [16, 64, 16]}, "name": "cnn", "opt": {"name": "sgd"}},
        "layers": [1, {"uniform": [0, 1]}],
        "momentum": 0.9,
        "tag": "x",
        "off": None,
        "flags": [True, False],
    }
    check_space(space)
    got = to_tune(space)
    assert isinstance(got["batch"], Categorical) and got["batch"].categories == [64, 128]
    assert got["act"].categories == ["relu", "tanh"]
    assert got["seed"] == tune.grid_search([1, 2, 3]) == {"grid_search": [1, 2, 3]}
    assert isinstance(got["model"]["width"], Integer) and got["model"]["opt"] == {"name": "sgd"}
    assert (
        got["model"]["name"] == "cnn"
        and got["layers"][0] == 1
        and isinstance(got["layers"][1], Float)
    )
    assert (got["momentum"], got["tag"], got["off"], got["flags"]) == (
        0.9,
        "x",
        None,
        [True, False],
    )
    assert has_grid(space) and not has_grid({"a": {"choice": [1, 2]}}) and not has_grid(None)


def test_vocabulary_covers_tunes_sampling_functions():
    assert all(callable(getattr(tune, name)) for name in SAMPLERS)
    assert sampler_args({"loguniform": [1e-4, 1e-1, 10]}) == (
        "loguniform",
        {"lower": 1e-4, "upper": 1e-1},
    )
    assert sampler_args({"qrandint": [0, 8]}) == ("qrandint", {"lower": 0, "upper": 8, "q": 1})


BAD_SPACES = [  # space, the key named, a word of the message
    ([1, 2], "", "must be a mapping"),
    ({"lr": {"logunifrom": [1e-4, 1e-1]}}, "lr", "did you mean loguniform"),
    ({"m": {"w": {"Uniform": {"lower": 0, "upper": 1}}}}, "m.w", "did you mean uniform"),
    ({"b": {"choice": [1, 2], "x": 3}}, "b", "exactly one key"),
    ({"lr": {"uniform": 3}}, "lr", "takes a list"),
    ({"lr": {"uniform": [1]}}, "lr", "needs upper"),
    ({"lr": {"uniform": [0, 1, 2]}}, "lr", "at most 2"),
    ({"lr": {"uniform": {"low": 0, "upper": 1}}}, "lr", "no argument 'low'"),
    ({"lr": {"uniform": [1, 0]}}, "lr", "must be < upper"),
    ({"lr": {"uniform": [1, 1]}}, "lr", "must be < upper"),
    ({"lr": {"uniform": ["0", 1]}}, "lr", "must be a number"),
    ({"lr": {"uniform": [True, 2]}}, "lr", "must be a number"),
    ({"lr": {"uniform": [0, float("inf")]}}, "lr", "must be a number"),
    ({"lr": {"loguniform": [0, 1]}}, "lr", "must be > 0"),
    ({"lr": {"loguniform": [-1e-3, 1]}}, "lr", "must be > 0"),
    ({"lr": {"loguniform": [1e-4, 1, 1]}}, "lr", "base"),
    ({"lr": {"quniform": [0, 1, 0]}}, "lr", "q must be > 0"),
    ({"lr": {"quniform": [0.05, 1, 0.1]}}, "lr", "multiple of q"),
    ({"n": {"randn": [0, 0]}}, "n", "sd must be > 0"),
    ({"n": {"qrandn": [0, 1]}}, "n", "needs q"),
    ({"n": {"randint": [1.5, 4]}}, "n", "must be an integer"),
    ({"n": {"qrandint": [1, 10, 2.0]}}, "n", "must be an integer"),
    ({"n": {"qrandint": [1, 3, 4]}}, "n", "no multiple of q"),
    ({"n": {"lograndint": [0, 8]}}, "n", "must be > 0"),
    ({"n": {"qlograndint": [1, 8]}}, "n", "needs q"),
    ({"c": {"choice": []}}, "c", "non-empty list"),
    ({"c": {"choice": 3}}, "c", "takes a list"),
    ({"c": {"choice": {"categories": "ab"}}}, "c", "non-empty list"),
    ({"g": {"grid_search": []}}, "g", "non-empty list"),
    ({"c": {"choice": [{"x": {"grid_search": [1, 2]}}]}}, "c.choice.0.x", "cannot be nested"),
    ({"c": {"choice": [{"x": {"uniform": [2, 1]}}]}}, "c.choice.0.x", "must be < upper"),
    ({"layers": [1, {"randint": [3, 3]}]}, "layers.1", "must be < upper"),
]


@pytest.mark.parametrize("space, key, words", BAD_SPACES, ids=[str(b[0]) for b in BAD_SPACES])
def test_a_malformed_entry_is_one_line_naming_its_key(space, key, words):
    with pytest.raises(KeyedError) as caught:
        check_space(space)
    assert caught.value.key == key and words in str(caught.value) and "\n" not in str(caught.value)
    # the preflight names the whole key
    with pytest.raises(ConfigError, match=f"^workload.search_space{'.' + key if key else ''}: "):
        check_tune_parts({"search_space": space, "metric": "loss", "mode": "min"})


def test_not_near_misses_are_nested_dicts():
    space = {"opt": {"optimizer": {"name": "sgd"}}, "r": {"random": [1, 2]}, "u": {"units": [1, 2]}}
    check_space(space)
    assert to_tune(space) == space
    with pytest.raises(KeyedError, match="not allowed here"):
        check_space({"s": {"grid_search": [1, 2]}}, allow_grid=False)


def test_schedulers_with_their_parameters():
    assert scheduler_spec(None) == ("fifo", {}) and make_scheduler(None, "loss", "min") is None
    assert make_scheduler("fifo", "loss", "min") is None
    asha = make_scheduler(
        {"name": "asha", "grace_period": 2, "reduction_factor": 3},
        "loss",
        "min",
        defaults={"max_t": 9},
    )
    assert isinstance(asha, ASHAScheduler) and (
        asha._time_attr,
        asha._max_t,
        asha._reduction_factor,
    ) == ("training_iteration", 9, 3)
    assert asha._brackets[0]._rungs[-1][0] == 2  # the first rung at grace_period
    assert (
        make_scheduler(
            {"name": "asha", "time_attr": "epoch"}, "loss", "min", time_attr="x"
        )._time_attr
        == "epoch"
    )
    median = make_scheduler({"name": "median_stopping", "grace_period": 5}, "loss", "min")
    assert isinstance(median, MedianStoppingRule) and median._grace_period == 5
    assert make_scheduler("hyperband", "loss", "min")._time_attr == "training_iteration"


def test_pbt_mutations_in_the_vocabulary_become_tune_domains():
    pbt = make_scheduler(
        {
            "name": "pbt",
            "perturbation_interval": 2,
            "hyperparam_mutations": {
                "lr": {"loguniform": [1e-4, 1e-1]},
                "batch": [32, 64],
                "opt": {"momentum": {"uniform": [0.8, 0.99]}},
            },
        },
        "loss",
        "max",
    )
    assert isinstance(pbt, PopulationBasedTraining)
    lr, batch, momentum = (
        pbt._hyperparam_mutations["lr"],
        pbt._hyperparam_mutations["batch"],
        pbt._hyperparam_mutations["opt"]["momentum"],
    )
    assert isinstance(lr.get_sampler(), LogUniform) and (lr.lower, lr.upper) == (1e-4, 1e-1)
    assert batch == [32, 64] and isinstance(momentum, Float)


BAD_SCHEDULERS = [  # value, key, words
    ("ashaa", "workload.scheduler", "unknown scheduler 'ashaa' (did you mean asha?)"),
    ({"name": "bohb"}, "workload.scheduler.name", "choose from fifo, asha"),
    ({"grace_period": 1}, "workload.scheduler.name", "missing"),
    (3, "workload.scheduler", "must be a scheduler name"),
    (
        {"name": "asha", "grace": 1},
        "workload.scheduler.grace",
        "asha takes no parameter 'grace'; it takes: time_attr, max_t, grace_period",
    ),
    ({"name": "fifo", "max_t": 1}, "workload.scheduler.max_t", "it takes: none"),
    ({"name": "asha", "metric": "x"}, "workload.scheduler.metric", "workload.metric"),
    (
        {"name": "asha", "grace_period": 0},
        "workload.scheduler",
        "asha: grace_period must be positive",
    ),
    ({"name": "pbt"}, "workload.scheduler.hyperparam_mutations", "needs a mapping"),
    (
        {"name": "pbt", "hyperparam_mutations": {"lr": 0.1}},
        "workload.scheduler.hyperparam_mutations.lr",
        "a mutation is a sampler",
    ),
    (
        {"name": "pbt", "hyperparam_mutations": {"lr": {"grid_search": [1, 2]}}},
        "workload.scheduler.hyperparam_mutations.lr",
        "cannot be a mutation",
    ),
    (
        {"name": "pbt", "hyperparam_mutations": {"lr": {"unifrom": [0, 1]}}},
        "workload.scheduler.hyperparam_mutations.lr",
        "did you mean uniform",
    ),
    (
        {"name": "pbt", "hyperparam_mutations": {"lr": []}},
        "workload.scheduler.hyperparam_mutations.lr",
        "must not be empty",
    ),
    (
        {"name": "pbt", "hyperparam_mutations": {"lr": [1]}, "custom_explore_fn": "f"},
        "workload.scheduler.custom_explore_fn",
        "Python object",
    ),
    (
        {"name": "pb2", "hyperparam_bounds": {"lr": [1, 0]}},
        "workload.scheduler.hyperparam_bounds.lr",
        "low < high",
    ),
    (
        {"name": "pb2", "hyperparam_bounds": {}},
        "workload.scheduler.hyperparam_bounds",
        "needs a mapping",
    ),
]


@pytest.mark.parametrize(
    "value, key, words", BAD_SCHEDULERS, ids=[str(b[0]) for b in BAD_SCHEDULERS]
)
def test_bad_schedulers_are_refused_naming_the_key(value, key, words):
    with pytest.raises(ConfigError) as caught:
        check_tune_parts({"scheduler": value, "metric": "loss", "mode": "min"})
    assert caught.value.key == key and words in str(caught.value) and "\n" not in str(caught.value)


def test_pb2_is_built_and_needs_scikit_learn(monkeypatch):
    pytest.importorskip("sklearn")
    pb2 = make_scheduler({"name": "pb2", "hyperparam_bounds": {"lr": [1e-4, 0.1]}}, "loss", "min")
    assert type(pb2).__name__ == "PB2"
    # Python's documented way to make an import fail
    monkeypatch.setitem(sys.modules, "sklearn", None)
    with pytest.raises(
        ConfigError,
        match=r"^workload.scheduler: pb2 needs the scikit-learn package: pip install 'rayflow\[pb2\]'$",
    ):
        make_scheduler({"name": "pb2", "hyperparam_bounds": {"lr": [1e-4, 0.1]}}, "loss", "min")


SPACE = {
    "lr": {"loguniform": [1e-4, 1e-1]},
    "batch": {"choice": [32, 64]},
    "width": {"qrandint": [8, 64, 8]},
}


@pytest.mark.parametrize(
    "name, cls_name", [("optuna", "OptunaSearch"), ("hyperopt", "HyperOptSearch")]
)
def test_searchers_are_built_and_limited(name, cls_name):
    pytest.importorskip(name)
    assert type(make_search_alg(name, "loss", "min", SPACE)).__name__ == cls_name
    limited = make_search_alg({"name": name, "max_concurrent": 3}, "loss", "min", SPACE)
    assert isinstance(limited, ConcurrencyLimiter) and limited.max_concurrent == 3
    assert type(limited.searcher).__name__ == cls_name
    check_tune_parts(
        {
            "search_space": SPACE,
            "search_alg": {"name": name, "max_concurrent": 2},
            "scheduler": "asha",
            "metric": "loss",
            "mode": "min",
        }
    )
    with pytest.raises(
        ConfigError,
        match=rf"^workload.search_space: grid_search works with search_alg=random only; {name}",
    ):
        make_search_alg(name, "loss", "min", {**SPACE, "seed": {"grid_search": [1, 2]}})
    with pytest.raises(
        ConfigError,
        match=rf"^workload.search_alg.tries: {name} takes no parameter 'tries'; it takes: points_to_evaluate",
    ):
        make_search_alg({"name": name, "tries": 3}, "loss", "min", SPACE)


@pytest.mark.parametrize("name, package", [("optuna", "optuna"), ("hyperopt", "hyperopt")])
def test_a_missing_library_is_refused_with_its_pip_hint(monkeypatch, name, package):
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(
        ConfigError,
        match=rf"^workload.search_alg: {name} needs the {package} package: pip install 'rayflow\[{name}\]'$",
    ):
        check_tune_parts(
            {"search_space": SPACE, "search_alg": name, "metric": "loss", "mode": "min"}
        )


def test_random_search_and_search_alg_specs():
    assert (
        make_search_alg(None, "loss", "min", SPACE) is None
        and make_search_alg("random", "loss", "min", SPACE) is None
    )
    limited = make_search_alg(
        {"name": "random", "max_concurrent": 2}, "loss", "min", {"s": {"grid_search": [1, 2]}}
    )
    assert isinstance(limited, BasicVariantGenerator) and limited.max_concurrent == 2
    assert search_alg_spec({"name": "optuna", "max_concurrent": 4, "seed": 1}) == (
        "optuna",
        4,
        {"seed": 1},
    )
    assert search_alg_spec("hyperopt") == ("hyperopt", None, {})
    for bad, key, words in [
        ({"name": "optuna", "max_concurrent": 0}, "max_concurrent", "integer >= 1 or null"),
        ({"name": "optuna", "max_concurrent": True}, "max_concurrent", "integer >= 1"),
        ("optuan", "", "did you mean optuna"),
        ({"name": "bayesopt"}, "name", "choose from random, optuna, hyperopt"),
        ({"name": "optuna", "space": {}}, "space", "workload.search_space"),
    ]:
        with pytest.raises(KeyedError, match=words) as caught:
            search_alg_spec(bad)
        assert caught.value.key == key


def test_a_sampler_the_searcher_lacks_names_its_key():
    pytest.importorskip("optuna")
    with pytest.raises(
        ConfigError,
        match=r"^workload.search_space.model.noise: optuna: Optuna search does not support",
    ):
        make_search_alg("optuna", "loss", "min", {"model": {"noise": {"randn": [0, 1]}}})
    with pytest.raises(
        ConfigError, match="^workload.search_space: optuna needs at least one sampler"
    ):
        make_search_alg("optuna", "loss", "min", {"momentum": 0.9})
