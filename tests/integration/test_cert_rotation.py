"""The webhook server's CA and serving certificate rotated on a live control plane, by the steps
of `quorum certs --rotate-from` (docs/webhooks.md, "TLS and certificates"), while pods are
created without pause: no create fails and every pod gets the CPU toleration, so the apiserver
called the mutating webhook (and trusted the server) at every moment. The webhook fails open
(failurePolicy Ignore): a pod without the toleration is how a broken trust would show. The
instances admit pods with `--pod-admission webhooks`, so that every pod creation calls the server
(in the default way a MutatingAdmissionPolicy adds the toleration without it).

Then a CA renewed with the same key, as cert-manager renews quorum's CA (rotationPolicy Never in
manifests/optional/cert-manager.yaml), replaces the CA in the caBundle while the server keeps a
certificate signed under the old copy: the apiserver (Go's verifier, not Python's) accepts it."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import REPO_ROOT, Instance
from quorum.pki import CertificateAuthority
from quorum.webhooks.certs import with_ca_bundle
from tests.kube import api_client, create_namespace, eventually

pytestmark = pytest.mark.cluster

NS = "rotation"
MAX_CREATES = 400
MAX_SECONDS = 90.0
IN_FLIGHT = 3
PACE = 0.15  # seconds each worker waits between its creates: the load spans the whole rotation
TOLERATION = "is_cpu_compute"
HOLD = "example.com/hold"  # a scheduling gate of nobody's: the scheduler leaves the pods alone
KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

# What the load saw, by the rotation step under way when each create was sent.
BEFORE, TRUSTING_BOTH, NEW_CERT_WRITTEN, NEW_CERT_SERVED, TRUSTING_NEW = range(5)


@dataclass
class Load:
    """Pods created by a few workers until stopped, at most MAX_CREATES or MAX_SECONDS."""

    core: client.CoreV1Api
    phase: int = BEFORE
    sent: itertools.count[int] = field(default_factory=itertools.count)
    results: list[tuple[int, str]] = field(default_factory=list)  # (phase when sent, outcome)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def worker(self, deadline: float) -> None:
        while not self.stop.is_set() and time.monotonic() < deadline and next(self.sent) < MAX_CREATES:
            phase = self.phase
            try:
                pod = await self.core.create_namespaced_pod(NS, cpu_pod())
            except ApiException as err:
                outcome = f"failed: {err.status} {err.reason}: {str(err.body)[:200]}"
            else:
                mutated = any(t.key == TOLERATION for t in pod.spec.tolerations or [])
                outcome = "mutated" if mutated else "not mutated"
            self.results.append((phase, outcome))
            await asyncio.sleep(PACE)

    def problems(self) -> list[tuple[int, str]]:
        return [r for r in self.results if r[1] != "mutated"]

    async def accepted_since(self, phase: int, count: int = 1) -> None:
        """Wait until the apiserver created (and the webhook mutated) `count` pods sent at
        `phase` or later; fail at once on a failed or unmutated create."""

        async def seen() -> bool:
            assert not self.problems(), self.problems()[:5]
            return sum(p >= phase and outcome == "mutated" for p, outcome in self.results) >= count

        what = f"{count} mutated pod(s) sent in phase {phase}"
        await eventually(seen, timeout=30, interval=0.05, what=what)


def cpu_pod() -> dict[str, Any]:
    return {
        "metadata": {"generateName": "p-"},
        "spec": {
            "schedulingGates": [{"name": HOLD}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


def presented_certificate(port: int) -> x509.Certificate:
    """The certificate the server presents to a new TLS connection (not verified here)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1") as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def issued_by(cert: x509.Certificate, ca_pem: bytes) -> bool:
    try:
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, InvalidSignature):  # another issuer's name or key
        return False
    return True


def registered_configurations(instance: Instance) -> list[dict[str, Any]]:
    """The webhook configurations as registered, without the fields the server sets."""
    out = []
    for kind in KINDS:
        doc = json.loads(instance.kubectl("get", kind, "quorum-webhooks", "-o", "json").stdout)
        for name in SERVER_FIELDS:
            doc["metadata"].pop(name, None)
        (doc["metadata"].get("annotations") or {}).pop(LAST_APPLIED, None)
        out.append(doc)
    return out


