"""`quorum certs ensure` on the real control plane, run as a person runs it, while a customer
creates pods without pause (each must be created and mutated: the mutating webhook fails open,
so a pod without the CPU toleration is how a moment of broken trust shows).

What this can show here, and what not. The local plane runs quorum-webhooks as a process on
127.0.0.1, registered by URL with its own dev CA; nothing mounts the Secret. So the test plays
the kubelet: it copies the Secret's certificate and key into the files the server reloads, at a
moment of its choosing after the command has returned, and the certificate carries 127.0.0.1
(`--san`). It shows that the Secret and the caBundles the command writes are right at both
moments a server can be in: still presenting the old certificate, and presenting the new one
(the apiserver's own TLS verifier judges); that a second run writes nothing (resourceVersions);
and that a near-expiry certificate is renewed with the two CAs overlapping. It does not show the
Service's DNS names in use, nor the kubelet's own delay in refreshing a Secret volume; that the
bundle is written before the Secret is checked by tests/unit/test_certs_ensure.py."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from devcluster.cluster import Instance
from quorum.pki import CertificateAuthority
from quorum.webhooks import certs, tls
from tests.integration.test_cert_rotation import (
    Load,
    bundles,
    install_pair,
    issued_by,
    presented_certificate,
    start_load,
)
from tests.integration.test_uninstall import quorum
from tests.kube import eventually

pytestmark = pytest.mark.cluster

NS = "quorum-system"
KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")


def trusted(instance: Instance) -> set[bytes]:
    """The CA certificates (DER) every quorum webhook trusts; all webhooks trust the same."""
    found = bundles(instance)
    assert len(found) == 1, "every webhook has the same caBundle"
    return {c.public_bytes(serialization.Encoding.DER) for c in certs.certificates_in(found.pop())}


def der(pem: bytes) -> set[bytes]:
    return {c.public_bytes(serialization.Encoding.DER) for c in certs.certificates_in(pem)}


def secret(instance: Instance) -> dict[str, bytes]:
    found = json.loads(instance.kubectl("-n", NS, "get", "secret", certs.SECRET_NAME, "-o", "json").stdout)
    return {k: base64.b64decode(v) for k, v in found["data"].items()}


def versions(instance: Instance) -> dict[str, str]:
    """The resourceVersions of what `ensure` writes."""
    out = {}
    for kind in KINDS:
        out[kind] = instance.kubectl(
            "get", kind, "quorum-webhooks", "-o", "jsonpath={.metadata.resourceVersion}"
        ).stdout
    out["secret"] = instance.kubectl(
        "-n", NS, "get", "secret", certs.SECRET_NAME, "-o", "jsonpath={.metadata.resourceVersion}"
    ).stdout
    return out


def serve(instance: Instance, data: dict[str, bytes], stage: Path) -> None:
    """What the kubelet does with a Secret volume: the server's files replaced, each whole."""
    stage.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (stage / name).write_bytes(data[name])
    install_pair(stage, instance.layout.root / "webhooks-pki")


def near_expiry(days: int) -> dict[str, bytes]:
    """A CA and a serving certificate for quorum-webhooks.NS.svc and 127.0.0.1, expiring in `days`."""
    ca = CertificateAuthority.create("quorum-webhooks-ca@near-expiry")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.DNSName(n) for n in tls.service_names(NS)] + [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "quorum-webhooks")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return {
        "ca.crt": ca.pair.cert_pem,
        "tls.crt": cert.public_bytes(serialization.Encoding.PEM),
        "tls.key": key_pem,
    }


async def test_ensure_makes_trusts_keeps_and_renews_the_certificate_while_webhooks_answer(
    start_instance: Callable[..., Instance], tmp_path: Path
) -> None:
    instance = start_instance("t-certs", operator=False)
    state = instance.state()
    assert state is not None
    port = state.ports.webhooks
    admin = instance.kubeconfig("admin")
    dev_ca = (instance.layout.root / "webhooks-pki" / "ca.crt").read_bytes()

    def ensure(*extra: str) -> str:
        done = quorum(instance, admin, "certs", "ensure", "--namespace", NS, "--san", "127.0.0.1", *extra)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    async def served_by(ca_pem: bytes) -> None:
        async def presented() -> bool:
            return issued_by(await asyncio.to_thread(presented_certificate, port), ca_pem)

        await eventually(presented, timeout=30, what="the server presenting the certificate of that CA")

    load, task, customer = await start_load(instance)
    try:
        await load.accepted_since(0)

        # 1. No Secret: made; the webhooks trust its CA and still the one the server presents.
        made = await asyncio.to_thread(ensure)
        assert f"Secret {NS}/quorum-webhooks-tls: created" in made
        first = await asyncio.to_thread(secret, instance)
        assert await asyncio.to_thread(trusted, instance) == der(dev_ca) | der(first["ca.crt"])
        await load.accepted_since(0, count=load_count(load) + 3)
        await asyncio.to_thread(serve, instance, first, tmp_path / "first")
        await served_by(first["ca.crt"])
        await load.accepted_since(0, count=load_count(load) + 3)

        # 2. Nothing to do: nothing written.
        before = await asyncio.to_thread(versions, instance)
        again = await asyncio.to_thread(ensure)
        assert again.rstrip().endswith("nothing to do: the certificate is valid and trusted"), again
        assert await asyncio.to_thread(versions, instance) == before

        # 3. A certificate that expires in 10 days (as an older install would have it), served.
        near = near_expiry(days=10)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": certs.SECRET_NAME, "namespace": NS},
            "data": {k: base64.b64encode(v).decode() for k, v in near.items()},
        }
        instance.kubectl("apply", "-f", "-", input_text=json.dumps(body))
        kept = await asyncio.to_thread(ensure, "--renew-before", "5")  # not due yet: its CA added
        assert "caBundle set to trust" in kept and "valid until" in kept
        await asyncio.to_thread(serve, instance, near, tmp_path / "near")
        await served_by(near["ca.crt"])
        await load.accepted_since(0, count=load_count(load) + 3)

        # 4. Due within the default 30 days: renewed, the CA in use and the new one trusted...
        renewed = await asyncio.to_thread(ensure)
        assert (
            "within 30 days: renewing" in renewed and f"Secret {NS}/quorum-webhooks-tls: replaced" in renewed
        )
        new = await asyncio.to_thread(secret, instance)
        assert new["ca.crt"] != near["ca.crt"]
        assert await asyncio.to_thread(trusted, instance) == der(near["ca.crt"]) | der(new["ca.crt"])
        # ...while the server still presents the old certificate...
        assert issued_by(await asyncio.to_thread(presented_certificate, port), near["ca.crt"])
        await load.accepted_since(0, count=load_count(load) + 3)
        # ...and once it loads the new one.
        await asyncio.to_thread(serve, instance, new, tmp_path / "new")
        await served_by(new["ca.crt"])
        await load.accepted_since(0, count=load_count(load) + 5)

        before = await asyncio.to_thread(versions, instance)
        assert (
            (await asyncio.to_thread(ensure))
            .rstrip()
            .endswith("nothing to do: the certificate is valid and trusted")
        )
        assert await asyncio.to_thread(versions, instance) == before
    finally:
        load.stop.set()
        await task
        await customer.close()
    assert not load.problems(), load.problems()[:10]
    print(f"\n{len(load.results)} pods created, each mutated")


def load_count(load: Load) -> int:
    return sum(outcome == "mutated" for _, outcome in load.results)
