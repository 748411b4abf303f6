"""quorum installed, upgraded and uninstalled with its Helm chart on a local control plane, with a
gang held and a gang running throughout.

The local control plane runs no containers (kwok plays the kubelets) and has no Service
network, so what the release's pods would do is done on this machine (devcluster/helm.py):

- the instance starts without quorum (no CRDs, manifests or processes), and `helm install
  --wait` installs the chart with its default values (self-signed certificates; Helm creates
  the namespace) and `helm upgrade --wait` upgrades it, each with its hooks: Helm makes each
  hook's ServiceAccount, RBAC and Job and waits for the Job, whose pod the hook kubelet
  (`devcluster.helm.HookKubelet`) runs here with a token of that ServiceAccount, as a kubelet
  would. The certificate hook gets `--san 127.0.0.1` besides: the apiserver reaches the local
  server at that address instead of the Service's name. Its runs show the order: before the
  install the Secret alone, ahead of the Deployment that mounts it; after it, the caBundle of
  the configurations Helm made; around the upgrade nothing, since Helm's three-way merge keeps
  the caBundle the chart does not render;
- the uninstall's pre-delete hook runs with `run_hook` (the same identity, from `helm get
  hooks`) and then `helm uninstall --no-hooks`, so that the test can look between the two
  (tests/integration/test_readme_install.py lets Helm run it);
- quorum-webhooks and quorum-operator run as local processes the way the release's Deployments
  run them (the operator with a token of the release's ServiceAccount and its Deployment's
  environment; the server with the release's ConfigMap and Secret), and run again after the
  upgrade, as a rollout would;
- a Helm post-renderer points the release's webhook configurations at the local server, a URL
  on 127.0.0.1 in place of the Service (as kube-proxy would route it); nothing else differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import REPO_ROOT, Instance
from devcluster.helm import HookKubelet, HookRun, helm, post_renderer, run_hook, start_quorum
from tests.integration.test_gangs import GANGS, deployment, gated, get, pods
from tests.integration.test_uninstall import gated_anywhere
from tests.kube import api_client, create_namespace, create_podgroup, eventually, raw_json

pytestmark = pytest.mark.cluster

CHART = str(REPO_ROOT / "charts" / "quorum")
NAMESPACE = "quorum-system"
RELEASE = "quorum"


def release_present(instance: Instance) -> dict[str, bool]:
    """Whether the release's webhook Deployment and webhook configurations exist (what the hook
    kubelet notes as each hook starts: the order of hooks and release)."""

    def exists(*what: str) -> bool:
        return instance.kubectl("get", *what, check=False).returncode == 0

    return {
        "deployment": exists("deployment", "quorum-webhooks", f"--namespace={NAMESPACE}"),
        "configurations": exists("mutatingwebhookconfiguration", "quorum-webhooks")
        and exists("validatingwebhookconfiguration", "quorum-webhooks"),
    }


def helm_apply(instance: Instance, verb: str, *values: str) -> list[HookRun]:
    """`helm install` or `helm upgrade --wait` of the chart, with its hooks run by the hook
    kubelet; the hook runs, in order."""
    kubelet = HookKubelet(
        instance, {("quorum", "certs", "ensure"): ("--san", "127.0.0.1")}, lambda: release_present(instance)
    )
    with kubelet:
        helm(
            instance,
            verb,
            RELEASE,
            CHART,
            f"--namespace={NAMESPACE}",
            *(["--create-namespace"] if verb == "install" else []),
            "--wait",
            "--timeout=120s",
            f"--post-renderer={post_renderer(instance)}",
            *(f"--set={v}" for v in values),
        )
    kubelet.check()
    return kubelet.runs


def certs_runs(runs: list[HookRun]) -> list[tuple[dict[str, bool], int]]:
    return [(r.observed, r.returncode) for r in runs if r.job == "quorum-certs-hook"]


def hook(instance: Instance, event: str, *extra: str) -> str:
    ran = run_hook(instance, RELEASE, NAMESPACE, event, extra)
    assert ran.returncode == 0, f"{event} hook failed:\n{ran.stdout}{ran.stderr}"
    return ran.stdout


def default_scheduled(name: str, replicas: int, group: str) -> dict[str, Any]:
    """A Deployment of a PodGroup's pods that asks for no scheduler by name: what still runs
    once quorum, which rewrites cw-coscheduler to the default scheduler, is gone."""
    made = deployment(name, replicas, 0, None, group)
    del made["spec"]["template"]["spec"]["schedulerName"]
    return made


async def running(api: client.ApiClient, namespace: str, selector: str, count: int) -> dict[str, str] | None:
    """The pods' uids by name, once `count` of them run ungated."""
    found = await pods(api, namespace, selector)
    if len(found) == count and all(p["status"].get("phase") == "Running" and not gated(p) for p in found):
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in found}
    return None


