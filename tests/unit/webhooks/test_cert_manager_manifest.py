"""manifests/optional/cert-manager.yaml: the serving certificate is renewed under a CA that stays
(a new key per serving renewal, never a new CA key), and the injected caBundle is that CA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"


def hours(duration: str) -> int:
    assert duration.endswith("h"), duration
    return int(duration[:-1])


def by_kind_and_name() -> dict[tuple[str, str], dict[str, Any]]:
    docs = yaml.safe_load_all((MANIFESTS / "optional" / "cert-manager.yaml").read_text())
    return {(d["kind"], d["metadata"]["name"]): d for d in docs if d}


def test_serving_certificate_is_signed_by_a_ca_that_keeps_its_key() -> None:
    objects = by_kind_and_name()
    serving = objects["Certificate", "quorum-webhooks"]["spec"]
    docs = yaml.safe_load_all((MANIFESTS / "20-webhooks-deployment.yaml").read_text())
    deployment = next(d for d in docs if d and d["kind"] == "Deployment")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"secretName": serving["secretName"]} in [v.get("secret") for v in volumes]
    assert serving.get("isCA") is not True
    assert serving["privateKey"]["rotationPolicy"] == "Always"

    issuer = objects["Issuer", serving["issuerRef"]["name"]]["spec"]
    ca = next(
        c["spec"]
        for (kind, _), c in objects.items()
        if kind == "Certificate" and c["spec"]["secretName"] == issuer["ca"]["secretName"]
    )
    assert ca["isCA"] is True
    # Renewed with the same key and name: the old and the renewed CA certificate verify each
    # other's serving certificates, so a CA renewal never breaks the caBundle in place.
    assert ca["privateKey"]["rotationPolicy"] == "Never"
    assert ca["commonName"]
    assert "selfSigned" in objects["Issuer", ca["issuerRef"]["name"]]["spec"]
    # The caBundle follows the renewed CA at the next serving renewal, before the old copy expires.
    assert hours(ca["renewBefore"]) > hours(serving["duration"])
    assert hours(ca["duration"]) > 10 * hours(serving["duration"])


def test_configurations_inject_the_ca_of_the_serving_certificate() -> None:
    configs = yaml.safe_load_all((MANIFESTS / "30-webhook-configurations.yaml").read_text())
    serving = by_kind_and_name()["Certificate", "quorum-webhooks"]["metadata"]
    for config in configs:
        if config:
            annotation = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            assert annotation == f"{serving['namespace']}/{serving['name']}"
