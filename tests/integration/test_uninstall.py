"""`quorum uninstall` run as a person runs it (a subprocess, `python -m quorum`), each test on an
instance of its own, while a customer creates gang pods and plain pods without pause: no pod is
left gated, no pod creation is refused at any point, and pods created afterwards are not gated.

- The whole removal as the cluster's admin: a dry run first changes nothing (the objects are
  still there and the pods still gated) and lists every step; the run releases the gangs and
  deletes quorum's objects; a second run succeeds and finds nothing left.
- In both, a node is reserved by a preemption in flight when the uninstall starts (its record
  on a Gang and its taint `quorum.dev/reserved`, written as quorum's operator with its own code;
  the operator keeps it, as it keeps any preemption's until it ends): a pod that must go to that
  node waits, untolerated taint; after the uninstall no node has the taint, and that pod is bound
  to the node. In the whole removal the operator stopped before (deleted, or crashed mid-
  preemption), and a Job it suspended (recorded on a Gang) is left suspended: the uninstall
  resumes it. In `--admission-only` the operator still runs, as in a Helm uninstall.
- `--admission-only` as the lifecycle identity a Helm hook Job has, with exactly the RBAC its
  docstring lists (plus `quorum certs ensure`'s), on quorum installed in another namespace; then
  the rest deleted one by one in a random order, as Helm does, with pods created between each.
  quorum-operator, which leads when the hook starts, still runs afterwards but no longer leads:
  its Lease is held by the uninstall and its own `/metrics` says it does not lead.
  On the local 1.37 plane quorum's self-protection is on the apiserver's disk: the identity,
  a ServiceAccount of quorum's namespace, passes it; the customer cannot get its token.

The local plane runs quorum-operator and quorum-webhooks as processes, not Deployments: the
tests stop them where the Deployments would go, and apply the Deployment manifests (which kwok
"runs") so that their deletion is real."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import REPO_ROOT, Instance, node_is_ready
from devcluster.kubeconfig import write_kubeconfig
from quorum.commands import certs_ensure
from quorum.core import removal
from quorum.core.times import iso
from quorum.install import operator_username, render_files
from quorum.k8s import writes
from tests.kube import api_client, create_namespace, create_podgroup, eventually, raw_json

pytestmark = pytest.mark.cluster

GATE = "quorum.dev/gang"
RESERVED = "quorum.dev/reserved"
LIFECYCLE = "quorum-lifecycle"
PACE = 0.25  # seconds between one worker's creates


async def gated_anywhere(api: client.ApiClient) -> list[str]:
    items = (await raw_json(client.CoreV1Api(api).list_pod_for_all_namespaces(_preload_content=False)))[
        "items"
    ]
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in items
        if any(g["name"] == GATE for g in p["spec"].get("schedulingGates") or [])
    ]


def workload(name: str, replicas: int, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, **labels}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    }


def quorum(instance: Instance, kubeconfig: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`quorum ARGV` as a person runs it, with `kubeconfig`."""
    return subprocess.run(
        [sys.executable, "-m", "quorum", *argv, f"--kubeconfig={kubeconfig}"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=300,
        check=False,
    )


# A label-only gang that never forms (1 of 1000 members): the webhook gates each such pod and the
# operator never releases it, so only the uninstall's release ungates it.
NEVER_FORMS = {
    "pod-group.scheduling.sigs.k8s.io/name": "stream",
    "pod-group.scheduling.sigs.k8s.io/min-available": "1000",
}


@dataclass
class Creates:
    """A customer creating gang pods and plain pods in turn until stopped; every refusal kept."""

    core: client.CoreV1Api
    namespace: str
    created: int = 0
    refused: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    names: itertools.count[int] = field(default_factory=itertools.count)

    async def worker(self) -> None:
        while not self.stop.is_set():
            n = next(self.names)
            labels = NEVER_FORMS if n % 2 == 0 else {}
            pod = {
                "metadata": {"name": f"load-{n}", "labels": labels},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            }
            try:
                await self.core.create_namespaced_pod(self.namespace, pod)
            except ApiException as err:
                self.refused.append(
                    f"load-{n} ({'gang' if labels else 'plain'}): {err.status} {str(err.body)[:300]}"
                )
            else:
                self.created += 1
            await asyncio.sleep(PACE)

    async def more(self, count: int = 4) -> None:
        """Wait until `count` more pods were created; fail at once on a refusal."""
        target = self.created + count

        async def done() -> bool:
            assert not self.refused, self.refused[:5]
            return self.created >= target

        await eventually(done, timeout=30, interval=0.05, what=f"{count} more pods created")


async def start_creates(
    instance: Instance, namespace: str
) -> tuple[Creates, asyncio.Future[Any], client.ApiClient]:
    customer = await api_client(instance.kubeconfig("customer"))
    creates = Creates(client.CoreV1Api(customer), namespace)
    return creates, asyncio.gather(creates.worker(), creates.worker()), customer


async def plain_node(api: client.ApiClient) -> str:
    """A node an ordinary pod may use: Ready, schedulable, no taint it must tolerate."""
    nodes = (await raw_json(client.CoreV1Api(api).list_node(_preload_content=False)))["items"]
    usable = sorted(
        n["metadata"]["name"]
        for n in nodes
        if node_is_ready(n)
        and not n["spec"].get("unschedulable")
        and all(t["effect"] == "PreferNoSchedule" for t in n["spec"].get("taints") or [])
    )
    assert usable, "no node an ordinary pod may use"
    return str(usable[0])


async def reserve_as_the_operator(
    kubeconfig: Path, namespace: str, gang: tuple[str, str], node: str, token: str
) -> None:
    """What a preemption in flight leaves (quorum/operator/preemption.py, `execute`): its record
    on the preemptor's Gang, then the node's taint quorum.dev/reserved=<token>:NoSchedule, both
    written as quorum's operator of `namespace` (impersonated) with the operator's own code. The
    operator that still runs keeps the taint (its deadline is an hour away); without the record
    it would remove it as a stray one."""
    operator = await api_client(kubeconfig)
    operator.set_default_header("Impersonate-User", operator_username(namespace))
    async with operator:
        record = {
            "token": token,
            "time": iso(time.time()),
            "deadline": iso(time.time() + 3600),
            "nodes": [node],
            "message": "a preemption in flight when quorum is uninstalled",
            "victims": [],
        }
        assert await writes.patch_gang_status(operator, *gang, {"preemption": record})
        listed = await raw_json(
            client.CoreV1Api(operator).list_node(
                field_selector=f"metadata.name={node}", _preload_content=False
            )
        )
        ops = writes.taint_patch(listed["items"][0], token)
        assert ops is not None and await writes.patch_node(operator, listed["items"][0], ops)


async def suspended_by_quorum(api: client.ApiClient, kubeconfig: Path, gang: tuple[str, str]) -> str:
    """A Job as quorum's recovery (or a preemption) leaves it while its pods go: suspended, and
    named in the gang's Gang (`status.recovery.suspendedJobs`, written as quorum's operator).
    quorum's recovery would resume it once its pods are gone; here nothing will but the
    uninstall. Its name."""
    name = "suspended-by-quorum"
    job = {
        "metadata": {"name": name},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                }
            },
        },
    }
    await client.BatchV1Api(api).create_namespaced_job(gang[0], job)
    operator = await api_client(kubeconfig)
    operator.set_default_header("Impersonate-User", operator_username("quorum-system"))
    async with operator:
        recovery = {"message": "suspended by a recovery", "suspendedJobs": [name]}
        assert await writes.patch_gang_status(operator, *gang, {"recovery": recovery})
    return name


