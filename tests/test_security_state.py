"""Issue 30, item 10: every value bounded in the schema, experiment folders made atomically and
locked while their run lasts, and tracking failures after a run started that cost one warning line.

The schema walk below is the class check: a key added to any model without an upper bound (a
number, a timeout) fails here, whoever adds it."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from rayflow.schema.backends import BACKENDS
from rayflow.schema.kinds import Kind
from rayflow.schema.launcher import JobResources, Launcher
from rayflow.schema.reference import _section
from rayflow.schema.root import Compute, Data, Mlflow, NoTracking, Root
from rayflow.schema.workloads import WORKLOADS

MODELS = {"": Root, "data": Data, "compute": Compute, "tracking": Mlflow, "tracking(none)": NoTracking, "hydra.launcher": Launcher,
          **{f"workload({name})": model for name, model in WORKLOADS.items()},
          **{f"backend({name})": model for name, model in BACKENDS.items()}}
HUGE = (10**30, 1e300, math.inf, -math.inf, math.nan)
TIMEOUT = re.compile(r"(timeout|_s$|seconds|minutes|deadline|budget)")
# Free-form values in the vocabulary of the engine or of the user's code (a Spark conf, a search
# space, Tune's stop mapping, a manifest's overrides), checked by the engine's own rules: every
# other key's kind has bounds.
FREE_FORM = {"a mapping", "a mapping, or null", "a list, or null", "a name or a mapping with `name` and parameters, or null"}


def _leaves(model: type[BaseModel], prefix: str):
    """(dotted key, field) of every key that is not a nested section, nested sections walked."""
    for name, field in model.model_fields.items():
        nested = _section(field.annotation)
        if nested is not None:
            yield from _leaves(nested, f"{prefix}.{name}")
        elif not any(isinstance(m, Kind) and m.words in FREE_FORM for m in field.metadata):
            yield f"{prefix}.{name}".lstrip("."), field


def _adapter(field) -> TypeAdapter:
    return TypeAdapter(Annotated[(field.annotation, *field.metadata)])


def _accepts(adapter: TypeAdapter, value: Any) -> Any:
    try:
        return True, adapter.validate_python(value, context={"cfg": {}, "local_paths": False})
    except (ValidationError, ValueError, TypeError):
        return False, None


def _numeric_probes(adapter: TypeAdapter) -> list[Any]:
    """What the key accepts of the probes that are numbers (or lists or mappings of numbers):
    each kind that takes one is a numeric key, and its huge counterparts must be refused."""
    shapes = []
    for probe, shape in ((1, lambda v: v), (0, lambda v: v), (0.5, lambda v: v), (2, lambda v: v),
                         ([1], lambda v: [v]), ({"x": 1}, lambda v: {"x": v})):
        ok, out = _accepts(adapter, probe)
        numbers = out if isinstance(out, (int, float)) else (out[0] if isinstance(out, list) and out else
                                                                  next(iter(out.values()), None) if isinstance(out, dict) else None)
        if ok and isinstance(numbers, (int, float)) and not isinstance(numbers, bool):
            shapes.append(shape)
    return shapes


def test_every_number_in_the_schema_has_an_upper_bound():
    """Every key that takes a number (alone, in a list, as a mapping's values) refuses 10**30,
    1e300, infinities and NaN: no number reaches a C timeout (OverflowError), an allocation or a
    wait unbounded. Plain `int`/`float` annotations (no kind, so no bound) are refused too."""
    unbounded, numeric = [], 0
    for where, model in MODELS.items():
        for key, field in _leaves(model, where):
            assert field.annotation not in (int, float), f"{key}: a plain {field.annotation.__name__}, use a kind with a bound"
            adapter = _adapter(field)
            shapes = _numeric_probes(adapter)
            numeric += bool(shapes)
            for shape in shapes:
                for value in HUGE:
                    if _accepts(adapter, shape(value))[0]:
                        unbounded.append(f"{key}={shape(value)!r}")
    assert numeric > 60  # the walk found the numeric keys (a probe that stopped matching would pass vacuously)
    assert not unbounded, unbounded


def test_every_timeout_is_positive_finite_and_bounded():
    """Every timeout, deadline and time budget: finite, and a value beyond a year is refused."""
    found = []
    for where, model in MODELS.items():
        for key, field in _leaves(model, where):
            if not TIMEOUT.search(key.rsplit(".", 1)[-1]):
                continue
            adapter = _adapter(field)
            if not _numeric_probes(adapter):
                continue
            found.append(key)
            for value in (10**8, 1e300, math.inf, math.nan, -1):
                assert not _accepts(adapter, value)[0], f"{key}={value}"
    assert {"schedule_timeout_s", "data.timeout_s", "tracking.timeout_s", "backend(attach).connect_timeout_s",
            "workload(tune).time_budget_s"} <= set(found), found


def test_the_launcher_bounds_its_custom_resources():
    with pytest.raises(ValidationError, match="at most"):
        JobResources.model_validate({"custom": {"x": 1e300}})
    with pytest.raises(ValidationError, match="must be a number"):
        JobResources.model_validate({"custom": {"x": math.inf}})
