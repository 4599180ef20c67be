"""Who wrote what rayflow reads back from a store: signatures over canonical JSON, by this user's
key (rayflow.security.keys), or on a cluster's head by a key this user delegated to one run.

A document rayflow writes to be read back (an experiment's manifest, a lease: rayflow.results
.signing, rayflow.results.lease) goes out sealed:
`{"<kind>": DOC, "signer": ID, "signature": SIG}`, SIG over `canonical(DOC)`. Read back, it is
believed only when the signature verifies and its issuer is trusted: this user's own key, or one
named in `trusted_signers` (a team sharing a bucket on purpose).

A run submitted to a cluster (vm, kuberay) writes its experiment from the head, which never holds
this user's key: the submitting side makes a key for that one run and signs a certificate for it
(`delegation_env`: the run's public key, this user's as the issuer, the experiment it may sign);
the job's driver takes both out of its environment before any user code runs (`take_delegate`)
and seals with them, certificate attached. A sealed document's issuer is then this user, for that
experiment only (a name, or its `-N` suffixed copies).
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from typing import TYPE_CHECKING, Any

from rayflow.security import keys
from rayflow.security.result_channel import scrub_job_config

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

DELEGATE_ENV = "RAYFLOW_SIGNING_KEY"  # in a submitted job's env_vars; taken out at once


class _Delegate:
    """The key this user delegated to this run, and its sealed certificate, once a job's driver
    took them (`take_delegate`); None elsewhere. Process-wide: they come in this process's
    environment, and everything the driver's run seals from then on (the manifest, the lease) is
    sealed with them, whichever object seals it; its one instance is `_DELEGATE`."""

    def __init__(self) -> None:
        self.taken: tuple[Ed25519PrivateKey, dict[str, Any]] | None = None


_DELEGATE = _Delegate()


def canonical(doc: Any) -> bytes:
    """The one byte string a document is signed as: JSON, keys sorted, no spaces, ASCII."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def own_id() -> str:
    """Whose experiments this process writes: this user's public id (on a head: the issuer of the
    delegation it was handed)."""
    taken = _DELEGATE.taken
    return taken[1]["cert"]["issuer"] if taken else keys.public_id()


def trusted(extra: Any = ()) -> set[str]:
    """The issuers this process believes: its own, and the `trusted_signers` given."""
    return {own_id(), *(str(e) for e in extra or ())}


def seal(kind: str, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` signed by this process's key, under `kind`."""
    data = canonical(doc)
    taken = _DELEGATE.taken
    if taken is None:
        signer, signature = keys.sign(data)
        return {kind: doc, "signer": signer, "signature": signature}
    key, delegation = taken
    return {
        kind: doc,
        "signer": keys.public_id(key),
        "signature": _b64(key.sign(data)),
        "delegation": delegation,
    }


def issuer(sealed: Any, kind: str, experiment: str) -> str | None:
    """Who sealed `sealed[kind]` (a user's public id), where its signature verifies (and its
    delegation, for `experiment`, the folder's name); None for anything else."""
    if not isinstance(sealed, dict) or not isinstance(sealed.get(kind), dict):
        return None
    signer, signature = sealed.get("signer"), sealed.get("signature")
    data = canonical(sealed[kind])
    if not isinstance(signer, str) or not isinstance(signature, str):
        return None
    if not keys.verify(signer, signature, data):
        return None
    delegation = sealed.get("delegation")
    if delegation is None:
        return str(signer)
    cert = delegation.get("cert") if isinstance(delegation, dict) else None
    if not isinstance(cert, dict) or cert.get("delegate") != signer:
        return None
    if not keys.verify(str(cert.get("issuer")), str(delegation.get("signature")), canonical(cert)):
        return None
    scope = str(cert.get("scope"))
    if experiment != scope and not re.fullmatch(re.escape(scope) + r"-\d{1,4}", experiment):
        return None
    return str(cert["issuer"])


def delegation_env(scope: str) -> dict[str, str]:
    """For a job that writes the experiment `scope` (its folder's name) on a cluster: a key made for
    it and this user's certificate for that key, as its environment carries them."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    cert = {
        "delegate": keys.public_id(key),
        "issuer": keys.public_id(),
        "scope": scope,
        "issued_at": round(time.time(), 3),
    }
    _, signature = keys.sign(canonical(cert))
    sealed = {"cert": cert, "signature": signature}
    return {DELEGATE_ENV: json.dumps({"seed": _b64(key.private_bytes_raw()), **sealed})}


def take_delegate() -> None:
    """On a job's driver, before any user code runs: the delegated key out of os.environ and out of
    the job config Ray hands to this driver's workers (the trials never see it)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    text = os.environ.pop(DELEGATE_ENV, None)
    scrub_job_config(DELEGATE_ENV)
    if not text:
        return
    given = json.loads(text)
    seed = str(given["seed"])
    key = Ed25519PrivateKey.from_private_bytes(
        base64.urlsafe_b64decode(seed + "=" * (-len(seed) % 4))
    )
    _DELEGATE.taken = key, {"cert": given["cert"], "signature": given["signature"]}


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")
