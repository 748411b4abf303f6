"""`quorum certs`: the webhook server's own CA, for clusters without cert-manager.

`quorum certs --out DIR [--namespace X]` writes into DIR:
  ca.crt, tls.crt, tls.key       a new CA and a serving certificate for the Service
                                 quorum-webhooks in X (made by `quorum.webhooks.tls`)
  secret.yaml                    the Secret X/quorum-webhooks-tls the Deployment mounts
  webhook-configurations.yaml    the webhook configurations, for X, with caBundle = ca.crt

`--rotate-from OLD` (OLD: the directory of the certificate in use) adds
  ca-bundle.crt                          OLD's CA and the new one
  webhook-configurations-overlap.yaml    the configurations trusting both
to be applied in three steps: the overlap configurations, then the Secret (the servers reload
it), then the new-CA-only configurations. The apiserver trusts whichever certificate a server
presents at every moment. Keep DIR for the next rotation; OLD can go.

The CA's key exists only in memory while the serving certificate is signed: no file holds it,
and each rotation makes a new CA."""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from quorum import install
from quorum.webhooks import tls

SECRET_NAME = "quorum-webhooks-tls"  # noqa: S105 (a name, not a secret)
CONFIGURATION_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
CERT_MANAGER_ANNOTATION = "cert-manager.io/inject-ca-from"


class CertsError(ValueError):
    pass


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
    dropped, since the CA is ours). Other documents are left out."""
    bundle = base64.b64encode(ca).decode()
    docs = []
    for doc in yaml.safe_load_all(manifest):
        if not doc or doc.get("kind") not in CONFIGURATION_KINDS:
            continue
        (doc["metadata"].get("annotations") or {}).pop(CERT_MANAGER_ANNOTATION, None)
        for webhook in doc.get("webhooks", []):
            webhook["clientConfig"]["caBundle"] = bundle
        docs.append(doc)
    return docs


def certificates_in(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise CertsError(f"not PEM certificates: {err}") from err


def ca_bundle(*pems: bytes) -> bytes:
    """The certificates of `pems` in order, each once: what a caBundle holds during a switch."""
    seen: set[bytes] = set()
    out = []
    for pem in pems:
        for cert in certificates_in(pem):
            der = cert.public_bytes(serialization.Encoding.DER)
            if der not in seen:
                seen.add(der)
                out.append(cert.public_bytes(serialization.Encoding.PEM))
    return b"".join(out)


def names_of(cert_pem: bytes) -> set[str]:
    """The DNS names and IP addresses a serving certificate is for."""
    try:
        sans = certificates_in(cert_pem)[0].extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (IndexError, x509.ExtensionNotFound):
        return set()
    dns = sans.value.get_values_for_type(x509.DNSName)
    return set(dns) | {str(ip) for ip in sans.value.get_values_for_type(x509.IPAddress)}


def write(
    out: Path,
    namespace: str,
    configurations: Path | None,
    *,
    extra_names: tuple[str, ...] = (),
    rotate_from: Path | None = None,
) -> list[Path]:
    """Write the files of the module docstring; return their paths. A DIR that already holds a
    certificate for these names is reused (running the same command twice gives the same files)."""
    install.check_namespace(namespace)
    names = tuple(dict.fromkeys(tls.service_names(namespace) + extra_names))
    old_ca = b""
    if rotate_from is not None:
        if configurations is None:
            raise CertsError("a rotation needs the webhook configurations (for the overlap)")
        if rotate_from.resolve() == out.resolve():
            raise CertsError("--out must be a new directory, not the one rotated from")
        try:
            old_ca = (rotate_from / "ca.crt").read_bytes()
        except OSError as err:
            raise CertsError(f"no CA to rotate from: {err}") from err
        certificates_in(old_ca)
    existing = out / "tls.crt"
    if existing.exists() and not set(names) <= names_of(existing.read_bytes()):
        raise CertsError(f"{existing} is a certificate for other names: use an empty directory")
    ca_file, cert_file, key_file = tls.certificates(out, names)
    ca, cert, key = ca_file.read_bytes(), cert_file.read_bytes(), key_file.read_bytes()
    written = [ca_file, cert_file, key_file]
    secret = out / "secret.yaml"
    secret.write_text(yaml.safe_dump(secret_manifest(ca, cert, key, namespace), sort_keys=False))
    secret.chmod(0o600)
    written.append(secret)
    if rotate_from is not None:
        bundle_file = out / "ca-bundle.crt"
        bundle_file.write_bytes(ca_bundle(old_ca, ca))
        written.append(bundle_file)
    if configurations is not None:
        manifest = install.render(configurations.read_text(), namespace)
        target = out / "webhook-configurations.yaml"
        target.write_text(yaml.safe_dump_all(with_ca_bundle(manifest, ca), sort_keys=False))
        written.append(target)
        if rotate_from is not None:
            overlap = out / "webhook-configurations-overlap.yaml"
            both = ca_bundle(old_ca, ca)
            overlap.write_text(yaml.safe_dump_all(with_ca_bundle(manifest, both), sort_keys=False))
            written.append(overlap)
    return written


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = subparsers.add_parser(
        "certs",
        help="make the webhook server's CA and serving certificate (no cert-manager)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    certs.add_argument("--out", type=Path, required=True, help="directory to write into")
    certs.add_argument("--namespace", default=install.DEFAULT_NAMESPACE, help="where quorum runs")
    certs.add_argument(
        "--rotate-from",
        type=Path,
        metavar="OLD",
        help="the directory of the certificate in use: also write the files of a switch in which "
        "the apiserver trusts both CAs",
    )
    certs.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME",
        help="another DNS name or IP address for the serving certificate (repeatable)",
    )
    certs.add_argument(
        "--webhook-configurations",
        type=Path,
        default=install.MANIFESTS / "30-webhook-configurations.yaml",
        help="the webhook configurations to fill with the caBundle (rendered for --namespace)",
    )
    certs.set_defaults(func=run)


def steps(out: Path, configurations: bool, rotating: bool) -> list[str]:
    """What to run after `write`, in order, with what to wait for between the steps."""
    secret = f"kubectl apply -f {out / 'secret.yaml'}"
    configs = f"kubectl apply -f {out / 'webhook-configurations.yaml'}"
    if not rotating:
        return [secret, configs] if configurations else [secret]
    return [
        f"kubectl apply -f {out / 'webhook-configurations-overlap.yaml'}\n"
        "   then wait until the caBundle of both configurations holds two certificates",
        f"{secret}\n   then wait until every quorum-webhooks pod presents the new certificate "
        "(the kubelet refreshes the Secret within about a minute; the server reloads it within "
        "cert_reload_seconds; its log says 'serving certificate reloaded' and "
        "quorum_webhook_certificate_reloads_total goes up)",
        f"{configs}\n   keep {out} for the next rotation",
    ]


def run(args: argparse.Namespace) -> int:
    configurations = args.webhook_configurations if args.webhook_configurations.exists() else None
    try:
        written = write(
            args.out,
            args.namespace,
            configurations,
            extra_names=tuple(args.san),
            rotate_from=args.rotate_from,
        )
        plan = steps(args.out, configurations is not None, args.rotate_from is not None)
    except (CertsError, install.InvalidNamespace) as err:
        print(f"quorum certs: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    print()
    for number, step in enumerate(plan, 1):
        print(f"{number}. {step}" if len(plan) > 1 else step)
    return 0
