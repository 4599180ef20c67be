"""Masking secrets before anything is printed, logged or written to MLflow.

Secrets reach rayflow's output in three shapes, and each is masked by its structure, not by
listing known keys:

- a value whose name says it is secret: `tracking.token`, `spark.ssl.keyPassword`,
  `fs.azure.account.key.<account>...` (Hydra nests it as dicts: the word can sit above the leaf),
  `dbpassword`, `apiKeys`, `GITHUB_PAT`, `x-api-key`, `session_cookie`;
- a value beside a secret name: Kubernetes `env` pairs `{name: AWS_SECRET_ACCESS_KEY, value: ...}`,
  argv lists `["--db-password", X]`;
- a secret inside text: `NAME=value`, `--flag value`, `--flag=value`, `name: value`,
  `Authorization: Basic ...`, `Bearer ...`, `Cookie: ...`, URL userinfo, query and fragment.

Every config, spec, tag, param and message goes through `redact` / `mask_text` on its way out.
`mask_text` runs on every streamed log line: its patterns are linear (each name starts only where
a word starts, every repeat is bounded by a character it cannot contain).

This module holds the masking, in text and in structures; which names are secret is decided in
rayflow.security.secret_names, from the words of rayflow.security.secret_words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rayflow.security.secret_names import is_secret_name, masks, name_word, secret_word

REDACTED = "***"

# --- text -------------------------------------------------------------------------------------
# Values in text that hold no secret: help's `key=value`, a YAML null, a value masked already
_PLACEHOLDERS = {"value", "values", "null", "none", "true", "false", "...", REDACTED}
# A name starts only where a word starts: not inside a word, a path (~/.ray/auth_token: PATH
# stays) or an interpolation; so each run of name characters is scanned once.
_START = r"(?<![\w.\-/~$%])"
# A value: quoted, or up to a space, a quote or punctuation that ends it; not an empty mapping or
# list (`auth: {}`) nor a reference (`${oc.env:TOKEN}`, `$TOKEN`)
_VALUE = r"(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'`,;&()\[\]{}$][^\s\"'`,;&)\]}]*)"
_SCHEME = r"(?P<scheme>(?:bearer|basic|token|digest|negotiate)[ \t]+)?"
_NAME = r"(?P<name>-{0,2}[A-Za-z_][\w.\-]*)"
# NAME=value, --flag=value, "NAME"=value, Authorization=Basic value
_EQUALS = re.compile(
    _START + _NAME + r"(?P<sep>[\"']?[ \t]*=[ \t]*)" + _SCHEME + _VALUE, re.IGNORECASE
)
# "NAME": value, 'NAME': value (JSON, a Python dict's repr)
_QUOTED = re.compile(
    r"(?P<q>[\"'])" + _NAME + r"(?P=q)[ \t]*:[ \t]*" + _SCHEME + _VALUE, re.IGNORECASE
)
# NAME: value, Authorization: Bearer value (YAML, headers), when the value is the line's last word:
# prose after a key ("backend.api_token: must be a string") is a message, not a secret
_COLON = re.compile(
    _START + _NAME + r"[ \t]*:[ \t]+" + _SCHEME + _VALUE + r"(?=[ \t]*(?:[,;}\])\"'\r\n]|$))",
    re.IGNORECASE,
)
# --flag value
_FLAG = re.compile(
    _START + r"(?P<name>--?[A-Za-z][\w.\-]*)(?P<sep>[ \t]+)(?P<value>\"[^\"\n]*\"|'[^'\n]*'"
    r"|[^\s\"'`\-][^\s\"'`,;&)\]}]*)"
)
_BEARER = re.compile(
    r"(?<![\w\-])(?P<scheme>bearer[ \t]+)(?P<value>[A-Za-z0-9\-._~+/]{8,}=*)", re.IGNORECASE
)
# A cookie header's value is several name=value pairs: all of it goes
_COOKIE = re.compile(
    r"(?<![\w\-])(?P<lead>(?:set-)?cookie[\"']?[ \t]*[:=][ \t]*)(?P<value>[^\r\n\"']+)",
    re.IGNORECASE,
)
# name: AWS_SECRET_ACCESS_KEY, value: ... (a Kubernetes env pair, as JSON or YAML text)
_PAIR = re.compile(
    r"(?<![\w\-])(?P<lead>[\"']?(?:name|key)[\"']?[ \t]*[:=][ \t]*[\"']?(?P<name>[A-Za-z_][\w.\-]*)"
    r"[\"']?[ \t]*(?:,[ \t]*|\r?\n[ \t]*)[\"']?value[\"']?[ \t]*[:=][ \t]*)" + _VALUE,
    re.IGNORECASE,
)
# scheme://userinfo@ : a password (user:pass@) or a bare token (token@) before the host
_USERINFO = re.compile(
    r"(?<![a-zA-Z0-9+.\-])(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<info>[^/@\s?#]+)@"
)
# ?name=value, &name=value, #name=value where the name is secret-like (percent-encoded names too)
_QUERY = re.compile(r"(?P<lead>[?&;#](?P<name>[^=&#;?\s]+)=)(?P<value>[^&#\s\"'`)\]}<>]*)")


def masked_message(err: BaseException) -> str:
    """An error's message with the secrets it echoes masked (Hydra's parse error quotes the whole
    override). A ConfigError's key is masked on its own, so the message after it stays a message:
    `backend.api_token: must be ...`."""
    text, key = str(err), getattr(err, "key", None)
    if isinstance(key, str) and text.startswith(f"{key}: "):
        return f"{mask_text(key)}: {mask_text(text[len(key) + 2 :])}"
    return mask_text(text)


def _placeholder(value: str) -> bool:
    """A value a message shows in place of the user's own (`key=value`, `TOKEN=<your token>`,
    `CREDENTIALS=/path/to/key.json`), or a file's path in the home folder
    (`ssh_private_key=~/.ssh/id`)."""
    lowered = value.lower()
    return lowered in _PLACEHOLDERS or lowered.startswith(("<", "~/")) or "path/to/" in lowered


def _masked(value: str) -> str:
    quote = value[0] if value[:1] in ("'", '"') and len(value) > 1 and value[-1] == value[0] else ""
    return f"{quote}{REDACTED}{quote}"


# An exception's class before its message (`KeyError: 'lr'`, `TokenError: expired`): the message
# quotes the code's own names (a missing key, an attribute), which a reader needs to see; the
# class names a kind of error, never a secret it holds.
_EXCEPTION_CLASS = re.compile(r"(?:[A-Z][a-z0-9]*)+(?:Error|Exception|Warning|Exit|Interrupt)")


def _named(match: re.Match) -> str:
    """The match with its value masked when its name is secret."""
    value = match.group("value")
    if _EXCEPTION_CLASS.fullmatch(match.group("name").lstrip("-").rsplit(".", 1)[-1]):
        return match.group(0)
    word = name_word(match.group("name").lstrip("-"))
    if not masks(word, value.strip("'\"")) or _placeholder(value.strip("'\"")):
        return match.group(0)
    return match.group(0)[: match.start("value") - match.start()] + _masked(value)


def _labelled(match: re.Match) -> str:
    """_named, but a bare `key: ...` line is a label in YAML (tolerations, metadata items,
    secretKeyRef), not a secret."""
    return match.group(0) if match.group("name").lower() == "key" else _named(match)


def _userinfo(match: re.Match) -> str:
    user, sep, _ = match.group("info").partition(":")
    return f"{match.group('scheme')}{user + ':' if sep else ''}{REDACTED}@"


def _query(match: re.Match) -> str:
    return match.group("lead") + REDACTED if is_secret_name(match.group("name")) else match.group(0)


def mask_text(text: str) -> str:
    """`text` with every secret it holds in clear masked: URL credentials (user:***@, ***@ for a
    bare token, ?token=***, #access_token=***), `NAME=***`, `--flag ***`, `name: ***`,
    `Bearer ***`, `Cookie: ***` and `{name: SECRET_NAME, value: ***}`."""
    if "@" in text:
        text = _USERINFO.sub(_userinfo, text)
    if "=" in text:
        text = _QUERY.sub(_query, text)
    lowered = text.lower()
    if "cookie" in lowered:
        text = _COOKIE.sub(lambda m: m.group("lead") + REDACTED, text)
    if "bearer" in lowered:
        text = _BEARER.sub(lambda m: m.group("scheme") + REDACTED, text)
    if "value" in lowered:
        text = _PAIR.sub(_named, text)
    if "=" in text:
        text = _EQUALS.sub(_named, text)
    if ":" in text:
        text = _QUOTED.sub(_named, text)
        text = _COLON.sub(_labelled, text)
    if "-" in text:
        text = _FLAG.sub(_named, text)
    return text


# --- structures -------------------------------------------------------------------------------
def names_a_file(path: tuple[str, ...]) -> bool:
    """Keys whose values are paths of files on this machine, not the files' contents: Ray's
    cluster YAML's `file_mounts: {~/.ray/auth_token: PATH}` and `auth.ssh_private_key`, and
    rayflow's `backend.ssh_private_key` that renders it. Kept as they are, so a printed `ray up`
    YAML still points `ray up` at them, and a resume starts the same cluster."""
    return len(path) >= 2 and (
        path[-2] == "file_mounts"
        or path[-2:] in (("auth", "ssh_private_key"), ("backend", "ssh_private_key"))
    )


def _is_secret_flag(item: Any) -> bool:
    return (
        isinstance(item, str)
        and item.startswith("-")
        and "=" not in item
        and is_secret_name(item.lstrip("-"))
    )


def _pair(value: Mapping) -> tuple[Any, Any] | None:
    """(the label's key, the value's key or None) of a labelled entry: Kubernetes env
    `{name, value}`, AWS tags `{Key, Value}`, GCP metadata items, tolerations and selector terms
    `{key, operator, ...}`. The label is a name (`Key: db_password`, `key: nvidia.com/gpu` are
    shown); the value is a secret when the label names one."""
    keys = {str(k).lower(): k for k in value}
    label = keys.get("name", keys.get("key"))
    if label is None:
        return None
    if "value" in keys:
        return label, keys["value"]
    return (label, None) if {"operator", "effect", "values"} & set(keys) else None


def redact(value: Any, path: tuple[str, ...] = ()) -> Any:
    """A copy of a (nested) mapping or list with secrets masked: a leaf whose key path names a
    secret (secret_word), a `value` beside a secret `name`, the item after a secret flag in a
    list (`["--db-password", X]`), and secrets inside any string (mask_text)."""
    if isinstance(value, Mapping):
        pair = _pair(value)
        if pair is None:
            return {k: redact(v, (*path, str(k))) for k, v in value.items()}
        label, inner = pair
        name = value[label]
        secret = isinstance(name, str) and is_secret_name(name)
        return {
            k: (
                mask_text(v)
                if k == label and isinstance(v, str)
                else REDACTED
                if inner is not None and k == inner and secret and masks("value", v)
                else redact(v, (*path, str(k)))
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        items = [redact(v, path) for v in value]
        for i in range(1, len(items)):
            if (
                _is_secret_flag(value[i - 1])
                and masks("value", value[i])
                and not str(value[i]).startswith("-")
            ):
                items[i] = REDACTED
        return items
    if masks(secret_word(path), value) and not names_a_file(path):
        return REDACTED
    if isinstance(value, str):
        return mask_text(value)
    return value


def _holds_redacted(value: Any) -> bool:
    if isinstance(value, str):
        return REDACTED in value
    if isinstance(value, (list, tuple)):
        return any(_holds_redacted(v) for v in value)
    return False


def drop_redacted(value: Any) -> Any:
    """A copy without the leaves redact() masked, whole or in part (for merging a saved config
    back: the value given now stands)."""
    if isinstance(value, Mapping):
        return {k: drop_redacted(v) for k, v in value.items() if not _holds_redacted(v)}
    return value


def masked_paths(value: Any, path: tuple[str, ...] = ()) -> list[str]:
    """The dotted key paths whose values redact() masks (whole or in part) in a document."""
    return _changed(value, redact(value), path)


def _changed(plain: Any, masked: Any, path: tuple[str, ...]) -> list[str]:
    if plain == masked:
        return []
    if isinstance(plain, Mapping) and isinstance(masked, Mapping):
        return [p for k in plain for p in _changed(plain[k], masked.get(k), (*path, str(k)))]
    if isinstance(plain, (list, tuple)) and isinstance(masked, list) and len(plain) == len(masked):
        return [
            p
            for i, (a, b) in enumerate(zip(plain, masked, strict=True))
            for p in _changed(a, b, (*path, str(i)))
        ]
    return [".".join(path)]


def literal_secrets_note(document: Any) -> list[str]:
    """A dry run's note (stderr) when the document it prints holds secrets in clear: the printout
    masks them, so stdout is still the document less those values, and says where they belong."""
    paths = masked_paths(document)
    if not paths:
        return []
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    return [
        f"dry run: the document holds {len(paths)} secret value(s) in clear, masked ({REDACTED}) "
        f"in this printout: {shown}. Keep secrets out of it: let the nodes read them from their "
        "environment or a file at start (`export NAME=$(cat ~/.secrets/NAME)` in a setup command, "
        "an environment variable set where Ray starts) or, on KubeRay, a Kubernetes Secret (env "
        "valueFrom.secretKeyRef)"
    ]
