"""`quorum certs ensure --namespace NS [--renew-before DAYS] [--san NAME] [--absent-ok]`: the
webhook server's certificate kept in the cluster, without cert-manager. The Helm chart's hook Job
runs it before and after each install and upgrade (a person may too); the decisions are pure
functions of `quorum.webhooks.certs` (`assess_secret`, `bundle_for`, `configuration_patch`).

1. Read the Secret NS/quorum-webhooks-tls and both webhook configurations quorum-webhooks. A
   configuration that is not installed is an error, unless `--absent-ok`: then it is skipped
   (the chart's pre-install run, before Helm makes them, makes the Secret only, so that the
   webhook server's pods have it when Helm creates them; the post-install run, after, trusts it
   in both).
2. The Secret is made again (a new CA, whose key is never written, and a serving certificate for
   the Service quorum-webhooks.NS.svc) if it is absent, unusable, not for those names, or
   expires within DAYS (default 30; a certificate lives 365 days).
3. Each configuration's caBundle is set first: on a renewal, to the CA in use and the new one
   (the overlap), else to include the Secret's CA if it lacks it. Only then is the Secret
   written: the apiserver trusts what every server presents at every moment, whenever the
   kubelet refreshes each pod's copy and the server reloads it. The old CA stays in the bundle
   until the next renewal (its key is gone, so it vouches only for certificates it already
   signed), which spares this Job the wait for every server to load the new one.
4. Nothing else: a run that finds the Secret valid and trusted writes nothing.

A failure midway is safe to run again: a CA not yet in the Secret is never presented, and the
next run makes another one. Every write applies only to the version read (resourceVersion), so
a concurrent change fails the run instead of being overwritten. A Secret cert-manager manages
is refused: it is cert-manager's to renew.

Rights, exactly (quorum in quorum-system; tests/unit/test_certs_ensure.py checks this text
against RULES, tests/integration/test_certs_ensure.py runs the command with exactly these; RBAC
cannot name the object a `create` makes, hence the second Secret rule):

    apiVersion: rbac.authorization.k8s.io/v1
    kind: ClusterRole
    metadata: {name: quorum-lifecycle}
    rules:
    - apiGroups: [admissionregistration.k8s.io]
      resources: [mutatingwebhookconfigurations]
      verbs: [get, patch]
      resourceNames: [quorum-webhooks]
    - apiGroups: [admissionregistration.k8s.io]
      resources: [validatingwebhookconfigurations]
      verbs: [get, patch]
      resourceNames: [quorum-webhooks]
    ---
    apiVersion: rbac.authorization.k8s.io/v1
    kind: Role
    metadata: {name: quorum-lifecycle, namespace: quorum-system}
    rules:
    - apiGroups: ['']
      resources: [secrets]
      verbs: [get, update]
      resourceNames: [quorum-webhooks-tls]
    - apiGroups: ['']
      resources: [secrets]
      verbs: [create]

On Kubernetes 1.37 with quorum's self-protection on the apiserver's disk, only the platform's
identities write these objects; a ServiceAccount of quorum's namespace is one of them
(docs/threat-model.md, "Fences a customer cannot remove").
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import sys
from collections.abc import Callable
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum import install
from quorum.core.removal import MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS, Kind, Ref, Rule
from quorum.k8s import objects
from quorum.k8s.client import KubeconfigError, command_client
from quorum.webhooks import certs, tls

JSON = dict[str, Any]
SECRET = Kind("", "v1", "secrets", "Secret", namespaced=True)
CONFIGURATIONS = (MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS)
# cert-manager marks the Secrets it issues with this annotation.
CERT_MANAGER_SECRET = "cert-manager.io/certificate-name"  # noqa: S105 (an annotation key)


def rules(namespace: str) -> list[Rule]:
    """The rights `ensure` needs for quorum in `namespace` (the module docstring)."""
    return [
        *(Rule(k.group, k.plural, ("get", "patch"), (certs.CONFIGURATION_NAME,)) for k in CONFIGURATIONS),
        Rule("", "secrets", ("get", "update"), (certs.SECRET_NAME,), namespace),
        Rule("", "secrets", ("create",), (), namespace),
    ]


class CertsApi(Protocol):
    async def read(self, ref: Ref) -> JSON | None: ...

    async def create(self, kind: Kind, namespace: str | None, body: JSON) -> None: ...

    async def replace(self, ref: Ref, body: JSON) -> None: ...

    async def patch(self, ref: Ref, ops: list[JSON]) -> None: ...


class LiveCertsApi:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    async def read(self, ref: Ref) -> JSON | None:
        return await objects.read(self.api, ref)

    async def create(self, kind: Kind, namespace: str | None, body: JSON) -> None:
        await objects.create(self.api, kind, namespace, body)

    async def replace(self, ref: Ref, body: JSON) -> None:
        await objects.replace(self.api, ref, body)

    async def patch(self, ref: Ref, ops: list[JSON]) -> None:
        await objects.json_patch(self.api, ref, ops)


def subject(cert: Any) -> str:
    return str(cert.subject.rfc4514_string())


def decoded(secret: JSON | None) -> dict[str, bytes] | None:
    if secret is None:
        return None
    out = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value)
        except ValueError:
            out[key] = b""
    return out


async def ensure(
    api: CertsApi,
    namespace: str,
    names: tuple[str, ...],
    renew_before: datetime.timedelta,
    now: datetime.datetime,
    say: Callable[[str], None] = print,
    absent_ok: bool = False,
) -> bool:
    """The steps of the module docstring; True if anything was written."""
    secret_ref = Ref(SECRET, certs.SECRET_NAME, namespace)
    secret = await api.read(secret_ref)
    if secret is not None and CERT_MANAGER_SECRET in (secret["metadata"].get("annotations") or {}):
        raise certs.CertsError(
            f"{secret_ref} is cert-manager's (annotation {CERT_MANAGER_SECRET}): it renews it and injects "
            "the caBundle. `certs ensure` is for installs without cert-manager; do not run both"
        )
    configurations = []
    for kind in CONFIGURATIONS:
        ref = Ref(kind, certs.CONFIGURATION_NAME)
        found = await api.read(ref)
        if found is None:
            if not absent_ok:
                raise certs.CertsError(f"{ref} is not installed: install quorum's manifests first")
            say(f"{ref}: not installed yet: the Secret only (run again once it is)")
            continue
        configurations.append((ref, found))

    state = certs.assess_secret(decoded(secret), names, now, renew_before)
    new: tuple[bytes, bytes, bytes] | None = tls.issue(names) if state.renew else None
    say(f"{secret_ref}: {state.reason}" + (": making a new CA and serving certificate" if new else ""))
    new_ca = new[0] if new else None
    written = False
    for ref, found in configurations:
        bundles: set[bytes] = set()

        def bundle(current: bytes, bundles: set[bytes] = bundles) -> bytes:
            bundles.add(wanted := certs.bundle_for(current, state, new_ca))
            return wanted

        ops = certs.configuration_patch(found, bundle)
        if ops is None:
            say(f"{ref}: caBundle trusts the Secret's CA: unchanged")
            continue
        await api.patch(ref, ops)
        written = True
        trusted = sorted({subject(c) for b in bundles for c in certs.certificates_in(b)})
        say(
            f"{ref}: caBundle set to trust {', '.join(trusted)}"
            + (" (old and new)" if len(trusted) > 1 else "")
        )
    if new is None:
        return written
    body = certs.secret_manifest(*new, namespace)
    until = f"valid until {certs.certificates_in(new[1])[0].not_valid_after_utc:%Y-%m-%d}"
    if secret is None:
        await api.create(SECRET, namespace, body)
        say(f"{secret_ref}: created, {until}")
    else:
        meta = secret["metadata"]
        body["metadata"]["resourceVersion"] = meta["resourceVersion"]
        body["metadata"]["labels"] = {**(meta.get("labels") or {}), **body["metadata"]["labels"]}
        if meta.get("annotations"):
            body["metadata"]["annotations"] = meta["annotations"]
        await api.replace(secret_ref, body)
        say(
            f"{secret_ref}: replaced, {until}; "
            "the servers load it within about a minute (kubelet) plus cert_reload_seconds"
        )
    return True


def run(args: argparse.Namespace) -> int:
    try:
        install.check_namespace(args.namespace)
        window = certs.renewal_window(args.renew_before)
    except (install.InvalidNamespace, certs.CertsError) as err:
        print(f"quorum certs ensure: {err}", file=sys.stderr)
        return 2
    names = tuple(dict.fromkeys(tls.service_names(args.namespace) + tuple(args.san)))
    try:
        changed = asyncio.run(_main(args.kubeconfig, args.namespace, names, window, args.absent_ok))
    except (certs.CertsError, KubeconfigError) as err:
        print(f"quorum certs ensure: {err}", file=sys.stderr)
        return 1
    except ApiException as err:
        print(
            f"quorum certs ensure: the apiserver refused: {objects.refusal(err)} "
            "(nothing after this write was done; a 409 or a failed test means the object changed "
            "meanwhile: run it again)",
            file=sys.stderr,
        )
        return 1
    print("written as above" if changed else "nothing to do: the certificate is valid and trusted")
    return 0


async def _main(
    kubeconfig: str | None,
    namespace: str,
    names: tuple[str, ...],
    window: datetime.timedelta,
    absent_ok: bool,
) -> bool:
    api = (await command_client(kubeconfig)).api
    async with api:
        now = datetime.datetime.now(datetime.UTC)
        return await ensure(LiveCertsApi(api), namespace, names, window, now, absent_ok=absent_ok)
