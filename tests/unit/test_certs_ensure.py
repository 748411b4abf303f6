"""`quorum certs ensure`: its decisions (is the Secret's certificate due, which caBundle each
webhook needs) as pure functions, and its writes against a stateful fake apiserver
(tests/unit/fake_objects.py): in order (the bundle before the Secret), none when nothing is due,
a renewal that overlaps the CAs, a run that fails midway and the run after it."""

from __future__ import annotations

import base64
import datetime
import re
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from quorum.cli import main
from quorum.commands import certs_ensure as command
from quorum.commands.certs_ensure import SECRET, ensure
from quorum.core import removal
from quorum.core.removal import Ref
from quorum.pki import CertificateAuthority
from quorum.webhooks import certs, tls
from quorum.webhooks.certs import CertsError, SecretState, assess_secret, bundle_for, configuration_patch
from tests.unit.fake_objects import FakeCluster

NS = "gpu-admission"
NAMES = tls.service_names(NS)
NOW = datetime.datetime.now(datetime.UTC)
WINDOW = datetime.timedelta(days=30)
SECRET_REF = Ref(SECRET, certs.SECRET_NAME, NS)
CONFIGS = [Ref(k, certs.CONFIGURATION_NAME) for k in command.CONFIGURATIONS]


def issued(names: tuple[str, ...] = NAMES) -> dict[str, bytes]:
    ca, cert, key = tls.issue(names)
    return {"ca.crt": ca, "tls.crt": cert, "tls.key": key}


def ders(bundle: bytes) -> list[bytes]:
    return (
        [c.public_bytes(serialization.Encoding.DER) for c in certs.certificates_in(bundle)] if bundle else []
    )


# -- decisions ----------------------------------------------------------------------------------


def test_a_valid_certificate_is_kept_and_every_flaw_renews_it() -> None:
    good = issued()
    kept = assess_secret(good, NAMES, NOW, WINDOW)
    assert not kept.renew and kept.reason.startswith("valid until") and kept.presents_own_ca
    other = issued()
    cases: list[tuple[dict[str, bytes] | None, str]] = [
        (None, "absent"),
        ({**good, "tls.key": b""}, "has no tls.key"),
        ({**good, "tls.crt": b"garbage"}, "does not parse"),
        ({**good, "tls.key": other["tls.key"]}, "tls.key is not the key of tls.crt"),
        ({**good, "ca.crt": other["ca.crt"]}, "not signed by its ca.crt"),
        (issued(("quorum-webhooks.elsewhere.svc",)), "is not for quorum-webhooks"),
    ]
    for data, reason in cases:
        state = assess_secret(data, NAMES, NOW, WINDOW)
        assert state.renew and reason in state.reason, (reason, state)
    due = assess_secret(good, NAMES, NOW + datetime.timedelta(days=340), WINDOW)
    assert due.renew and "within 30 days" in due.reason and due.presents_own_ca
    expired = assess_secret(good, NAMES, NOW + datetime.timedelta(days=400), WINDOW)
    assert expired.renew and "expired on" in expired.reason


def test_bundles_add_without_removing_and_a_renewal_overlaps_the_ca_in_use_and_the_new_one() -> None:
    in_use, new, unrelated = (CertificateAuthority.create(n).pair.cert_pem for n in ("in-use", "new", "x"))
    kept = SecretState(False, "valid", in_use, True)
    assert bundle_for(in_use, kept, None) == in_use
    assert bundle_for(unrelated + in_use, kept, None) == unrelated + in_use  # nothing to do: unchanged
    assert ders(bundle_for(unrelated, kept, None)) == ders(unrelated + in_use)
    renewing = SecretState(True, "due", in_use, True)
    # What the servers present now (the CA in use) and what they present next; the older goes.
    assert ders(bundle_for(unrelated + in_use, renewing, new)) == ders(in_use + new)
    # Not knowing what the servers present (no Secret, or one whose certificate is not its CA's):
    # everything trusted now stays, the new CA joins.
    absent = SecretState(True, "absent", b"", False)
    assert ders(bundle_for(unrelated, absent, new)) == ders(unrelated + new)
    assert ders(bundle_for(b"not a bundle", absent, new)) == ders(new)


def configuration(bundle: bytes, webhooks: int = 2, annotated: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "quorum-webhooks", "resourceVersion": "7"}
    if annotated:
        meta["annotations"] = {certs.CERT_MANAGER_ANNOTATION: f"{NS}/quorum-webhooks"}
    value = base64.b64encode(bundle).decode()
    return {
        "metadata": meta,
        "webhooks": [{"name": f"w{i}", "clientConfig": {"caBundle": value}} for i in range(webhooks)],
    }


