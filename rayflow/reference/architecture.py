"""The architecture page's generated blocks (docs/architecture.md, between
`<!-- generated: NAME -->` and `<!-- end generated -->`): the layer tables
(rayflow.reference.layers), and the contract classes (ClusterBackend, ClusterHandle, Plan,
Workload and their companions) as their source declares them: docstrings, members, the comments
beside them. `fill_blocks` rewrites a page's blocks in place."""

from __future__ import annotations

import ast
import inspect
import io
import re
import textwrap
import tokenize
from typing import Any

from rayflow.backends import (
    ClusterBackend,
    ClusterHandle,
    KeepsClusters,
    Rendered,
    Submission,
    Traits,
    WorkerPreload,
)
from rayflow.reference.layers import layers_block, summary

BLOCK = re.compile(
    r"(?P<start><!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)"
    r"(?P<end><!-- end generated -->)",
    re.DOTALL,
)


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
        name, doc = stmt.name, summary(ast.get_docstring(stmt))
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

    doc = summary(ast.get_docstring(node))
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
        "backend-contract": _classes_block(
            ClusterBackend, Traits, KeepsClusters, Rendered, WorkerPreload
        ),
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
