"""The docs' generated parts. `python -m rayflow.reference > docs/reference/config.md`: the config
reference, from the schema and the shipped YAML defaults; every model comes from where it is
registered (the root's from rayflow.schema, each backend's and workload's from its registry).
`python -m rayflow.reference architecture docs/architecture.md`: the generated blocks of the
architecture page, rewritten in place between their markers (`<!-- generated: NAME -->` ...
`<!-- end generated -->`; without the path, printed): the layers, from the import-linter contracts
of pyproject.toml, and the backend contract, from the source of ClusterBackend and ClusterHandle.
tests/test_docs.py keeps the committed pages equal to what this prints now.

The layer table reads pyproject.toml, so it needs a checkout (an installed wheel has none).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import re
import sys
import textwrap
import tokenize
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from rayflow.backends import REGISTRY as BACKENDS
from rayflow.backends import (
    ClusterBackend,
    ClusterHandle,
    Rendered,
    Submission,
    WorkerPreload,
    backend_keys,
)
from rayflow.launcher.keys import Launcher
from rayflow.schema.kinds import Kind
from rayflow.schema.root import Compute, Mlflow, NoTracking, Root
from rayflow.workloads import REGISTRY as WORKLOADS
from rayflow.workloads import workload_keys
from rayflow.workloads.keys import Shipped

GROUPS_TABLE = (
    ("`backend`", "`local` (default), `attach`, `spark`, `vm`, `kuberay`", "where Ray runs"),
    (
        "`workload`",
        "`cifar` (default), `ddp`, `ppo`; `tune`, `train`, `rllib`",
        "what runs: a preset, or your own code ([Your own workload](../workloads/tune.md)); "
        "`cifar` and `ddp` also bring the [`data`](#data) section",
    ),
    (
        "`compute`",
        "`cpu` (default), `gpu`, `auto`",
        "the device trials use; `gpu` is refused without a CUDA device, `auto` uses GPUs when "
        "the cluster has them",
    ),
    ("`tracking`", "`mlflow` (default), `none`", "where results go"),
)

HEADER = (
    """# Config reference