def test_the_patch_tests_the_version_read_and_is_none_when_nothing_changes() -> None:
    ca = CertificateAuthority.create("a").pair.cert_pem
    assert configuration_patch(configuration(ca), lambda current: current) is None
    ops = configuration_patch(configuration(b"", annotated=True), lambda current: ca)
    assert ops is not None and ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    value = base64.b64encode(ca).decode()
    assert ops[1:] == [
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": value},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": value},
        {"op": "remove", "path": "/metadata/annotations/cert-manager.io~1inject-ca-from"},
    ]


def test_the_renewal_window_is_shorter_than_a_certificates_life() -> None:
    assert certs.renewal_window(30) == WINDOW
    for days in (0, -1, 365, 400):
        with pytest.raises(CertsError, match="--renew-before"):
            certs.renewal_window(days)


# -- the flow, against the fake -----------------------------------------------------------------


def cluster_with_webhooks(trusted: bytes) -> FakeCluster:
    cluster = FakeCluster()
    for ref in CONFIGS:
        cluster.add(ref, configuration(trusted))
    return cluster


def secret_data(cluster: FakeCluster) -> dict[str, bytes]:
    data = cluster.objects[SECRET_REF]["data"]
    return {k: base64.b64decode(v) for k, v in data.items()}


def trusted(cluster: FakeCluster) -> set[bytes]:
    bundles = {w["clientConfig"]["caBundle"] for ref in CONFIGS for w in cluster.objects[ref]["webhooks"]}
    assert len(bundles) == 1, "every webhook trusts the same CAs"
    return set(ders(base64.b64decode(bundles.pop())))


def versions(cluster: FakeCluster) -> dict[Ref, str]:
    return {ref: obj["metadata"]["resourceVersion"] for ref, obj in cluster.objects.items()}


async def run(
    cluster: FakeCluster, now: datetime.datetime = NOW, absent_ok: bool = False
) -> tuple[bool, list[str]]:
    lines: list[str] = []
    return await ensure(cluster, NS, NAMES, WINDOW, now, lines.append, absent_ok=absent_ok), lines


async def test_made_trusted_then_left_alone_then_renewed_with_an_overlap() -> None:
    dev = CertificateAuthority.create("dev").pair.cert_pem
    cluster = cluster_with_webhooks(dev)

    changed, lines = await run(cluster)
    assert (
        changed
        and lines[0] == f"Secret {NS}/quorum-webhooks-tls: absent: making a new CA and serving certificate"
    )
    # The webhooks trust the new CA before the Secret exists (and still what they trusted).
    assert [w[0] for w in cluster.writes] == ["patch", "patch", "create"]
    first = secret_data(cluster)
    assert trusted(cluster) == set(ders(dev + first["ca.crt"]))
    assert not assess_secret(first, NAMES, NOW, WINDOW).renew

    before = versions(cluster)
    changed, lines = await run(cluster)
    assert not changed and versions(cluster) == before and len(cluster.writes) == 3
    assert lines[-1].endswith("caBundle trusts the Secret's CA: unchanged")

    # A certificate that expires in 10 days, its CA trusted: renewed with the two CAs overlapping.
    near = short_lived(days=10)
    cluster.add(SECRET_REF, {**cluster.objects[SECRET_REF], "data": encoded(near)})
    for ref in CONFIGS:
        cluster.add(ref, configuration(dev + near["ca.crt"]))
    writes = len(cluster.writes)
    changed, lines = await run(cluster)
    assert changed and "within 30 days: renewing" in lines[0]
    assert [w[0] for w in cluster.writes[writes:]] == ["patch", "patch", "replace"]
    second = secret_data(cluster)
    assert trusted(cluster) == set(ders(near["ca.crt"] + second["ca.crt"]))  # dev is dropped
    assert not assess_secret(second, NAMES, NOW, WINDOW).renew
    assert cluster.objects[SECRET_REF]["metadata"]["labels"] == {"app.kubernetes.io/part-of": "quorum"}
    before = versions(cluster)
    assert (await run(cluster))[0] is False and versions(cluster) == before


def short_lived(days: int) -> dict[str, bytes]:
    """A CA and a serving certificate for NAMES that expires in `days`."""
    ca = CertificateAuthority.create("short")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "quorum-webhooks")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in NAMES]), critical=False)
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


