from __future__ import annotations

import base64
from pathlib import Path

import yaml
from cryptography import x509

from quorum.webhooks.certs import write

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"


def test_own_ca_gives_a_secret_and_configurations_with_the_ca_bundle(tmp_path: Path) -> None:
    written = write(tmp_path, "quorum-system", MANIFESTS / "30-webhook-configurations.yaml")
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
    configs = list(yaml.safe_load_all((tmp_path / "webhook-configurations.yaml").read_text()))
    assert [c["kind"] for c in configs] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    for config in configs:
        assert "cert-manager.io/inject-ca-from" not in (config["metadata"].get("annotations") or {})
        for webhook in config["webhooks"]:
            assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == ca
            assert webhook["clientConfig"]["service"]["name"] == "quorum-webhooks"