async def wait_on_the_reserved_node(api: client.ApiClient, namespace: str, node: str) -> str:
    """A plain pod that may only go to `node`: kube-scheduler leaves it unscheduled, for the
    reservation taint. Its name."""
    name = "on-the-reserved-node"
    pod = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(namespace, pod)

    async def refused_for_the_taint() -> bool:
        found = await raw_json(core.read_namespaced_pod(name, namespace, _preload_content=False))
        assert not found["spec"].get("nodeName"), "bound to a reserved node"
        conditions = found["status"].get("conditions") or []
        # kube-scheduler names no taint key ("1 node(s) had untolerated taint(s)"); the node's
        # only one it must tolerate is the reservation.
        return any(
            c["type"] == "PodScheduled" and "untolerated taint" in c.get("message", "") for c in conditions
        )

    await eventually(refused_for_the_taint, timeout=60, what=f"{name} unscheduled: untolerated {RESERVED}")
    return name


async def bound_there_and_no_node_reserved(
    api: client.ApiClient, namespace: str, pod: str, node: str
) -> None:
    core = client.CoreV1Api(api)
    nodes = (await raw_json(core.list_node(_preload_content=False)))["items"]
    reserved = [
        n["metadata"]["name"]
        for n in nodes
        if any(t["key"] == RESERVED for t in n["spec"].get("taints") or [])
    ]
    assert reserved == [], f"nodes still reserved after the uninstall: {reserved}"

    async def bound() -> bool:
        found = await raw_json(core.read_namespaced_pod(pod, namespace, _preload_content=False))
        return bool(found["spec"].get("nodeName") == node)

    await eventually(bound, timeout=60, what=f"{pod} bound to {node}, no longer reserved")


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def leading(metrics: str) -> float | None:
    """quorum_operator_leader in quorum-operator's /metrics: 1 while it holds the Lease."""
    for line in metrics.splitlines():
        if line.startswith("quorum_operator_leader "):
            return float(line.split()[1])
    return None


