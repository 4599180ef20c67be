"""The architecture page's layer tables, from the import-linter contracts of the checkout's
pyproject.toml: each contract read (with a TOML library, or `toml_subset` without one), each
layer's modules with what they hold (ROLES, else the module's docstring). Apart from the class
blocks (rayflow.reference.architecture) because it reads a file, not the code."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[2]  # the repository root, in a checkout

# What each module a layer contract names holds: the layer tables' last column. A module the
# contracts name without an entry here fails the generator, naming it (and so the docs test).
ROLES = {
    "rayflow.__main__": "`python -m rayflow`",
    "rayflow.job_entry": "`python -m rayflow.job_entry`: a submitted run's driver on the head",
    "rayflow.reference": "the docs' generated parts: the config reference, this page's blocks",
    "rayflow.cli": "the command line: Hydra's flags, the preflight, the jobs, exit codes",
    "rayflow.api": "`rayflow.run`, `compose`, `dry_run`: the same run as a Python call",
    "rayflow.launcher": "`hydra/launcher=rayflow`: any Hydra app's sweep as Ray tasks",
    "rayflow.sweeper": "`hydra/sweeper=rayflow`: any Hydra app's parameter search as one "
    "asynchronous Ray Tune run",
    "rayflow.orchestrator": "a command line's jobs: the preflight, each cluster's lifetime, "
    "a run here or submitted, its report",
    "rayflow.backends": "where Ray runs: the `ClusterBackend` contract, the `ClusterHandle` a "
    "start returns, one module or package per engine with its keys",
    "rayflow.workloads": "what runs: the `Workload` protocol, the kinds `tune`, `train`, `rllib` "
    "with their keys, and their presets",
    "rayflow.tracking": "MLflow from the driver: the parent run, the trials' nested runs",
    "rayflow.results": "what a run leaves: `RunResult`, experiment folders and their state, plots",
    "rayflow.runtime": "a job's process and cluster while it runs: signals, environment, "
    "processes, progress lines, placement, node usage, pinned requirements",
    "rayflow.schema": "every key's kind and the rules between keys: the root's models, "
    "`Section`, `validate`",
    "rayflow.security": "Ray's token, masking secrets, the signed result line",
    "rayflow.errors": "every exception rayflow raises",
    "rayflow.orchestrator.session": "`run_jobs`, `run_job`: each cluster started once for the "
    "consecutive jobs that share it",
    "rayflow.orchestrator.driver": "`run_here`: a run in this process, in named steps",
    "rayflow.orchestrator.remote_run": "`run_submitted`: a run as a Ray Job on the head, its "
    "result read back",
    "rayflow.orchestrator.report": "a run's outcome into MLflow and onto the terminal",
    "rayflow.orchestrator.cluster": "`running`, `SharedCluster`, `cluster_scope`, `spec_text`: "
    "the one cluster lifecycle",
    "rayflow.orchestrator.preflight": "`preflight`: every check of every job, once, each job's "
    "`Plan`",
    "rayflow.orchestrator.resume": "`resume=`: the experiment's own config again",
    "rayflow.orchestrator.submission": "`submit`: the one protocol for a Ray Job (runs and sweeps)",
    "rayflow.orchestrator.compose": "Hydra's composition, sweep points, each section's model, "
    "`validate`",
    "rayflow.orchestrator.job_files": "what a submitted job ships: its runtime_env's files",
    "rayflow.orchestrator.upload_check": "the preflight's check of what a job uploads",
    "rayflow.orchestrator.upload_size": "what Ray would pack of a job's files, and its size",
    "rayflow.orchestrator.job_logs": "a submitted job's log: streamed, fetched whole, its last "
    "lines after a failure",
}


def importlinter(path: Path | None = None) -> dict[str, Any]:
    """[tool.importlinter] of the checkout's pyproject.toml: read with tomllib (Python 3.11+), else
    tomli, else `toml_subset` (Python 3.10 without tomli)."""
    path = path or CHECKOUT / "pyproject.toml"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the layer table is generated from a checkout's pyproject.toml "
            "(an installed rayflow has none)"
        )
    text = path.read_text()
    for name in ("tomllib", "tomli"):
        try:
            return dict(importlib.import_module(name).loads(text)["tool"]["importlinter"])
        except ModuleNotFoundError:
            continue
    return dict(toml_subset(text)["tool"]["importlinter"])


_TABLE_HEADER = re.compile(r"(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?")
_STRING = r'"(?:[^"\\]|\\.)*"|\'[^\']*\''


def toml_subset(text: str, prefix: str = "tool.importlinter") -> dict[str, Any]:
    """The part of a TOML document this module needs, without a TOML library: the tables under
    `prefix` (`[table]` and `[[array of tables]]` headers with bare dotted names) and their
    `key = value` lines, a value being a string, boolean, number or array of them (an array may
    span lines), `#` comments allowed after them. Strings are read as Python reads them (TOML's
    basic-string escapes are Python's). Other tables are skipped."""
    root: dict[str, Any] = {}
    table: dict[str, Any] | None = None
    key, value = "", ""
    for line in text.splitlines():
        code = _uncommented(line)
        header = _TABLE_HEADER.fullmatch(code) if not key else None
        if header:
            name = header[2]
            inside = name == prefix or name.startswith(prefix + ".")
            table = _table_at(root, name, header[1] == "[[") if inside else None
            continue
        if table is None or not (code or key):
            continue
        if key:
            value += " " + code
        else:
            key, _, value = (part.strip() for part in code.partition("="))
        bare = re.sub(_STRING, "", value)
        if bare.count("[") == bare.count("]"):
            table[key], key = _toml_value(value), ""
    return root


def _uncommented(line: str) -> str:
    """A TOML line without its comment (a `#` outside strings and what follows)."""
    code = re.match(rf"(?:[^#\"']|{_STRING})*", line)
    return code[0].strip() if code else ""


def _table_at(root: dict[str, Any], dotted: str, array: bool) -> dict[str, Any]:
    *parents, last = dotted.split(".")
    node = root
    for part in parents:
        node = node.setdefault(part, {})
        if isinstance(node, list):
            node = node[-1]
    if array:
        node.setdefault(last, []).append({})
        return node[last][-1]
    return node.setdefault(last, {})


def _toml_value(text: str) -> Any:
    python = re.sub(rf"({_STRING})|\btrue\b|\bfalse\b", lambda m: m[1] or m[0].capitalize(), text)
    return ast.literal_eval(python)


def summary(doc: str | None) -> str:
    """A docstring's first paragraph, on one line."""
    return " ".join((doc or "").split("\n\n")[0].split())


def _modules(layer: str) -> list[str]:
    """The modules of one layer of a contract (`a | b` independent, `a : b` not), optional ones
    (in parentheses) included."""
    return [m.strip(" ()") for m in re.split(r"[|:]", layer) if m.strip(" ()")]


def _role(module: str) -> str:
    """What a module holds: its entry in ROLES, else its docstring's first sentence."""
    if module in ROLES:
        return ROLES[module]
    doc = summary(importlib.import_module(module).__doc__)
    if not doc or doc.startswith("TODO"):
        raise LookupError(f"{module}: say what it holds in rayflow.reference.layers.ROLES")
    return re.split(r"(?<=\.)\s", doc, maxsplit=1)[0]


def _layer_table(contract: dict[str, Any], root: str) -> list[str]:
    containers = list(contract.get("containers", []))
    where = " and ".join(f"`{c}`" for c in containers) if containers else f"`{root}`"
    lines = [
        f"**{contract['name']}** ({where}, top to bottom):",
        "",
        "| layer | module | what it holds |",
        "| --- | --- | --- |",
    ]
    for number, layer in enumerate(contract["layers"], 1):
        for index, module in enumerate(_modules(layer)):
            full = f"{containers[0]}.{module}" if containers else module
            shown = full.removeprefix((containers[0] if containers else root) + ".")
            cell = str(number) if index == 0 else ""
            lines.append(f"| {cell} | `{shown}` | {_role(full)} |")
    return lines


def _contract_line(contract: dict[str, Any], root: str) -> str:
    def names(key: str) -> str:
        return ", ".join(f"`{m.removeprefix(root + '.')}`" for m in contract.get(key, []))

    if contract["type"] == "forbidden":
        what = f"{names('source_modules')} import none of {names('forbidden_modules')}"
    else:
        what = names("modules")
    return f"- **{contract['name']}** ({contract['type']}): {what}."


def layers_block(linter: dict[str, Any] | None = None) -> str:
    """The layer tables and the other contracts, as `lint-imports` checks them."""
    linter = linter or importlinter()
    root = str(linter["root_package"])
    contracts = list(linter["contracts"])
    lines: list[str] = []
    for contract in contracts:
        if contract["type"] == "layers":
            lines += [*_layer_table(contract, root), ""]
    others = [_contract_line(c, root) for c in contracts if c["type"] != "layers"]
    if others:
        lines += ["The other contracts:", "", *others]
    return "\n".join(lines).strip()