def encoded(data: dict[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in data.items()}


async def test_a_run_cut_off_before_the_secret_is_finished_by_the_next_with_another_ca() -> None:
    first = short_lived(days=10)
    cluster = cluster_with_webhooks(first["ca.crt"])
    cluster.add(SECRET_REF, {"metadata": {}, "data": encoded(first)})
    cluster.fail("replace", times=1)
    with pytest.raises(Exception, match="etcdserver"):
        await run(cluster)
    assert secret_data(cluster) == first  # the servers still present the first certificate...
    assert set(ders(first["ca.crt"])) <= trusted(cluster)  # ...and the apiserver still trusts it
    lost = trusted(cluster) - set(ders(first["ca.crt"]))  # the cut-off run's CA, never presented

    await run(cluster)
    second = secret_data(cluster)
    assert trusted(cluster) == set(ders(first["ca.crt"] + second["ca.crt"]))
    assert not lost & trusted(cluster)


async def test_a_concurrent_change_fails_the_run_instead_of_being_overwritten() -> None:
    cluster = cluster_with_webhooks(b"")
    original = cluster.read

    async def read_then_changed(ref: Ref) -> Any:
        found = await original(ref)
        if ref == CONFIGS[0] and found is not None:
            cluster.add(ref, found)  # someone wrote it after we read it (a new resourceVersion)
        return found

    cluster.read = read_then_changed  # type: ignore[method-assign]
    with pytest.raises(Exception, match="test failed"):
        await run(cluster)
    assert SECRET_REF not in cluster.objects


async def test_cert_managers_secret_and_missing_configurations_are_refused() -> None:
    cluster = cluster_with_webhooks(b"")
    cluster.add(SECRET_REF, {"metadata": {"annotations": {command.CERT_MANAGER_SECRET: "quorum-webhooks"}}})
    with pytest.raises(CertsError, match="cert-manager's"):
        await run(cluster)
    empty = FakeCluster()
    with pytest.raises(CertsError, match="is not installed"):
        await run(empty)
    assert cluster.writes == [] and empty.writes == []


def test_the_docstrings_rbac_is_exactly_what_ensure_needs() -> None:
    block = re.search(r"\n    apiVersion: rbac.*?\n\n", command.__doc__ or "", re.S)
    assert block is not None
    documented = [d for d in yaml.safe_load_all(block.group(0).replace("\n    ", "\n")) if d]
    derived = removal.rbac_manifests(command.rules("quorum-system"), "quorum-lifecycle", "quorum-system")
    assert documented == [d for d in derived if d["kind"] in ("ClusterRole", "Role")]


def test_the_command_refuses_bad_arguments_and_keeps_quorum_certs_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["certs", "ensure", "--namespace", NS, "--renew-before", "400"]) == 2
    assert "--renew-before 400" in capsys.readouterr().err
    assert main(["certs", "ensure", "--namespace", "Bad_Name"]) == 2
    assert main(["certs"]) == 2
    assert "--out DIR" in capsys.readouterr().err


async def test_before_an_install_the_secret_alone_then_after_it_the_bundle_without_a_new_secret() -> None:
    """The chart's hook: at pre-install (configurations not made yet) the Secret only, so that the
    webhook server's pods have it when Helm creates them; at post-install the same command trusts
    that Secret's CA in both configurations and writes no Secret; at pre- and post-upgrade, with
    nothing due, nothing."""
    cluster = FakeCluster()
    changed, lines = await run(cluster, absent_ok=True)
    assert changed and [w[0] for w in cluster.writes] == ["create"]
    assert [line for line in lines if "not installed yet" in line] == [
        f"{ref}: not installed yet: the Secret only (run again once it is)" for ref in CONFIGS
    ]
    made = secret_data(cluster)
    assert not assess_secret(made, NAMES, NOW, WINDOW).renew

    for ref in CONFIGS:  # what Helm makes next: no caBundle (the chart renders none)
        cluster.add(ref, {**configuration(b""), "webhooks": [{"name": "w", "clientConfig": {}}]})
    changed, lines = await run(cluster, absent_ok=True)
    assert changed and [w[0] for w in cluster.writes[1:]] == ["patch", "patch"]
    assert secret_data(cluster) == made and trusted(cluster) == set(ders(made["ca.crt"]))
    before = versions(cluster)
    assert (await run(cluster, absent_ok=True))[0] is False and versions(cluster) == before
    assert (await run(cluster))[0] is False and versions(cluster) == before

    # One configuration there, the other not (an install cut off): the one is trusted, the other
    # skipped with --absent-ok and refused without.
    partial = FakeCluster()
    partial.add(CONFIGS[0], configuration(b""))
    changed, lines = await run(partial, absent_ok=True)
    assert [w[0] for w in partial.writes] == ["patch", "create"]
    assert f"{CONFIGS[1]}: not installed yet" in "\n".join(lines)
    with pytest.raises(CertsError, match="is not installed"):
        await run(partial)