def no_pod_creation_refused_by_controllers(events: list[dict[str, Any]]) -> None:
    denied = [e["message"] for e in events if e["reason"] == "FailedCreate"]
    assert not denied, f"a controller's pod creation was refused during the uninstall: {denied}"


async def test_quorum_uninstall_leaves_no_pod_gated_and_refuses_no_pod_creation(
    start_instance: Callable[..., Instance],
) -> None:
    instance = start_instance("t-uninstall")
    admin_kubeconfig = instance.kubeconfig("admin")
    # The Deployments, as a cluster has them (kwok plays their pods), so that step 3 deletes them.
    instance.kubectl(
        "apply",
        "-f",
        "-",
        input_text=render_files(
            ["20-webhooks-deployment.yaml", "50-operator-deployment.yaml"], "quorum-system"
        ),
    )
    api = await api_client(admin_kubeconfig)
    async with api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        await create_namespace(api, "ml")
        await create_podgroup(api, "ml", "held", 4)  # 2 of 4 members: held at the gate
        await apps.create_namespaced_deployment(
            "ml", workload("held", 2, {"pod-group.scheduling.sigs.k8s.io": "held"})
        )
        lone = {
            "pod-group.scheduling.sigs.k8s.io/name": "lone",
            "pod-group.scheduling.sigs.k8s.io/min-available": "2",
        }
        await apps.create_namespaced_deployment("ml", workload("lone", 1, lone))

        async def three_gated_and_recorded() -> list[str] | None:
            found = await gated_anywhere(api)
            gangs = await client.CustomObjectsApi(api).list_namespaced_custom_object(
                "quorum.dev", "v1alpha1", "ml", "gangs"
            )
            names = {g["metadata"]["name"] for g in gangs["items"]}
            return found if len(found) == 3 and names >= {"pg-held", "lbl-lone"} else None

        await eventually(three_gated_and_recorded, timeout=60, what="3 gated pods, 2 Gangs written")
        node, token = await plain_node(api), "uninstall-full"
        await reserve_as_the_operator(admin_kubeconfig, "quorum-system", ("ml", "pg-held"), node, token)
        waiting = await wait_on_the_reserved_node(api, "ml", node)

        # A dry run changes nothing and says every step.
        dry = await asyncio.to_thread(quorum, instance, admin_kubeconfig, "uninstall", "--dry-run")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert "1. MutatingWebhookConfiguration quorum-webhooks: would delete" in dry.stdout
        assert (
            "2. would release 3 gated pods of 2 gangs as system:serviceaccount:quorum-system:quorum-operator"
            in dry.stdout
        )
        assert "3. Deployment quorum-system/quorum-operator: would delete" in dry.stdout
        assert "4. Namespace quorum-system: would delete" in dry.stdout
        operator = operator_username("quorum-system")
        assert f"4. node {node}: would remove {RESERVED}={token} (as {operator})" in dry.stdout
        assert "0. Lease quorum-system/quorum-operator: would take it from " in dry.stdout
        assert dry.stdout.rstrip().endswith("dry run: nothing was changed")
        for kind, name in (
            ("mutatingwebhookconfiguration", "quorum-webhooks"),
            ("validatingadmissionpolicybinding", "quorum-gang-backstop"),
            ("crd", "gangs.quorum.dev"),
            ("namespace", "quorum-system"),
        ):
            instance.kubectl("get", kind, name)  # still there (fails otherwise)
        instance.kubectl("-n", "quorum-system", "get", "deployment", "quorum-operator", "quorum-webhooks")
        assert len(await gated_anywhere(api)) == 3
        assert token in instance.kubectl("get", "node", node, "-o", "jsonpath={.spec.taints}").stdout

        # The operator's Deployment goes in step 3, the Gangs in step 4: an operator still running
        # then would end the preemption itself (its gang is gone). Here it stopped before (deleted,
        # or crashed mid-preemption): nothing but the uninstall removes the taint.
        instance.stop_component("quorum-operator")
        job = await suspended_by_quorum(api, admin_kubeconfig, ("ml", "pg-held"))
        creates, load, customer = await start_creates(instance, "ml")
        try:
            await creates.more()
            done = await asyncio.to_thread(quorum, instance, admin_kubeconfig, "uninstall")
            assert done.returncode == 0, done.stdout + done.stderr
            # Right after it, before anything else is stopped: nothing gated, whatever was created meanwhile.
            assert await gated_anywhere(api) == []
            await creates.more()
        finally:
            creates.stop.set()
            await load
            await customer.close()
        print(f"\n{creates.created} pods created during the uninstall; its output:\n{done.stdout}")
        assert not creates.refused, creates.refused[:5]
        assert (
            "ml/pg-held: 2 of 2 gated pods released by hand by quorum-admin (quorum uninstall)" in done.stdout
        )
        assert "ml/lbl-lone: 1 of 1 gated pods released by hand" in done.stdout
        assert "1. MutatingWebhookConfiguration quorum-webhooks: deleted" in done.stdout
        # The operator stopped (crashed, say) still holds its Lease: taken, and its term waited out.
        assert "0. Lease quorum-system/quorum-operator: taken from " in done.stdout
        assert "0. Lease quorum-system/quorum-operator: held by quorum-uninstall: no replica" in done.stdout
        # The namespace manifests/00-namespace.yaml made (labelled quorum's) goes.
        assert "4. Namespace quorum-system: deleted" in done.stdout
        assert "4. CustomResourceDefinition gangs.quorum.dev: deleted, and with it" in done.stdout
        # After the operator's RBAC: as the caller (quorum's operator may no longer write a node).
        assert f"4. node {node}: removed {RESERVED}={token} (as " in done.stdout
        assert "4. 1 nodes no longer reserved by quorum: none seen in 5 looks in a row" in done.stdout
        assert done.stdout.rstrip().endswith("quorum is uninstalled")
        await bound_there_and_no_node_reserved(api, "ml", waiting, node)
        assert (
            f"2. Job ml/{job} (suspended by quorum, gang ml/pg-held): resumed (as {operator})" in done.stdout
        )

        async def job_ran() -> bool:
            found = await client.BatchV1Api(api).read_namespaced_job(job, "ml")
            return not found.spec.suspend and bool(found.status.active or found.status.succeeded)

        await eventually(job_ran, timeout=60, what=f"Job ml/{job} resumed and its pod running")
        # The Gangs went with their CRD; the record of the release stays in their Events.
        events = (await raw_json(core.list_namespaced_event("ml", _preload_content=False)))["items"]
        released = [
            e for e in events if e["reason"] == "ReleasedByHand" and e["involvedObject"]["kind"] == "Gang"
        ]
        assert {e["involvedObject"]["name"] for e in released} >= {"pg-held", "lbl-lone"}
        assert all("uninstalling quorum" in e["message"] for e in released)

        # What the Deployments' deletion stops in a cluster (the operator is stopped already).
        instance.stop_component("quorum-webhooks")
        for kind, name in (
            ("mutatingwebhookconfiguration", "quorum-webhooks"),
            ("validatingwebhookconfiguration", "quorum-webhooks"),
            ("validatingadmissionpolicy", "quorum-gate-protection"),
            ("validatingadmissionpolicy", "quorum-records"),
            ("clusterrole", "quorum-operator"),
        ):
            assert instance.kubectl("get", kind, name, check=False).returncode != 0, (kind, name)
        # quorum's records went with their CRD; the tenants' PodGroups, and so their CRD, stay.
        crds = instance.kubectl("get", "crd", "-o", "name").stdout
        assert "gangs.quorum.dev" not in crds and "podgroups.scheduling.sigs.k8s.io" in crds
        assert (
            "CustomResourceDefinition podgroups.scheduling.sigs.k8s.io: left: it holds 1 PodGroup object(s) "
            "of tenants" in done.stdout
        ), done.stdout

        async def namespace_gone() -> bool:
            return instance.kubectl("get", "namespace", "quorum-system", check=False).returncode != 0

        await eventually(namespace_gone, timeout=60, what="namespace quorum-system deleted")

        # Pods created after run, ungated.
        await apps.patch_namespaced_deployment_scale("held", "ml", {"spec": {"replicas": 4}})

        async def four_of_held() -> bool:
            dep = await apps.read_namespaced_deployment("held", "ml")
            return dep.status.available_replicas == 4

        await eventually(four_of_held, timeout=60, what="new pods created and running after the uninstall")
        assert await gated_anywhere(api) == []
        events = (await raw_json(core.list_namespaced_event("ml", _preload_content=False)))["items"]
        no_pod_creation_refused_by_controllers(events)

        again = await asyncio.to_thread(quorum, instance, admin_kubeconfig, "uninstall")
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.rstrip().endswith("nothing of quorum was left to remove"), again.stdout
        # The operator's RBAC is gone: the release looked as the caller instead.
        assert "2. no gang pod gated by quorum anywhere (as quorum-admin): nothing to release" in again.stdout
        assert ": deleted" not in again.stdout
        assert f"no node has quorum's reservation taint {RESERVED} (none seen in 5 looks" in again.stdout
        asked = await asyncio.to_thread(quorum, instance, admin_kubeconfig, "uninstall", "--delete-crds")
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert (
            "CustomResourceDefinition podgroups.scheduling.sigs.k8s.io: deleted, and with it 1 PodGroup "
            "object(s)" in asked.stdout
        ), asked.stdout


