"""A backend outside rayflow's package, as a plugin ships one (docs/architecture.md, "Adding a
backend"): `cluster` holds its class, `keys` the model of its `backend:` section, and this module
the `Entry` its distribution's entry point names (group `rayflow.backends`), which rayflow loads
without importing the class's module. tests/test_adding_a_backend.py installs it and holds it to
the shipped contract suites."""

from rayflow.backends import Entry

ENTRY = Entry(
    backend="tests.harness.minimal_backend.cluster:MinimalCluster",
    keys="tests.harness.minimal_backend.keys:Minimal",
)
