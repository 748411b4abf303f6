"""Certificates made with `cryptography` carry the identities Kubernetes reads."""

from __future__ import annotations

import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from quorum.pki import CertificateAuthority


def test_client_certificate_names_user_and_groups_and_chains_to_the_ca() -> None:
    ca = CertificateAuthority.create("test-ca")
    pair = ca.issue("customer@example.com", ("quorum:customers", "team-a"))
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "customer@example.com"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "quorum:customers",
        "team-a",
    ]
    cert.verify_directly_issued_by(ca.cert)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages


def test_serving_certificate_has_ip_and_dns_names() -> None:
    ca = CertificateAuthority.create("test-ca")
    pair = ca.issue("apiserver", client=False, server_names=("127.0.0.1", "kubernetes.default"))
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert "kubernetes.default" in sans.get_values_for_type(x509.DNSName)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_ca_round_trips_through_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ca = CertificateAuthority.create("test-ca")
    ca.pair.write(tmp_path, "ca")
    loaded = CertificateAuthority.load(tmp_path)
    assert loaded.cert == ca.cert
    assert isinstance(loaded.key, ec.EllipticCurvePrivateKey)
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600