def lifecycle_identity(instance: Instance, namespace: str, probe_namespace: str = "default") -> Path:
    """The ServiceAccount a Helm hook Job runs as, with exactly the rights the docstrings of
    `quorum uninstall --admission-only` and `quorum certs ensure` list; a kubeconfig with its
    token (as devcluster makes the operator's)."""
    rules = removal.rights(removal.removal_plan(namespace, admission_only=True), namespace, probe_namespace)
    rules = removal.merged([*rules, *certs_ensure.rules(namespace)])
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": LIFECYCLE, "namespace": namespace},
    }
    manifests = [account, *removal.rbac_manifests(rules, LIFECYCLE, namespace)]
    instance.kubectl(
        "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    )
    token = instance.kubectl(
        "create", "token", LIFECYCLE, f"--namespace={namespace}", "--duration=1h"
    ).stdout.strip()
    state = instance.state()
    assert state is not None
    return write_kubeconfig(
        instance.layout.root / "lifecycle.kubeconfig",
        server=state.server,
        ca_pem=(instance.layout.pki / "ca.crt").read_bytes(),
        user=f"system:serviceaccount:{namespace}:{LIFECYCLE}",
        token=token,
        namespace=namespace,
    )


def customer_cannot_get_the_token(instance: Instance, namespace: str) -> None:
    """Whoever holds the lifecycle identity's token acts as quorum's operator (it may impersonate
    it): on 1.37 quorum's self-protection keeps the customer from minting one, from running a pod
    with it, from a Secret that holds one, and from a shell in a pod that has one."""
    victim = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hook", "namespace": namespace},
        "spec": {
            "serviceAccountName": LIFECYCLE,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }
    instance.kubectl("apply", "-f", "-", input_text=json.dumps(victim))  # the platform's hook pod
    token_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {
            "name": "stolen",
            "namespace": namespace,
            "annotations": {"kubernetes.io/service-account.name": LIFECYCLE},
        },
    }
    own_pod = {**victim, "metadata": {"name": "mine", "namespace": namespace}}
    attempts = {
        "mint a token": (("create", "token", LIFECYCLE, "-n", namespace), None),
        "run a pod as it": (("apply", "-f", "-"), json.dumps(own_pod)),
        "make a token Secret": (("apply", "-f", "-"), json.dumps(token_secret)),
        "exec into its pod": (
            (
                "exec",
                "-n",
                namespace,
                "hook",
                "--",
                "cat",
                "/var/run/secrets/kubernetes.io/serviceaccount/token",
            ),
            None,
        ),
    }
    for what, (argv, stdin) in attempts.items():
        tried = instance.kubectl(*argv, who="customer", input_text=stdin, check=False)
        assert tried.returncode != 0 and "quorum-namespace.static.k8s.io" in tried.stderr, (
            what,
            tried.stderr,
        )


