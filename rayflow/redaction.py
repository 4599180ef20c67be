"""Masking secrets before anything is printed, logged or written to MLflow.

Two kinds of secret reach rayflow's output: values of keys whose name says they are secret
(`tracking.token`, `spark.ssl.keyPassword`, `fs.azure.account.key.<account>...`), and
credentials inside URLs (`https://user:pass@host`, `?token=...`). Every config, spec, tag,
param and message goes through `redact` / `mask_text` on its way out.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

# Words that mark a key or environment variable as secret. A name is split into words on
# '.', '_', '-', '/' and camelCase humps, so "keyPassword" and "trustStorePassword" are
# secrets, "monkey" and "tokenizer" are not.
_SECRET_WORDS = {"token", "password", "passwd", "pwd", "secret", "key", "apikey", "credential",
                 "credentials", "sas", "passphrase"}
REDACTED = "***"

_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
# scheme://userinfo@ : a password (user:pass@) or a bare token (token@) before the host
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<info>[^/@\s?#]+)@")
# ?name=value or &name=value where the name is secret-like
_QUERY = re.compile(r"(?P<lead>[?&;](?P<name>[^=&#\s]+)=)(?P<value>[^&#\s]*)")


def words(name: str) -> list[str]:
    return [w for w in re.split(r"[._\-/\s]+", _HUMP.sub("_", str(name)).lower()) if w]


def is_secret_name(name: str) -> bool:
    return any(w in _SECRET_WORDS for w in words(name))


def mask_text(text: str) -> str:
    """`text` with URL credentials masked: user:***@, ***@ for a bare token, ?token=***."""

    def userinfo(match: re.Match) -> str:
        user, sep, _ = match.group("info").partition(":")
        return f"{match.group('scheme')}{user + ':' if sep else ''}{REDACTED}@"

    def query(match: re.Match) -> str:
        return match.group("lead") + REDACTED if is_secret_name(match.group("name")) else match.group(0)

    if "@" in text:
        text = _USERINFO.sub(userinfo, text)
    if "=" in text:
        text = _QUERY.sub(query, text)
    return text


def names_a_file(path: tuple[str, ...]) -> bool:
    """Keys of Ray's cluster YAML whose values are paths of files on this machine, not the
    files' contents: `file_mounts: {~/.ray/auth_token: PATH}` and `auth.ssh_private_key`. Kept
    as they are, so a printed `ray up` YAML still points `ray up` at them."""
    return len(path) >= 2 and (path[-2] == "file_mounts" or path[-2:] == ("auth", "ssh_private_key"))


def redact(value: Any, path: tuple[str, ...] = ()) -> Any:
    """A copy of a (nested) mapping or list with secrets masked: a leaf whose key path has a
    secret word anywhere (Hydra nests `fs.azure.account.key.acct` as dicts, so the word can
    sit above the leaf), and URL credentials inside any string."""
    if isinstance(value, Mapping):
        return {k: redact(v, (*path, str(k))) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, path) for v in value]
    if value is not None and any(is_secret_name(part) for part in path) and not names_a_file(path):
        return REDACTED
    if isinstance(value, str):
        return mask_text(value)
    return value


def drop_redacted(value: Any) -> Any:
    """A copy without the leaves redact() masked (for merging a saved config back)."""
    if isinstance(value, Mapping):
        return {k: drop_redacted(v) for k, v in value.items() if v != REDACTED}
    return value
