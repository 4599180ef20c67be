"""This user's own key: what rayflow signs with (the experiments it writes, so that a resume reads
back only what this user, or someone they named, wrote) and derives its per-user secrets from (the
proof that a kept cluster is the one this user's run made).

An Ed25519 key made on first use, in this user's cache (`keys/signing.key`, 0600 in a 0700
folder, refused when it is another user's or readable by others). Its public half, as text
(`KEY_PREFIX` + base64url), is what a signature names and what a team lists to trust one
another's experiments: it is an identity, not a secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from rayflow.errors import ClusterError
from rayflow.security.auth import cache_dir, private_folder

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

KEY_FILE = "signing.key"
KEY_PREFIX = "rfk1:"  # a public key as text: rfk1:<43 characters of base64url>


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def key_path() -> Path:
    return private_folder(cache_dir() / "keys") / KEY_FILE


def _seed() -> bytes:
    """The private key's 32 bytes: read from this user's key file, made there on first use (one
    exclusive create: two processes starting at once end up with the same key)."""
    path = key_path()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_seed(path)
    seed = os.urandom(32)
    with os.fdopen(fd, "w") as out:
        out.write(_b64(seed) + "\n")
    return seed


def _read_seed(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise ClusterError(
                f"{path} is another user's or readable by others: rayflow signs with it only as "
                "a file of this user's, mode 0600 (fix its mode, or remove it to make a new key)"
            )
        text = f.read(256).strip()
    try:
        seed = _unb64(text)
    except ValueError:
        seed = b""
    if len(seed) != 32:
        raise ClusterError(f"{path} is not a rayflow key (remove it to make a new one)")
    return seed


def signing_key() -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(_seed())


def public_id(key: Ed25519PrivateKey | None = None) -> str:
    """This user's public key as text (or `key`'s): what a signature names, what a team trusts."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = (key or signing_key()).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return KEY_PREFIX + _b64(raw)


def sign(data: bytes) -> tuple[str, str]:
    """(this user's public id, the signature of `data`, base64url)."""
    key = signing_key()
    return public_id(key), _b64(key.sign(data))


def verify(signer: str, signature: str, data: bytes) -> bool:
    """Whether `signature` is `signer`'s over `data` (False for anything malformed)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not isinstance(signer, str) or not signer.startswith(KEY_PREFIX):
        return False
    try:
        public = Ed25519PublicKey.from_public_bytes(_unb64(signer[len(KEY_PREFIX) :]))
        public.verify(_unb64(signature), data)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def valid_public_id(text: str) -> bool:
    try:
        return text.startswith(KEY_PREFIX) and len(_unb64(text[len(KEY_PREFIX) :])) == 32
    except ValueError:
        return False


def user_secret(purpose: str) -> bytes:
    """A secret of this user's for one purpose, derived from the key (nothing more to keep)."""
    return hmac.new(_seed(), b"rayflow:" + purpose.encode(), hashlib.sha256).digest()


def user_mac(purpose: str, data: str) -> str:
    """This user's MAC of `data` for `purpose` (hex): proof that this user made what carries it."""
    return hmac.new(user_secret(purpose), data.encode(), hashlib.sha256).hexdigest()
