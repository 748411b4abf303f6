"""`quorum certs`: the webhook server's own CA, for clusters without cert-manager.

Writes into a directory: `ca.crt`, `tls.crt`, `tls.key` (made by `quorum.webhooks.tls`),
`secret.yaml` (the Secret `quorum-system/quorum-webhooks-tls` the Deployment mounts) and, given
the manifests' webhook configurations, `webhook-configurations.yaml` with the caBundle filled
in. Apply both; to rotate, run it again into an empty directory and apply again (the server
reloads the mounted certificate without a restart)."""

from __future__ import annotations

import argparse
import base64
from pathlib import Path
from typing import Any

import yaml

from quorum.webhooks import tls

SECRET_NAME = "quorum-webhooks-tls"  # noqa: S105 (a name, not a secret)


def secret_manifest(ca: bytes, cert: bytes, key: bytes, namespace: str) -> dict[str, Any]:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {
            "name": SECRET_NAME,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "quorum"},
        },
        "data": {"tls.crt": b64(cert), "tls.key": b64(key), "ca.crt": b64(ca)},
    }


def with_ca_bundle(manifest: str, ca: bytes) -> list[dict[str, Any]]:
    """The webhook configurations of `manifest` with caBundle set (cert-manager's annotation
    dropped, since the CA is ours)."""
    bundle = base64.b64encode(ca).decode()
    docs = []
    for doc in yaml.safe_load_all(manifest):
        if not doc:
            continue
        (doc["metadata"].get("annotations") or {}).pop("cert-manager.io/inject-ca-from", None)
        for webhook in doc.get("webhooks", []):
            webhook["clientConfig"]["caBundle"] = bundle
        docs.append(doc)
    return docs


def write(out: Path, namespace: str, configurations: Path | None) -> list[Path]:
    ca_file, cert_file, key_file = tls.dev_certificates(out)
    ca, cert, key = ca_file.read_bytes(), cert_file.read_bytes(), key_file.read_bytes()
    written = [ca_file, cert_file, key_file]
    secret = out / "secret.yaml"
    secret.write_text(yaml.safe_dump(secret_manifest(ca, cert, key, namespace), sort_keys=False))
    secret.chmod(0o600)
    written.append(secret)
    if configurations is not None:
        target = out / "webhook-configurations.yaml"
        target.write_text(yaml.safe_dump_all(with_ca_bundle(configurations.read_text(), ca), sort_keys=False))
        written.append(target)
    return written


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = subparsers.add_parser(
        "certs", help="make the webhook server's CA and serving certificate (no cert-manager)"
    )
    certs.add_argument("--out", type=Path, required=True, help="directory to write into")
    certs.add_argument("--namespace", default="quorum-system")
    certs.add_argument(
        "--webhook-configurations",
        type=Path,
        default=Path("manifests/30-webhook-configurations.yaml"),
        help="the webhook configurations to fill with the caBundle",
    )
    certs.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    configurations = args.webhook_configurations if args.webhook_configurations.exists() else None
    for path in write(args.out, args.namespace, configurations):
        print(path)
    print("\nkubectl apply -f", args.out / "secret.yaml")
    if configurations is not None:
        print("kubectl apply -f", args.out / "webhook-configurations.yaml")
    return 0