async def test_admission_only_as_the_hook_identity_then_the_rest_in_any_order_refuses_no_pod(
    start_instance: Callable[..., Instance],
) -> None:
    namespace = "gpu-admission"
    instance = start_instance("t-uninstall-hook", namespace=namespace)
    hook = lifecycle_identity(instance, namespace)
    customer_cannot_get_the_token(instance, namespace)

    # The chart's post-install hook, with the same identity (the local webhooks stay trusted:
    # the dev CA they present is kept in the bundle).
    made = await asyncio.to_thread(
        quorum, instance, hook, "certs", "ensure", "--namespace", namespace, "--san", "127.0.0.1"
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"Secret {namespace}/quorum-webhooks-tls: created" in made.stdout

    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        apps = client.AppsV1Api(api)
        await create_namespace(api, "team")
        await apps.create_namespaced_deployment("team", workload("held", 2, NEVER_FORMS))

        async def held() -> bool:
            return len(await gated_anywhere(api)) == 2

        await eventually(held, timeout=60, what="the gang's 2 pods gated")

        async def gang_written() -> bool:
            return await writes.get_gang(api, "team", "lbl-stream") is not None

        await eventually(gang_written, timeout=30, what="Gang team/lbl-stream written")
        state = instance.state()
        assert state is not None
        metrics = f"http://127.0.0.1:{state.ports.operator}/metrics"

        async def leads() -> bool:
            return leading(await asyncio.to_thread(scrape, metrics)) == 1.0

        await eventually(leads, timeout=60, what="quorum-operator leads")
        node, token = await plain_node(api), "uninstall-hook"
        await reserve_as_the_operator(
            instance.kubeconfig("admin"), namespace, ("team", "lbl-stream"), node, token
        )
        waiting = await wait_on_the_reserved_node(api, "team", node)
        creates, load, customer = await start_creates(instance, "team")
        seed = int(time.time())
        try:
            await creates.more()
            hooked = await asyncio.to_thread(
                quorum, instance, hook, "uninstall", "--admission-only", "--namespace", namespace
            )
            assert hooked.returncode == 0, hooked.stdout + hooked.stderr
            assert await gated_anywhere(api) == []
            assert (
                "released by hand by system:serviceaccount:gpu-admission:quorum-lifecycle (quorum uninstall)"
                in hooked.stdout
            )
            assert hooked.stdout.rstrip().endswith("(any order is safe)")
            # quorum-operator stopped acting first: its Lease taken and its term waited out before
            # anything of admission went; it still runs, and says it no longer leads.
            lines = hooked.stdout.splitlines()
            taken = lines.index(next(line for line in lines if line.startswith("0. Lease ")))
            assert lines[taken].startswith(f"0. Lease {namespace}/quorum-operator: taken from "), lines[taken]
            assert lines[taken + 1].endswith(
                "no replica of quorum-operator acts now (each sees another holder, for 120 s at a time: "
                "renewed while the run goes on)"
            )
            assert all(line.startswith("0. ") for line in lines[: taken + 2])
            lease = await client.CoordinationV1Api(api).read_namespaced_lease("quorum-operator", namespace)
            # Left held 60 s more at the end of the hook: past the operator pods' termination.
            assert (
                lease.spec.holder_identity == "quorum-uninstall" and lease.spec.lease_duration_seconds == 60
            )
            assert f"3. Lease {namespace}/quorum-operator: held for 60 s more: " in hooked.stdout
            assert leading(await asyncio.to_thread(scrape, metrics)) == 0.0  # its /metrics answers: it runs
            # As quorum's operator, which still runs: the hook identity has no right on nodes.
            assert (
                f"3. node {node}: removed {RESERVED}={token} (as {operator_username(namespace)})"
                in hooked.stdout
            )
            await bound_there_and_no_node_reserved(api, "team", waiting, node)
            await creates.more()

            # Helm deletes the rest of the release in no particular order: each deletion (and
            # each process stopped) is followed by pods created, none refused or left gated.
            rest: list[tuple[str, ...]] = [("stop", "quorum-operator"), ("stop", "quorum-webhooks")]
            kept = set(removal.removal_plan(namespace, admission_only=True))
            for step in removal.removal_plan(namespace):
                served = step.target is not None and step.target.kind.group != "cert-manager.io"  # none here
                if step.target is not None and served and step not in kept:
                    target = step.target
                    where = ("-n", target.namespace) if target.namespace else ()
                    rest.append(
                        (
                            "delete",
                            *where,
                            target.kind.plural,
                            target.name,
                            "--ignore-not-found",
                            "--wait=false",
                        )
                    )
            random.Random(seed).shuffle(rest)
            print(f"\nseed {seed}: the rest deleted in the order {[' '.join(r) for r in rest]}")
            for action in rest:
                if action[0] == "stop":
                    instance.stop_component(action[1])
                else:
                    instance.kubectl(*action)
                await creates.more(2)
                assert await gated_anywhere(api) == [], action
        finally:
            creates.stop.set()
            await load
            await customer.close()
        assert not creates.refused, (seed, creates.refused[:5])

        await apps.create_namespaced_deployment("team", workload("after", 2, NEVER_FORMS))

        async def after_running() -> bool:
            dep = await apps.read_namespaced_deployment("after", "team")
            return dep.status.available_replicas == 2

        await eventually(after_running, timeout=60, what="a gang's pods created afterwards running, ungated")
        events = (
            await raw_json(client.CoreV1Api(api).list_namespaced_event("team", _preload_content=False))
        )["items"]
        no_pod_creation_refused_by_controllers(events)
