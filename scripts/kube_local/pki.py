"""The local control plane's certificates and keys, as kubeadm lays them out, in one private folder.

One CA signs everything:
- the servers' certificates: the API server's, for its loopback and bridge addresses and the
  `kubernetes.default.svc` names a pod uses; etcd's, for loopback;
- the clients' certificates, whose subject is the identity the API server's authorizers see:
  - `rayflow-admin` in `system:masters`, the kubeconfig `up` prints;
  - `system:kube-controller-manager` and `system:kube-scheduler`, bound by the default RBAC
    roles;
  - `system:node:NAME` in `system:nodes`, one per Node, which the Node authorizer and the
    NodeRestriction admission plugin restrict to that Node and its pods;
  - `kuberay-operator`, bound to a ClusterRole of the operator's own rules (control_plane);
  - `kube-apiserver-etcd-client`, the only identity etcd accepts.
- the service accounts' token signing key (RSA, as the API server requires for its issuer).

Everything is written 0600 in a 0700 folder: a key in a shared place is someone else's.
P-256 keys: fast to make, and every client here speaks ECDSA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

VALID_DAYS = 30  # a local control plane lives for a session, rarely a month

# (file name, common name, organisation) of each client identity but the Nodes'
CLIENTS = (
    ("admin", "rayflow-admin", "system:masters"),
    ("controller-manager", "system:kube-controller-manager", None),
    ("scheduler", "system:kube-scheduler", None),
    ("kuberay-operator", "kuberay-operator", None),
    ("local-dns", "rayflow:local-dns", None),  # the process kubelet's reader of Services
    ("etcd-client", "kube-apiserver-etcd-client", None),
)
SERVICE_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def save(folder: Path, name: str, cert, key) -> None:
    from cryptography.hazmat.primitives import serialization

    _write(folder / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM))
    _write(
        folder / f"{name}.key",
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def certificate(
    cn: str,
    org: str | None,
    key,
    ca=None,
    ca_key=None,
    server: bool = False,
    ips: tuple[str, ...] = (),
    names: tuple[str, ...] = (),
):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    subject = x509.Name(attributes)
    now = datetime.datetime.now(datetime.UTC)
    is_ca = ca is None
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if is_ca else ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=is_ca,
                crl_sign=is_ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if not is_ca:
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server:
            usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    if ips or names:
        sans = [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        sans += [x509.DNSName(n) for n in names]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(key if is_ca else ca_key, hashes.SHA256())


def make_pki(folder: Path, api_ips: tuple[str, ...], nodes: tuple[str, ...]) -> Path:
    """Every certificate and key of the control plane under `folder` (made 0700)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    ca_key = new_key()
    ca = certificate("rayflow-local-ca", None, ca_key)
    save(folder, "ca", ca, ca_key)
    api_key = new_key()
    api = certificate(
        "kube-apiserver", None, api_key, ca, ca_key, server=True, ips=api_ips, names=SERVICE_NAMES
    )
    save(folder, "apiserver", api, api_key)
    etcd_key = new_key()
    etcd = certificate(
        "etcd", None, etcd_key, ca, ca_key, server=True, ips=("127.0.0.1",), names=("localhost",)
    )
    save(folder, "etcd", etcd, etcd_key)
    identities = [*CLIENTS, *((f"node-{n}", f"system:node:{n}", "system:nodes") for n in nodes)]
    for name, cn, org in identities:
        key = new_key()
        save(folder, name, certificate(cn, org, key, ca, ca_key), key)
    signing = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(
        folder / "sa.key",
        signing.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    _write(
        folder / "sa.pub",
        signing.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return folder
