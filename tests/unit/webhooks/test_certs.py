"""`quorum certs`: the server's own CA for a namespace, and the files of a rotation in which the
apiserver trusts the old and the new CA while the servers switch certificates."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from hypothesis import given
from hypothesis import strategies as st

from quorum.cli import main
from quorum.install import InvalidNamespace
from quorum.webhooks import tls
from quorum.webhooks.certs import CertsError, ca_bundle, certificates_in, names_of, write

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"
CONFIGURATIONS = MANIFESTS / "30-webhook-configurations.yaml"


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def bundle_of(config: dict[str, Any]) -> list[bytes]:
    """The caBundle of every webhook of a configuration (all alike), as PEM certificates."""
    bundles = {w["clientConfig"]["caBundle"] for w in config["webhooks"]}
    assert len(bundles) == 1
    return [
        c.public_bytes(serialization.Encoding.PEM) for c in certificates_in(base64.b64decode(bundles.pop()))
    ]


def trusted_by(cert_pem: bytes, bundle: list[bytes]) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    for ca_pem in bundle:
        try:
            cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
        except (ValueError, InvalidSignature):
            continue
        return True
    return False


def test_own_ca_gives_a_secret_and_configurations_with_the_ca_bundle(tmp_path: Path) -> None:
    written = write(tmp_path, "quorum-system", CONFIGURATIONS)
    assert {p.name for p in written} == {
        "ca.crt",
        "tls.crt",
        "tls.key",
        "secret.yaml",
        "webhook-configurations.yaml",
    }
    secret = yaml.safe_load((tmp_path / "secret.yaml").read_text())
    assert secret["metadata"] == {
        "name": "quorum-webhooks-tls",
        "namespace": "quorum-system",
        "labels": {"app.kubernetes.io/part-of": "quorum"},
    }
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "quorum-webhooks.quorum-system.svc" in names.get_values_for_type(x509.DNSName)
    ca = (tmp_path / "ca.crt").read_bytes()
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    configs = load(tmp_path / "webhook-configurations.yaml")
    assert [c["kind"] for c in configs] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    for config in configs:
        assert "cert-manager.io/inject-ca-from" not in (config["metadata"].get("annotations") or {})
        for webhook in config["webhooks"]:
            assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == ca
            assert webhook["clientConfig"]["service"]["name"] == "quorum-webhooks"


def test_another_namespace_gets_its_service_names_secret_and_configurations(tmp_path: Path) -> None:
    write(tmp_path, "gpu-admission", CONFIGURATIONS, extra_names=("127.0.0.1",))
    assert names_of((tmp_path / "tls.crt").read_bytes()) == {
        "quorum-webhooks",
        "quorum-webhooks.gpu-admission",
        "quorum-webhooks.gpu-admission.svc",
        "quorum-webhooks.gpu-admission.svc.cluster.local",
        "127.0.0.1",
    }
    secret = yaml.safe_load((tmp_path / "secret.yaml").read_text())
    assert secret["metadata"]["namespace"] == "gpu-admission"
    for config in load(tmp_path / "webhook-configurations.yaml"):
        for webhook in config["webhooks"]:
            assert webhook["clientConfig"]["service"]["namespace"] == "gpu-admission"
    for path in tmp_path.iterdir():
        assert "quorum-system" not in path.read_text(), path


def test_rotation_trusts_both_cas_then_the_new_one_and_never_writes_a_ca_key(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    write(old, "quorum-system", CONFIGURATIONS)
    written = write(new, "quorum-system", CONFIGURATIONS, rotate_from=old)
    assert {p.name for p in written} == {
        "ca.crt",
        "tls.crt",
        "tls.key",
        "secret.yaml",
        "ca-bundle.crt",
        "webhook-configurations.yaml",
        "webhook-configurations-overlap.yaml",
    }
    old_ca, new_ca = (old / "ca.crt").read_bytes(), (new / "ca.crt").read_bytes()
    old_cert, new_cert = (old / "tls.crt").read_bytes(), (new / "tls.crt").read_bytes()
    assert old_ca != new_ca
    # Step 1: trust both; the servers still present the old certificate, then the new one.
    for config in load(new / "webhook-configurations-overlap.yaml"):
        assert bundle_of(config) == [old_ca, new_ca]
        assert trusted_by(old_cert, bundle_of(config))
        assert trusted_by(new_cert, bundle_of(config))
    assert (new / "ca-bundle.crt").read_bytes() == old_ca + new_ca
    # Step 2: the new serving certificate.
    secret = yaml.safe_load((new / "secret.yaml").read_text())
    assert base64.b64decode(secret["data"]["tls.crt"]) == new_cert
    # Step 3: the new CA only.
    for config in load(new / "webhook-configurations.yaml"):
        assert bundle_of(config) == [new_ca]
        assert not trusted_by(old_cert, bundle_of(config))
    # The only private key written anywhere is the serving certificate's.
    for directory in (old, new):
        cert = x509.load_pem_x509_certificate((directory / "tls.crt").read_bytes())
        holding_keys = {p.name for p in directory.iterdir() if b"PRIVATE KEY" in p.read_bytes()}
        assert holding_keys == {"tls.key"}
        key = serialization.load_pem_private_key((directory / "tls.key").read_bytes(), None)
        assert key.public_key() == cert.public_key()
        assert "tls.key" in yaml.safe_load((directory / "secret.yaml").read_text())["data"]
    # Running the same command again gives the same files (a failed apply can be retried).
    write(new, "quorum-system", CONFIGURATIONS, rotate_from=old)
    assert (new / "tls.crt").read_bytes() == new_cert


def test_a_second_rotation_drops_the_first_ca(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write(a, "quorum-system", CONFIGURATIONS)
    write(b, "quorum-system", CONFIGURATIONS, rotate_from=a)
    write(c, "quorum-system", CONFIGURATIONS, rotate_from=b)
    ca_b, ca_c = (b / "ca.crt").read_bytes(), (c / "ca.crt").read_bytes()
    assert (c / "ca-bundle.crt").read_bytes() == ca_b + ca_c


def test_refusals(tmp_path: Path) -> None:
    old = tmp_path / "old"
    write(old, "quorum-system", CONFIGURATIONS)
    with pytest.raises(CertsError, match="new directory"):
        write(old, "quorum-system", CONFIGURATIONS, rotate_from=old)
    with pytest.raises(CertsError, match="no CA to rotate from"):
        write(tmp_path / "x", "quorum-system", CONFIGURATIONS, rotate_from=tmp_path / "missing")
    with pytest.raises(CertsError, match="needs the webhook configurations"):
        write(tmp_path / "y", "quorum-system", None, rotate_from=old)
    with pytest.raises(CertsError, match="other names"):
        write(old, "elsewhere", CONFIGURATIONS)
    with pytest.raises(InvalidNamespace):
        write(tmp_path / "z", "Not_A_Namespace", CONFIGURATIONS)
    assert not (tmp_path / "x").exists()
    assert not (tmp_path / "y").exists()


def test_command_prints_the_three_steps_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "--out", str(tmp_path / "a"), "--namespace", "gpu-admission"]) == 0
    capsys.readouterr()
    argv = [
        "certs",
        "--out",
        str(tmp_path / "b"),
        "--namespace",
        "gpu-admission",
        "--rotate-from",
        str(tmp_path / "a"),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    steps = [line for line in out.splitlines() if line[:3] in ("1. ", "2. ", "3. ")]
    assert steps == [
        f"1. kubectl apply -f {tmp_path / 'b' / 'webhook-configurations-overlap.yaml'}",
        f"2. kubectl apply -f {tmp_path / 'b' / 'secret.yaml'}",
        f"3. kubectl apply -f {tmp_path / 'b' / 'webhook-configurations.yaml'}",
    ]
    assert main(["certs", "--out", str(tmp_path / "a"), "--rotate-from", str(tmp_path / "a")]) == 2
    assert "new directory" in capsys.readouterr().err


def test_service_names_and_dev_names() -> None:
    assert tls.service_names("ns") == (
        "quorum-webhooks",
        "quorum-webhooks.ns",
        "quorum-webhooks.ns.svc",
        "quorum-webhooks.ns.svc.cluster.local",
    )
    assert tls.LOOPBACK_NAMES == ("127.0.0.1", "localhost")


_CAS = [tls.issue(("a.example",))[0] for _ in range(4)]


@given(st.lists(st.lists(st.integers(0, len(_CAS) - 1), min_size=1, max_size=3), max_size=4))
def test_ca_bundle_keeps_each_certificate_once_in_first_seen_order(picks: list[list[int]]) -> None:
    pems = [b"".join(_CAS[i] for i in group) for group in picks]
    expected = list(dict.fromkeys(i for group in picks for i in group))
    assert ca_bundle(*pems) == b"".join(_CAS[i] for i in expected)


def test_dev_certificates_are_for_loopback(tmp_path: Path) -> None:
    _, cert, _ = tls.dev_certificates(tmp_path)
    assert names_of(cert.read_bytes()) == {"localhost", "127.0.0.1"}