async def operator_leads(api: client.ApiClient, instance: Instance) -> bool:
    """The Lease is held by the operator process running now (identity host_pid)."""
    state = instance.state()
    assert state is not None
    pid = [p.pid for p in state.processes if p.name == "quorum-operator"][-1]
    lease = await client.CoordinationV1Api(api).read_namespaced_lease("quorum-operator", NAMESPACE)
    return bool(lease.spec.holder_identity and lease.spec.holder_identity.endswith(f"_{pid}"))


async def failed_creates(api: client.ApiClient, namespace: str) -> list[str]:
    events = (await raw_json(client.CoreV1Api(api).list_namespaced_event(namespace, _preload_content=False)))[
        "items"
    ]
    return [e["message"] for e in events if e["reason"] == "FailedCreate"]


async def test_install_upgrade_and_uninstall_with_helm_keep_gangs_whole_and_strand_no_pod(
    start_instance: Callable[..., Instance],
) -> None:
    instance = start_instance("t-helm", install_manifests=False, webhooks=False, operator=False)
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        apps = client.AppsV1Api(api)
        assert "gangs.quorum.dev" not in instance.kubectl("get", "crd", "-o", "name").stdout

        # Install, waiting for the release: the Secret before the Deployments (pre-install), the
        # caBundle after the configurations (post-install). Then quorum's processes.
        runs = helm_apply(instance, "install")
        summary = "\n".join(f"{r.pod} {r.observed} -> {r.returncode}:\n{r.output}" for r in runs)
        assert certs_runs(runs) == [
            ({"deployment": False, "configurations": False}, 0),
            ({"deployment": True, "configurations": True}, 0),
        ], summary
        assert "quorum-webhooks-tls: created" in runs[0].output, summary
        assert runs[1].output.count("caBundle set") == 2 and "created" not in runs[1].output, summary
        start_quorum(instance, NAMESPACE)
        installed = json.loads(
            instance.kubectl("get", "validatingwebhookconfiguration", "quorum-webhooks", "-o", "json").stdout
        )
        assert all(w["clientConfig"].get("caBundle") for w in installed["webhooks"]), "the hook set the CA"
        assert not instance.kubectl("get", "serviceaccounts", "-A", "-o", "name").stdout.count("-hook")

        await create_namespace(api, "ml")
        await create_podgroup(api, "ml", "held", 4)
        await apps.create_namespaced_deployment("ml", deployment("held", 2, 0, None, "held"))
        await create_podgroup(api, "ml", "train", 2)
        await apps.create_namespaced_deployment("ml", deployment("train", 2, 0, None, "train"))
        train = await eventually(
            lambda: running(api, "ml", "app=train", 2), timeout=90, what="gang train released and Running"
        )

        async def held_gated() -> bool:
            found = await pods(api, "ml", "app=held")
            gang = await get(api, GANGS, "ml", "pg-held") or {}
            return (
                len(found) == 2
                and all(gated(p) for p in found)
                and gang.get("status", {}).get("members") == 2
            )

        await eventually(held_gated, timeout=60, what="gang held at 2 of 4, recorded on its Gang")

        # Upgrade with other replicas and a setting: a rollout of both processes. Nothing is due
        # before it, and after it both configurations still trust the Secret's CA: Helm's
        # three-way merge left the caBundle, which the chart does not render.
        runs = helm_apply(
            instance,
            "upgrade",
            "operator.replicas=3",
            "webhooks.replicas=3",
            "operator.settings.starvationSeconds=90",
        )
        summary = "\n".join(f"{r.pod} {r.observed} -> {r.returncode}:\n{r.output}" for r in runs)
        assert [returncode for _, returncode in certs_runs(runs)] == [0, 0] and len(runs) == 2, summary
        assert all("nothing to do" in r.output for r in runs), summary
        assert runs[1].output.count("caBundle trusts the Secret's CA: unchanged") == 2, summary
        operator = await apps.read_namespaced_deployment("quorum-operator", NAMESPACE)
        assert operator.spec.replicas == 3
        env = {e.name: e.value for e in operator.spec.template.spec.containers[0].env}
        assert env["QUORUM_OPERATOR_STARVATION_SECONDS"] == "90"
        assert (await apps.read_namespaced_deployment("quorum-webhooks", NAMESPACE)).spec.replicas == 3
        start_quorum(instance, NAMESPACE)
        await eventually(lambda: operator_leads(api, instance), timeout=60, what="the new operator leading")
        assert await running(api, "ml", "app=train", 2) == train, "the running gang's pods were touched"
        assert await held_gated(), "the held gang was released by the upgrade"
        await apps.patch_namespaced_deployment_scale("held", "ml", {"spec": {"replicas": 4}})
        await eventually(
            lambda: running(api, "ml", "app=held", 4), timeout=90, what="gang held released whole"
        )

        # A gang still held when the uninstall starts.
        await create_podgroup(api, "ml", "late", 3)
        await apps.create_namespaced_deployment("ml", default_scheduled("late", 1, "late"))

        async def late_gated() -> bool:
            found = await pods(api, "ml", "app=late")
            return len(found) == 1 and gated(found[0])

        await eventually(late_gated, timeout=30, what="gang late gated")

        # Uninstall: the pre-delete hook, then Helm deletes the release.
        removed = hook(instance, "pre-delete")
        assert "ml/pg-late" in removed, removed
        assert await gated_anywhere(api) == []
        await apps.patch_namespaced_deployment_scale("late", "ml", {"spec": {"replicas": 2}})
        helm(instance, "uninstall", RELEASE, f"--namespace={NAMESPACE}", "--no-hooks", "--wait")
        for component in ("quorum-operator", "quorum-webhooks"):
            instance.stop_component(component)  # the Deployments' pods are gone
        kinds = "validatingwebhookconfigurations,mutatingwebhookconfigurations,validatingadmissionpolicies"
        kinds += ",clusterroles"
        left = [n for n in instance.kubectl("get", kinds, "-o", "name").stdout.split() if "/quorum-" in n]
        assert left == [], f"left by helm uninstall: {left}"
        crds = instance.kubectl("get", "crd", "-o", "name").stdout
        assert "gangs.quorum.dev" in crds and "podgroups.scheduling.sigs.k8s.io" in crds, "crds.keep"
        await apps.patch_namespaced_deployment_scale("late", "ml", {"spec": {"replicas": 3}})
        await apps.create_namespaced_deployment("ml", default_scheduled("after", 2, "after"))
        await eventually(
            lambda: running(api, "ml", "app=late", 3), timeout=60, what="new pods run without quorum"
        )
        await eventually(
            lambda: running(api, "ml", "app=after", 2), timeout=60, what="a new group's pods run"
        )
        assert await gated_anywhere(api) == []
        assert await failed_creates(api, "ml") == [], "a pod creation was refused during the uninstall"