Generated from the schema (pydantic models: each key's kind, range and meaning, the rules between
keys as validators beside them; the root's in `rayflow/schema/`, each backend's and workload's
beside its code) and the shipped defaults (`conf/`):
`python -m rayflow.reference > docs/reference/config.md`. Hydra composes `conf/config.yaml`
from four groups; every key can be set on the command line (`key=value`), and a value that is not
of its key's kind, or breaks a rule, is refused before anything starts with one line naming the
key ([Everyday use](../usage.md#bad-input)).

| group | options | what it chooses |
| --- | --- | --- |
"""
    + "".join(f"| {group} | {options} | {what} |\n" for group, options, what in GROUPS_TABLE)
    + """
The last table is not rayflow's own config: it is `hydra/launcher=rayflow`, the launcher any Hydra
application can use for its sweeps ([Hydra launcher](../launcher.md)).
"""
)


# What a backend's table alone does not say: where the rest of its checks happen.
NOTES = {
    "vm": (
        "The cluster YAML rendered from these keys is checked with Ray's own validation, and "
        "`ssh`, `rsync` and the key file with provider=local, aws or gcp; keys of outdated "
        "cluster YAMLs (`initial_workers`, a top-level `instance_type`, ...) are refused naming "
        "what replaced them ([its page](../backends/vm.md#keys)). With `backend.cluster_yaml` "
        "your own file is the cluster: the keys that only render one are refused beside it, and "
        "the others apply over it where they differ from their default ([your own cluster "
        "YAML](../backends/vm.md))."
    ),
    "kuberay": (
        "`+backend.worker_groups.NAME={cpu: ..., memory: ...}` adds a worker group, with the keys "
        "of `backend.worker_groups.cpu` (the others may be left out). The manifest rendered from "
        "these keys, `backend.overrides` included, is checked with KubeRay's CRD schema and the "
        "operator's own rules ([its page](../backends/kuberay.md#keys)). With `backend.manifest` "
        "your own RayCluster or RayJob is the cluster, checked the same way; the keys apply over "
        "it where they differ from their default ([your own manifest](../backends/kuberay.md))."
    ),
}

LAUNCHER_NOTE = (
    "Set in a Hydra application's sweep as `hydra.launcher.KEY=value` "
    "(`hydra_plugins/rayflow_launcher/rayflow.yaml`). Every key of the chosen backend goes beside "
    "`backend`, without its `backend.` prefix: `hydra.launcher.backend=spark "
    "hydra.launcher.max_worker_nodes=4` is the cluster of `backend=spark "
    "backend.max_worker_nodes=4` (the tables above); left null, a key keeps that backend's "
    "default, and a key of another backend is refused naming whose it is. A job's own config may "
    "override `resources` under the section `job_resources_key` names ([per-job "
    "resources](../launcher.md#per-job-resources))."
)


def _kind_words(field) -> str:
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "a section"
    for meta in field.metadata:
        if isinstance(meta, Kind):
            return meta.words
    return getattr(annotation, "__name__", str(annotation))


def _show(value: Any) -> str:
    if isinstance(value, dict) and not value:
        return "`{}`"
    if isinstance(value, (dict, list)):
        return "`" + yaml.safe_dump(value, default_flow_style=True, width=1000).strip() + "`"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _section(annotation: Any) -> Any:
    """The model of a section key (`Model`, or `Model | None` for a section that may be dropped),
    or None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def rows(model: type[BaseModel], defaults: dict, prefix: str) -> list[str]:
    out = []
    # what a job takes to a remote cluster (Shipped's keys) last, after the workload's own
    fields = sorted(
        model.model_fields.items(),
        key=lambda item: item[0] in Shipped.model_fields and model is not Shipped,
    )
    for name, field in fields:
        key = f"{prefix}.{name}" if prefix else name
        value = (defaults or {}).get(name)
        annotation = _section(field.annotation)
        if annotation is not None:
            out.extend(rows(annotation, value or {}, key))
            continue
        meaning = (field.description or "").replace("|", "\\|").replace("\n", " ")
        out.append(f"| `{key}` | {_kind_words(field)} | {_show(value)} | {meaning} |")
    return out


def _table(title: str, model: type[BaseModel], defaults: dict, prefix: str, note: str = "") -> str:
    head = f"\n## {title}\n\n" + (note + "\n\n" if note else "")
    return (
        head
        + "| key | kind | default | meaning |\n| --- | --- | --- | --- |\n"
        + "\n".join(rows(model, defaults, prefix))
        + "\n"
    )


def _yaml(*parts: str) -> dict:
    node = resources.files("rayflow.conf")
    for part in parts:
        node = node.joinpath(part)
    return yaml.safe_load(node.read_text()) or {}


def _option(workload: str, section: str) -> str:
    """The file of `section` a workload's defaults list names
    (`- /workload/data@_global_.data: cifar10`)."""
    for entry in _yaml("workload", f"{workload}.yaml").get("defaults", []):
        if isinstance(entry, dict):
            for key, option in entry.items():
                if key.split("@")[0].strip("/") == f"workload/{section}":
                    return f"{option}.yaml"
    raise LookupError(f"workload={workload} names no {section} option in its defaults list")


def _launcher_defaults() -> dict:
    return (
        yaml.safe_load(
            resources.files("hydra_plugins.rayflow_launcher").joinpath("rayflow.yaml").read_text()
        )
        or {}
    )


def markdown() -> str:
    root = _yaml("config.yaml")
    text = HEADER
    text += _table("The root config", Root, root, "")
    for option in ("cpu", "gpu", "auto"):
        text += _table(
            f"`compute={option}`", Compute, _yaml("compute", f"{option}.yaml"), "compute"
        )
    text += _table("`tracking=mlflow`", Mlflow, _yaml("tracking", "mlflow.yaml"), "tracking")
    text += _table("`tracking=none`", NoTracking, _yaml("tracking", "none.yaml"), "tracking")
    sections: dict[str, list[str]] = {}
    for name in (n for n, entry in WORKLOADS.items() if entry.chosen):
        model = workload_keys(name)
        text += _table(f"`workload={name}`", model, _yaml("workload", f"{name}.yaml"), "workload")
        for section in getattr(model, "sections", {}):
            sections.setdefault(section, []).append(name)
    # what presets bring at the root (`data`, conf/workload/data/)
    for section, users in sections.items():
        model = workload_keys(users[0]).sections[section]
        brought = " and ".join(f"`workload={u}`" for u in users)
        note = (
            f"Brought by {brought} (`conf/workload/{section}/`), at the root: "
            f"`{section}.KEY=value`."
        )
        text += _table(
            f"`{section}`",
            model,
            _yaml("workload", section, _option(users[0], section)),
            section,
            note,
        )
    for name in BACKENDS:
        text += _table(
            f"`backend={name}`",
            backend_keys(name),
            _yaml("backend", f"{name}.yaml"),
            "backend",
            NOTES.get(name, ""),
        )
    text += _table(
        "`hydra/launcher=rayflow`", Launcher, _launcher_defaults(), "hydra.launcher", LAUNCHER_NOTE
    )
    return text


# The architecture page (docs/architecture.md): the blocks generated from the code.

CHECKOUT = Path(__file__).resolve().parents[1]  # the repository root, in a checkout
BLOCK = re.compile(
    r"(?P<start><!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)"
    r"(?P<end><!-- end generated -->)",
    re.DOTALL,
)

# What each module a layer contract names holds: the layer tables' last column. A module the
# contracts name without an entry here fails the generator, naming it (and so the docs test).
ROLES = {
    "rayflow.__main__": "`python -m rayflow`",
    "rayflow.job_entry": "`python -m rayflow.job_entry`: a submitted run's driver on the head",
    "rayflow.reference": "the docs' generated parts: the config reference, this page's blocks",
    "rayflow.cli": "the command line: Hydra's flags, the preflight, the jobs, exit codes",
    "rayflow.api": "`rayflow.run`, `compose`, `dry_run`: the same run as a Python call",
    "rayflow.teardown": "`python -m rayflow.teardown PATH`: stop a cluster whose client died",
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
    "rayflow.orchestrator.job_files": "what a submitted job ships, and its size",
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


def _modules(layer: str) -> list[str]:
    """The modules of one layer of a contract (`a | b` independent, `a : b` not), optional ones
    (in parentheses) included."""
    return [m.strip(" ()") for m in re.split(r"[|:]", layer) if m.strip(" ()")]


def _role(module: str) -> str:
    """What a module holds: its entry in ROLES, else its docstring's first sentence."""
    if module in ROLES:
        return ROLES[module]
    doc = _summary(importlib.import_module(module).__doc__)
    if not doc or doc.startswith("TODO"):
        raise LookupError(f"{module}: say what it holds in rayflow.reference.ROLES")
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


def _summary(doc: str | None) -> str:
    """A docstring's first paragraph, on one line."""
    return " ".join((doc or "").split("\n\n")[0].split())


def _comments(source: str, body: list[ast.stmt]) -> list[str]:
    """Each statement's comments: the full-line ones just above it, and those at the end of its
    own lines (a field's meaning, where it has no docstring); noqa and type: ignore left out."""
    found: dict[int, tuple[str, bool]] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            full_line = not token.line[: token.start[1]].strip()
            found[token.start[0]] = (token.string.lstrip("#").strip(), full_line)
    starts = [min([s.lineno, *(d.lineno for d in getattr(s, "decorator_list", []))]) for s in body]
    ends = [*(start - 1 for start in starts[1:]), len(source.splitlines())]
    out = []
    for start, end in zip(starts, ends, strict=True):
        above: list[str] = []
        line = start - 1
        while line in found and found[line][1]:
            above.insert(0, found[line][0])
            line -= 1
        own = [text for n, (text, full) in sorted(found.items()) if start <= n <= end and not full]
        texts = [t for t in above + own if not t.startswith(("noqa", "type:"))]
        out.append(" ".join(texts))
    return out


def _params(args: ast.arguments, segment: Any) -> str:
    """A def's parameters as its source writes them, without self."""

    def one(arg: ast.arg, default: ast.expr | None) -> str:
        text = arg.arg + (f": {segment(arg.annotation)}" if arg.annotation else "")
        if default is not None:
            text += (" = " if arg.annotation else "=") + segment(default)
        return text

    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    out = [
        one(a, d)
        for a, d in zip(positional, [*defaults, *args.defaults], strict=True)
        if a.arg != "self"
    ]
    if args.vararg:
        out.append("*" + one(args.vararg, None))
    elif args.kwonlyargs:
        out.append("*")
    out += [one(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg:
        out.append("**" + one(args.kwarg, None))
    return ", ".join(out)


EMPTY = {"dict": "{}", "list": "[]", "tuple": "()", "set": "set()"}  # a factory's value, as written


def _default(value: ast.expr | None, segment: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
        for keyword in value.keywords:
            if keyword.arg == "default_factory":
                factory = segment(keyword.value)
                return f" = {EMPTY.get(factory, factory + '()')}"
            if keyword.arg == "default":
                return f" = {segment(keyword.value)}"
        return ""
    return f" = {segment(value)}"


MARKS = {
    "property": "property",
    "abstractmethod": "abstract",
    "contextmanager": "a context manager",
}


def _member(stmt: ast.stmt, comment: str, segment: Any) -> str | None:
    """One public member as a list item: an attribute with its comment, a method with its
    docstring's first paragraph; None for what is private or not a member."""
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        name, marks, doc = stmt.target.id, "", comment
        code = f"{name}: {segment(stmt.annotation)}{_default(stmt.value, segment)}"
    elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name, doc = stmt.name, _summary(ast.get_docstring(stmt))
        decorators = {segment(d).rsplit(".", 1)[-1] for d in stmt.decorator_list}
        returns = f" -> {segment(stmt.returns)}" if stmt.returns else ""
        params = "" if "property" in decorators else f"({_params(stmt.args, segment)})"
        code = f"{name}{params}{returns}"
        marks = "".join(f" ({MARKS[d]})" for d in sorted(decorators) if d in MARKS)
    else:
        return None
    if name.startswith("_"):
        return None
    return f"`{code}`{marks}" + (f": {doc}" if doc else "")


def class_members(cls: type) -> list[str]:
    """A class as its source declares it: its docstring's first paragraph, its constructor where it
    defines one, and its public members, each with its comment or docstring."""
    source = textwrap.dedent(inspect.getsource(cls))
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.ClassDef), cls

    def segment(part: ast.AST) -> str:
        return " ".join((ast.get_source_segment(source, part) or "").split())

    doc = _summary(ast.get_docstring(node))
    lines = [f"**`{cls.__name__}`** (`{cls.__module__}`)" + (f": {doc}" if doc else ""), ""]
    for stmt in node.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            lines.append(f"- built as `{cls.__name__}({_params(stmt.args, segment)})`")
    for stmt, comment in zip(node.body, _comments(source, node.body), strict=True):
        member = _member(stmt, comment, segment)
        if member:
            lines.append(f"- {member}")
    return lines


def _classes_block(*classes: type) -> str:
    return "\n\n".join("\n".join(class_members(cls)) for cls in classes)


def architecture_blocks() -> dict[str, str]:
    """Each generated block of docs/architecture.md, by the name its markers give it."""
    from rayflow.orchestrator.preflight import Plan
    from rayflow.workloads import RunContext, Workload

    return {
        "layers": layers_block(),
        "backend-contract": _classes_block(ClusterBackend, Rendered, WorkerPreload),
        "cluster-handle": _classes_block(ClusterHandle, Submission),
        "plan": _classes_block(Plan),
        "workload": _classes_block(Workload, RunContext),
    }


def fill_blocks(text: str, blocks: dict[str, str]) -> str:
    """`text` (a page) with each generated block's body replaced by `blocks[name]`; a page whose
    blocks are not exactly those raises ValueError."""
    names = [match["name"] for match in BLOCK.finditer(text)]
    if sorted(names) != sorted(blocks):
        raise ValueError(f"the page's generated blocks are {names}, not {sorted(blocks)}")
    return BLOCK.sub(lambda m: f"{m['start']}\n{blocks[m['name']].strip()}\n\n{m['end']}", text)


USAGE = """usage: python -m rayflow.reference                     the config reference, on stdout
       python -m rayflow.reference architecture        the architecture page's generated blocks
       python -m rayflow.reference architecture PAGE   ... rewritten in PAGE, between its markers
"""


def main(argv: list[str]) -> int:
    if not argv:
        sys.stdout.write(markdown())
        return 0
    if argv[0] != "architecture" or len(argv) > 2:
        sys.stderr.write(USAGE)
        return 2
    blocks = architecture_blocks()
    if len(argv) == 1:
        for name, body in blocks.items():
            sys.stdout.write(f"<!-- generated: {name} -->\n\n{body}\n\n<!-- end generated -->\n\n")
        return 0
    page = Path(argv[1])
    page.write_text(fill_blocks(page.read_text(), blocks))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