def bundles(instance: Instance) -> set[bytes]:
    """The distinct caBundles of all quorum webhooks, as stored."""
    return {
        base64.b64decode(w["clientConfig"]["caBundle"])
        for doc in registered_configurations(instance)
        for w in doc["webhooks"]
    }


def install_pair(source: Path, pki: Path) -> None:
    """Replace the server's files as a Secret volume update does: each file whole, at once."""
    for name in ("tls.key", "tls.crt", "ca.crt"):
        shutil.copy(source / name, pki / f".{name}.new")
        (pki / f".{name}.new").replace(pki / name)


def apply(instance: Instance, path: Path) -> None:
    instance.kubectl("apply", "-f", str(path))


def rotation_files(instance: Instance, out: Path) -> str:
    """`quorum certs --rotate-from` the server's files, for the webhooks as registered (by URL on
    127.0.0.1); what it printed."""
    registered = out.parent / "registered.yaml"
    registered.write_text(yaml.safe_dump_all(registered_configurations(instance), sort_keys=False))
    pki = instance.layout.root / "webhooks-pki"
    argv = ["certs", "--out", str(out), "--rotate-from", str(pki), "--san", "127.0.0.1"]
    made = subprocess.run(
        [sys.executable, "-m", "quorum", *argv, "--webhook-configurations", str(registered)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    return made.stdout


async def start_load(instance: Instance) -> tuple[Load, asyncio.Future[Any], client.ApiClient]:
    admin = await api_client(instance.kubeconfig("admin"))
    async with admin:
        await create_namespace(admin, NS)
    customer = await api_client(instance.kubeconfig("customer"))
    load = Load(client.CoreV1Api(customer))
    deadline = time.monotonic() + MAX_SECONDS
    task = asyncio.gather(*(load.worker(deadline) for _ in range(IN_FLIGHT)))
    return load, task, customer


async def test_rotating_ca_and_certificate_under_load_fails_and_skips_no_pod(
    start_instance: Callable[..., Instance], tmp_path: Path
) -> None:
    instance = start_instance("cr-rotate", operator=False, pod_admission="webhooks")
    state = instance.state()
    assert state is not None
    port = state.ports.webhooks
    pki = instance.layout.root / "webhooks-pki"
    old_ca = (pki / "ca.crt").read_bytes()
    assert issued_by(presented_certificate(port), old_ca)

    new = tmp_path / "new"
    made = await asyncio.to_thread(rotation_files, instance, new)
    assert "3. kubectl apply" in made
    new_ca = (new / "ca.crt").read_bytes()

    load, task, customer = await start_load(instance)
    timings: dict[str, float] = {}
    started = time.monotonic()
    try:
        await load.accepted_since(BEFORE)

        # 1. Trust both CAs.
        await asyncio.to_thread(apply, instance, new / "webhook-configurations-overlap.yaml")
        assert await asyncio.to_thread(bundles, instance) == {old_ca + new_ca}
        load.phase = TRUSTING_BOTH
        await load.accepted_since(TRUSTING_BOTH)
        timings["trusting both"] = time.monotonic() - started

        # 2. The new serving certificate; the server reloads it within cert_reload_seconds.
        await asyncio.to_thread(install_pair, new, pki)
        load.phase = NEW_CERT_WRITTEN

        async def new_certificate_served() -> bool:
            return issued_by(await asyncio.to_thread(presented_certificate, port), new_ca)

        await eventually(new_certificate_served, timeout=30, what="the server presenting the new certificate")
        load.phase = NEW_CERT_SERVED
        await load.accepted_since(NEW_CERT_SERVED)
        timings["new certificate served"] = time.monotonic() - started

        # 3. Trust only the new CA.
        await asyncio.to_thread(apply, instance, new / "webhook-configurations.yaml")
        assert await asyncio.to_thread(bundles, instance) == {new_ca}
        load.phase = TRUSTING_NEW
        await load.accepted_since(TRUSTING_NEW, count=10)
        timings["trusting the new CA only"] = time.monotonic() - started
    finally:
        load.stop.set()
        await task
        await customer.close()

    by_phase = Counter(phase for phase, _ in load.results)
    print(
        f"\n{len(load.results)} creates, by phase {dict(sorted(by_phase.items()))}; steps done at {timings}"
    )
    assert not load.problems(), load.problems()[:10]
    assert len(load.results) <= MAX_CREATES
    # The load ran through every step (not all of it before or after the switch).
    assert set(by_phase) == {BEFORE, TRUSTING_BOTH, NEW_CERT_WRITTEN, NEW_CERT_SERVED, TRUSTING_NEW}


def renewed(ca: CertificateAuthority) -> bytes:
    """`ca`'s certificate renewed as cert-manager renews a CA with rotationPolicy Never: same
    name, same key, new serial and validity."""
    old = ca.cert
    builder = (
        x509.CertificateBuilder()
        .subject_name(old.subject)
        .issuer_name(old.subject)
        .public_key(ca.key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(old.not_valid_before_utc + timedelta(seconds=1))
        .not_valid_after(old.not_valid_after_utc + timedelta(days=365))
    )
    for extension in old.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    return builder.sign(ca.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def trust(instance: Instance, ca_pem: bytes, directory: Path) -> None:
    """Register the webhooks with `ca_pem` as caBundle."""
    path = directory / f"trust-{time.monotonic_ns()}.yaml"
    manifest = yaml.safe_dump_all(registered_configurations(instance))
    path.write_text(yaml.safe_dump_all(with_ca_bundle(manifest, ca_pem), sort_keys=False))
    apply(instance, path)


async def test_a_ca_renewed_with_the_same_key_verifies_what_its_old_copy_signed(
    start_instance: Callable[..., Instance], tmp_path: Path
) -> None:
    instance = start_instance("cr-renew", operator=False, pod_admission="webhooks")
    state = instance.state()
    assert state is not None
    port = state.ports.webhooks
    ca = CertificateAuthority.create("quorum-webhooks-ca")
    serving = ca.issue("quorum-webhooks", client=False, server_names=("127.0.0.1",))
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "tls.key").write_bytes(serving.key_pem)
    (stage / "tls.crt").write_bytes(serving.cert_pem)
    (stage / "ca.crt").write_bytes(ca.pair.cert_pem)
    copy = renewed(ca)
    assert copy != ca.pair.cert_pem
    # Same name, another key: what the apiserver must refuse.
    impostor = CertificateAuthority.create("quorum-webhooks-ca").pair.cert_pem

    admin = await api_client(instance.kubeconfig("admin"))
    async with admin:
        await create_namespace(admin, NS)
    customer = await api_client(instance.kubeconfig("customer"))
    core = client.CoreV1Api(customer)

    async def mutated(expected: bool) -> bool:
        pod = await core.create_namespaced_pod(NS, cpu_pod())
        return any(t.key == TOLERATION for t in pod.spec.tolerations or []) is expected

    async with customer:
        await asyncio.to_thread(install_pair, stage, instance.layout.root / "webhooks-pki")

        async def served() -> bool:
            return issued_by(await asyncio.to_thread(presented_certificate, port), ca.pair.cert_pem)

        await eventually(served, timeout=30, what="the server presenting the certificate of the test CA")
        await asyncio.to_thread(trust, instance, copy, tmp_path)
        await eventually(lambda: mutated(True), timeout=30, what="a pod mutated, trusting the renewed CA")
        await asyncio.to_thread(trust, instance, impostor, tmp_path)
        await eventually(lambda: mutated(False), timeout=30, what="a pod not mutated, trusting another key")
        await asyncio.to_thread(trust, instance, copy, tmp_path)
        await eventually(
            lambda: mutated(True), timeout=30, what="a pod mutated, trusting the renewed CA again"
        )