async def test_a_scheduler_plugins_crd_installed_before_stays_theirs(
    start_instance: Callable[..., Instance],
) -> None:
    """The chart leaves scheduling.x-k8s.io's PodGroup CRD alone where someone else installed it
    (lookup): not taken over, not deleted by `helm uninstall`, not labelled quorum's."""
    from tests.integration.test_crd_ownership import CRD, their_crd

    instance = start_instance("t-helm-crd", install_manifests=False, webhooks=False, operator=False)
    instance.kubectl("create", "-f", "-", input_text=json.dumps(their_crd()))
    helm_apply(instance, "install")
    manifest = helm(instance, "get", "manifest", RELEASE, f"--namespace={NAMESPACE}").stdout
    assert CRD not in manifest and "podgroups.scheduling.sigs.k8s.io" in manifest
    crd: dict[str, Any] = json.loads(instance.kubectl("get", "crd", CRD, "-o", "json").stdout)
    assert crd["metadata"]["labels"] == their_crd()["metadata"]["labels"]
    assert "meta.helm.sh/release-name" not in (crd["metadata"].get("annotations") or {})
    helm(instance, "uninstall", RELEASE, f"--namespace={NAMESPACE}", "--no-hooks")
    assert instance.kubectl("get", "crd", CRD, check=False).returncode == 0
