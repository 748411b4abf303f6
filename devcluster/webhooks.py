"""Registering quorum-webhooks with a local apiserver: the manifests' webhook configurations,
with each Service reference replaced by a URL on 127.0.0.1 and the dev CA as caBundle."""

from __future__ import annotations

import base64
import copy
from typing import Any

import yaml

CERT_MANAGER_ANNOTATION = "cert-manager.io/inject-ca-from"


def local_webhook_configurations(manifest: str, base_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The Mutating/ValidatingWebhookConfigurations of `manifest`, pointed at `base_url`."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in yaml.safe_load_all(manifest):
        if not doc or doc.get("kind") not in (
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ):
            continue
        doc = copy.deepcopy(doc)
        (doc["metadata"].get("annotations") or {}).pop(CERT_MANAGER_ANNOTATION, None)
        for webhook in doc["webhooks"]:
            path = webhook["clientConfig"]["service"].get("path", "/")
            webhook["clientConfig"] = {"url": base_url.rstrip("/") + path, "caBundle": ca_bundle}
        out.append(doc)
    return out
