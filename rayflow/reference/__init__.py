"""The docs' generated parts. `python -m rayflow.reference > docs/reference/config.md`: the config
reference, from the schema and the shipped YAML defaults; every model comes from where it is
registered (the root's from rayflow.schema, each backend's and workload's from its registry).
`python -m rayflow.reference architecture docs/architecture.md`: the generated blocks of the
architecture page, rewritten in place between their markers (`<!-- generated: NAME -->` ...
`<!-- end generated -->`; without the path, printed): the layers, from the import-linter contracts
of pyproject.toml, and the backend contract, from the source of ClusterBackend and ClusterHandle.
tests/test_docs.py keeps the committed pages equal to what this prints now.

The layer table reads pyproject.toml, so it needs a checkout (an installed wheel has none).

A package because the two generators share nothing but the command: `config` (the config
reference), `layers` (the layer tables, from pyproject.toml), `architecture` (the page's blocks:
the layers and the contract classes, and filling them in), `__main__` (the command).
"""
