"""Which names are secret: a name split into words (on `.`, `_`, `-`, `/`, spaces and camelCase
humps), each word checked against the vocabulary (rayflow.security.secret_words), a key path
decided part by part; and whether a value under a secret name is masked at all (not a flag, a
null, nor a number under an ambiguous name). Both the text patterns and the walk over
structures (rayflow.security.redaction) ask it."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from rayflow.security.secret_words import (
    AMBIGUOUS_FOR_NUMBERS,
    COUNTS,
    DESCRIPTORS,
    KEY_PREFIXES,
    NOT_KEY,
    NOT_PASS,
    NOT_TOKEN,
    SECRET_ENDINGS,
    SECRET_WORDS,
    WEAK,
)

_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SPLIT = re.compile(r"[._\-/\s]+")
_NUMBER = re.compile(r"[+-]?\d{1,30}(?:\.\d{1,30})?")


def words(name: str) -> list[str]:
    return [w for w in _SPLIT.split(_HUMP.sub("_", str(name)).lower()) if w]


def _secret_word(word: str) -> bool:
    if (
        word in SECRET_WORDS
        or word.endswith(SECRET_ENDINGS)
        or "password" in word
        or "passwd" in word
    ):
        return True
    stem = word[:-1] if word.endswith("keys") else word
    if stem.endswith("key") and stem[:-3].endswith(KEY_PREFIXES):
        return True
    return word.endswith("pass") and word not in NOT_PASS


def _negated(before: list[str], word: str) -> bool:
    if any(w in COUNTS for w in before):
        return True
    last = before[-1] if before else ""
    if word in ("key", "keys"):
        return last in NOT_KEY
    return word.startswith("token") and last in NOT_TOKEN


def _verdict(ws: list[str]) -> str | None:
    """The secret word that decides a name ('' when a descriptor after it clears it; None when
    the name has neither)."""
    found = None
    for i, word in enumerate(ws):
        if word in DESCRIPTORS:
            found = ""
        elif _secret_word(word) and not _negated(ws[:i], word):
            found = word
    return found


def secret_word(path: tuple[str, ...]) -> str | None:
    """The word that makes the value at this key path secret, or None. Each part's words decide
    in order: a secret word marks it, a later descriptor clears it, a neutral part keeps it (the
    account under `fs.azure.account.key`) unless the mark was weak (`auth`); a reference part
    (`secretKeyRef`, `valueFrom`) names where a secret is, so nothing under it is one."""
    found = None
    for part in path:
        ws = words(part)
        if ws and ws[-1] in ("ref", "from"):
            return None
        verdict = _verdict(ws)
        if verdict is not None:
            found = verdict or None
        elif found in WEAK:
            found = None
    return found


@lru_cache(maxsize=4096)  # mask_text asks about the same few names on every log line
def name_word(name: str) -> str | None:
    return secret_word((name,))


def is_secret_name(name: str) -> bool:
    return name_word(str(name)) is not None


def masks(word: str | None, value: Any) -> bool:
    """Whether a value under the secret word `word` is masked: never a flag or a null, and a
    number only under an unambiguous name (password: 1234, not max_tokens: 100 or keys: 3)."""
    if word is None or value is None or isinstance(value, bool):
        return False
    if isinstance(value, (int, float)) or (isinstance(value, str) and _NUMBER.fullmatch(value)):
        return word not in AMBIGUOUS_FOR_NUMBERS
    return True
