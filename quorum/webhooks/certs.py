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
and each rotation makes a new CA.

`quorum certs ensure --namespace X [--renew-before DAYS] [--san NAME] [--absent-ok]` does the
same in the cluster, for a Helm chart's hook Job (or a person): it makes the Secret
X/quorum-webhooks-tls if it is absent or unusable, renews it when it expires within DAYS
(default 30), and sets the caBundle of quorum's webhook configurations (with `--absent-ok`, of
those installed: before an install, none); a run with nothing to do writes nothing
(`quorum.commands.certs_ensure` has its steps, its order and the rights it needs)."""

from __future__ import annotations

import argparse
import base64
import datetime
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from quorum import install, pki
from quorum.webhooks import tls

SECRET_NAME = "quorum-webhooks-tls"  # noqa: S105 (a name, not a secret)
CONFIGURATION_NAME = "quorum-webhooks"
DEFAULT_RENEW_BEFORE_DAYS = 30
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


# -- `quorum certs ensure`: what to do, decided from what is there (pure) --------------------------


@dataclass(frozen=True)
class SecretState:
    """What the Secret holds, judged for `ensure`."""

    renew: bool
    reason: str  # e.g. "absent", "valid until 2027-11-27 (renewed 30 days before)"
    ca_pem: bytes  # the certificates of its ca.crt that parse; b"" if none
    # tls.crt is signed by ca.crt: the servers present a certificate the Secret's CA vouches for.
    presents_own_ca: bool


def _date(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def assess_secret(
    data: Mapping[str, bytes] | None,
    names: tuple[str, ...],
    now: datetime.datetime,
    renew_before: datetime.timedelta,
) -> SecretState:
    """Whether the Secret's certificate (its data, decoded; None if the Secret is absent) must
    be made again: absent, unusable, not for `names`, or expiring within `renew_before`."""
    if data is None:
        return SecretState(True, "absent", b"", False)
    try:
        ca_pem = ca_bundle(data.get("ca.crt") or b"")
    except CertsError:
        ca_pem = b""
    missing = [k for k in ("tls.crt", "tls.key", "ca.crt") if not data.get(k)]
    if missing:
        return SecretState(True, f"has no {', '.join(missing)}", ca_pem, False)
    try:
        cert = certificates_in(data["tls.crt"])[0]
        key = serialization.load_pem_private_key(data["tls.key"], None)
    except (CertsError, IndexError, ValueError, TypeError):
        return SecretState(True, "tls.crt or tls.key does not parse", ca_pem, False)
    own_ca = any(_signed_by(cert, ca) for ca in certificates_in(ca_pem)) if ca_pem else False
    if key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        return SecretState(True, "tls.key is not the key of tls.crt", ca_pem, own_ca)
    if not own_ca:
        return SecretState(True, "tls.crt is not signed by its ca.crt", ca_pem, False)
    lacking = sorted(set(names) - names_of(cert.public_bytes(serialization.Encoding.PEM)))
    if lacking:
        return SecretState(True, f"tls.crt is not for {', '.join(lacking)}", ca_pem, own_ca)
    expires = min([cert.not_valid_after_utc] + [c.not_valid_after_utc for c in certificates_in(ca_pem)])
    if expires <= now:
        return SecretState(True, f"expired on {_date(expires)}", ca_pem, own_ca)
    if expires - now <= renew_before:
        return SecretState(
            True, f"expires on {_date(expires)}, within {renew_before.days} days: renewing", ca_pem, own_ca
        )
    return SecretState(False, f"valid until {_date(expires)}", ca_pem, own_ca)


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _lenient(bundle: bytes) -> bytes:
    """The certificates of a caBundle that parse (a garbled bundle trusts nothing)."""
    try:
        return ca_bundle(bundle)
    except CertsError:
        return b""


def bundle_for(current: bytes, state: SecretState, new_ca: bytes | None) -> bytes:
    """The caBundle a webhook needs, given the one it has.

    Without a new CA: the Secret's CA added if it is missing, nothing removed. With one (a
    renewal): written before the Secret, so the apiserver trusts both what the servers present
    now and what they present once they load the new Secret, whenever each does. That is the
    old Secret's CA and the new one when the old certificate was its CA's (what servers of that
    Secret present); else, not knowing what they present, everything trusted now plus the new
    CA. The next renewal drops the older CA: a year on, every server has loaded the Secret."""
    if new_ca is None:
        if not state.ca_pem or _ders(state.ca_pem) <= _ders(current):
            return current
        return _joined(_lenient(current), state.ca_pem)
    if state.presents_own_ca:
        return _joined(state.ca_pem, new_ca)
    return _joined(_lenient(current), state.ca_pem, new_ca)


def _joined(*pems: bytes) -> bytes:
    return ca_bundle(*(p for p in pems if p))


def _ders(bundle: bytes) -> set[bytes]:
    pem = _lenient(bundle)
    return {c.public_bytes(serialization.Encoding.DER) for c in certificates_in(pem)} if pem else set()


def configuration_patch(
    configuration: Mapping[str, Any], bundle: Callable[[bytes], bytes]
) -> list[dict[str, Any]] | None:
    """The JSON patch that gives each webhook of `configuration` the caBundle `bundle(its
    current one)` and drops cert-manager's injection annotation (the CA is quorum's); None if
    nothing would change. It applies only to the version read (resourceVersion tested)."""
    ops: list[dict[str, Any]] = []
    for index, webhook in enumerate(configuration.get("webhooks") or []):
        current = base64.b64decode((webhook.get("clientConfig") or {}).get("caBundle") or "")
        wanted = bundle(current)
        if wanted != current:
            value = base64.b64encode(wanted).decode()
            ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": value})
    if CERT_MANAGER_ANNOTATION in (configuration["metadata"].get("annotations") or {}):
        path = "/metadata/annotations/" + CERT_MANAGER_ANNOTATION.replace("~", "~0").replace("/", "~1")
        ops.append({"op": "remove", "path": path})
    if not ops:
        return None
    version = {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": configuration["metadata"]["resourceVersion"],
    }
    return [version, *ops]


def renewal_window(days: float) -> datetime.timedelta:
    """--renew-before, checked: shorter than a serving certificate's life, or every run renews."""
    if not 0 < days < pki.VALIDITY.days:
        raise CertsError(
            f"--renew-before {days:g}: give a number of days above 0 and below {pki.VALIDITY.days} "
            "(a serving certificate's life), e.g. 30"
        )
    return datetime.timedelta(days=days)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = subparsers.add_parser(
        "certs",
        help="make the webhook server's CA and serving certificate (no cert-manager)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    certs.add_argument("--out", type=Path, help="directory to write into (required without `ensure`)")
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
    actions = certs.add_subparsers(dest="action", metavar="ensure")
    ensure = actions.add_parser(
        "ensure",
        help="in the cluster: make, renew and trust the Secret quorum-webhooks-tls (for a Helm hook Job)",
        description="Make the Secret NS/quorum-webhooks-tls (a new CA and a serving certificate) if it is "
        "absent or unusable, renew it when it expires within --renew-before days, and set the caBundle "
        "of quorum's webhook configurations; a run with nothing to do writes nothing. A renewal first "
        "makes the webhooks trust the old and the new CA, then writes the Secret.",
    )
    ensure.add_argument("--namespace", required=True, help="where quorum runs")
    ensure.add_argument(
        "--renew-before",
        type=float,
        default=DEFAULT_RENEW_BEFORE_DAYS,
        metavar="DAYS",
        help=f"renew when it expires within this many days (default {DEFAULT_RENEW_BEFORE_DAYS})",
    )
    ensure.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME",
        help="another DNS name or IP address for the serving certificate (repeatable)",
    )
    ensure.add_argument(
        "--absent-ok",
        action="store_true",
        help="skip a webhook configuration that is not installed instead of failing: the chart's hook "
        "runs before Helm makes them (the Secret only, so that the server's pods have it) and after",
    )
    ensure.add_argument(
        "--kubeconfig", default=None, help="default: $KUBECONFIG, else ~/.kube/config, else in-cluster"
    )
    ensure.set_defaults(func=run_ensure)


def run_ensure(args: argparse.Namespace) -> int:
    # Imported here: the command imports this module's decisions (an import at the top would be
    # a cycle).
    from quorum.commands import certs_ensure

    return certs_ensure.run(args)


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
    if args.out is None:
        print("quorum certs: pass --out DIR (files to apply), or use `quorum certs ensure`", file=sys.stderr)
        return 2
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
