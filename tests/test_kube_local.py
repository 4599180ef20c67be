"""scripts/kube_local: how the real control plane is built (the go.mod that replaces kubernetes'
staging modules, a folder per set of versions, a failure naming its module) and its certificates
(each identity's subject as the API server's authorizers read it, private files)."""

from __future__ import annotations

import stat

import pytest

from scripts.kube_local import build
from scripts.kube_local.pki import make_pki

# The head and the replace block of kubernetes' own go.mod (v1.36.3), shortened
UPSTREAM = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/sample-cli-plugin => ./staging/src/k8s.io/sample-cli-plugin
)
"""


def test_each_staging_module_is_replaced_by_its_published_release():
    go_mod = build.kubernetes_go_mod(UPSTREAM, "v1.36.3")
    assert "require k8s.io/kubernetes v1.36.3" in go_mod
    assert "\tk8s.io/api => k8s.io/api v0.36.3" in go_mod
    assert "\tk8s.io/client-go => k8s.io/client-go v0.36.3" in go_mod
    # an example module nothing built imports, not published at every release
    assert "sample-cli-plugin" not in go_mod and "./staging" not in go_mod


def test_another_set_of_versions_builds_in_a_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    here = build.build_dir()
    other = build.build_dir({**build.VERSIONS, "kuberay": "v1.5.0"})
    assert here != other and here.parent == other.parent == tmp_path / "rayflow" / "kube"
    assert build.build_dir() == here  # the same versions: the same folder, reused


def test_a_failed_build_names_its_module_and_ends_with_the_compilers_words():
    err = build.BuildFailed(
        "github.com/ray-project/kuberay/ray-operator",
        "\n".join(f"line {i}" for i in range(50)) + "\n403 Forbidden",
    )
    text = str(err)
    assert text.startswith("building github.com/ray-project/kuberay/ray-operator failed:")
    assert text.endswith("403 Forbidden") and "line 10" not in text


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki") / "pki", ("127.0.0.1", "10.89.0.1"), ("a", "b"))


def _cert(pki, name):
    from cryptography import x509

    return x509.load_pem_x509_certificate((pki / f"{name}.crt").read_bytes())


def test_every_identity_is_signed_by_the_ca_with_the_subject_the_authorizers_read(pki):
    from cryptography.x509.oid import NameOID

    ca = _cert(pki, "ca")

    def subject(name):
        cert = _cert(pki, name)
        cert.verify_directly_issued_by(ca)
        read = cert.subject.get_attributes_for_oid
        return read(NameOID.COMMON_NAME)[0].value, [
            a.value for a in read(NameOID.ORGANIZATION_NAME)
        ]

    assert subject("admin") == ("rayflow-admin", ["system:masters"])
    assert subject("controller-manager") == ("system:kube-controller-manager", [])
    assert subject("scheduler") == ("system:kube-scheduler", [])
    assert subject("node-a") == ("system:node:a", ["system:nodes"])
    assert subject("node-b") == ("system:node:b", ["system:nodes"])
    assert subject("etcd-client") == ("kube-apiserver-etcd-client", [])


def test_the_api_servers_certificate_names_what_a_pod_dials(pki):
    import ipaddress

    from cryptography import x509

    sans = _cert(pki, "apiserver").extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert {str(ip) for ip in sans.value.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1",
        "10.89.0.1",
    }
    assert "kubernetes.default.svc" in sans.value.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("10.89.0.1") in sans.value.get_values_for_type(x509.IPAddress)


def test_keys_are_private(pki):
    assert stat.S_IMODE(pki.stat().st_mode) == 0o700
    for path in pki.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
