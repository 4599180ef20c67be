"""A throwaway certificate authority and a server certificate for loopback TLS in tests.

`throwaway_pki(folder)` writes ca.crt (a self-signed CA), server.crt and server.key (signed by it,
for 127.0.0.1 and localhost) and returns their paths; `server_context(pki)` is the ssl context
that serves them. Made by the local control plane's certificate builder (scripts/kube_local/pki),
shaped to pass OpenSSL's strict X.509
checks (Python 3.13's VERIFY_X509_STRICT default): a critical basicConstraints and keyUsage on
the CA, subject/authority key identifiers, serverAuth on the leaf, IP and DNS SANs. P-256 keys:
fast to make, and every client here speaks ECDSA.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import NamedTuple


class Pki(NamedTuple):
    ca_path: str
    cert_path: str
    key_path: str


def throwaway_pki(
    folder: str | os.PathLike,
    ips: tuple[str, ...] = ("127.0.0.1",),
    dns_names: tuple[str, ...] = ("localhost",),
) -> Pki:
    from scripts.kube_local.pki import certificate, new_key, save

    folder = Path(folder)
    ca_key = new_key()
    ca = certificate("rayflow-test-kube-ca", None, ca_key)
    key = new_key()
    server = certificate(
        "kube-apiserver", None, key, ca, ca_key, server=True, ips=tuple(ips), names=tuple(dns_names)
    )
    save(folder, "ca", ca, ca_key)
    save(folder, "server", server, key)
    (folder / "ca.key").unlink()  # nothing here signs more
    return Pki(str(folder / "ca.crt"), str(folder / "server.crt"), str(folder / "server.key"))


def server_context(pki: Pki) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(pki.cert_path, pki.key_path)
    return context
