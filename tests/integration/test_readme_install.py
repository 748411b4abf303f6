"""README.md's install and uninstall commands, run as written, on the local control plane.

The commands are read from README.md on every run: the fenced block after the comment
`<!-- install: ... -->` and the one after `<!-- uninstall -->` (`readme_commands`; a README
without them fails here, saying which). Each line runs as written in bash, from the repository's
root, after sourcing an env file like `.quorum/env` (`helm`, `kubectl` and `quorum` resolve to
the built ones, KUBECONFIG is the instance's admin). The install block has two ways: the lines
that name dist/quorum.yaml are the one-manifest install (after `make release-manifests`, as its
comment says), the others the Helm install; the uninstall block's `helm` line goes with the
Helm install, its other line with the one manifest. Each way runs on its own instance, started
without quorum.

What the local control plane cannot do, and what stands in for it (the README's commands do not
do these; they are what a cluster's kubelets, kube-proxy and cert-manager would do):

- Hooks run for real: Helm creates each hook's ServiceAccount, RBAC and Job and waits for the
  Job. `devcluster.helm.HookKubelet` is the kubelet of the hook pods: it runs each one's command
  on this machine with a token of the pod's ServiceAccount and ends the pod Succeeded or Failed
  by its exit code, so that the Job controller completes the Job and Helm goes on. The
  certificate hook's command gets `--san 127.0.0.1` besides, the address at which the apiserver
  reaches the local webhook server instead of the Service's name (no Service network here).
- After the install, the webhook configurations are pointed at a local quorum-webhooks by URL
  (kube-proxy's part), and quorum-webhooks and quorum-operator run as local processes with the
  release's Secret, ConfigMap, settings and ServiceAccount (the kubelet's part: `start_quorum`);
  they are stopped once the uninstall has deleted their Deployments.
- The one manifest's certificate is cert-manager's, which does not run here: its two kinds are
  schemaless CRDs, and the test makes the Secret the Certificate asks for and injects its CA
  into the webhook configurations, as cert-manager and its CA injector would.

Then a gang held and a gang running, and the uninstall block's line as written while a customer
creates gang pods and plain pods: none refused, no pod left gated, no FailedCreate Event, new
pods run, and quorum's objects are gone but what docs/install.md says stays.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.build import ensure_helm
from devcluster.cluster import REPO_ROOT, Instance, write_env_file
from devcluster.helm import HookKubelet, HookRun, local_webhooks_url, route_installed_webhooks, start_quorum
from quorum.webhooks import certs, tls
from tests.integration.test_gangs import GANGS, deployment, gated, get, pods
from tests.integration.test_helm import default_scheduled, failed_creates, release_present, running
from tests.integration.test_one_manifest import cert_manager_stand_in
from tests.integration.test_uninstall import gated_anywhere, start_creates
from tests.kube import api_client, create_namespace, create_podgroup, eventually

pytestmark = pytest.mark.cluster

README = REPO_ROOT / "README.md"
NAMESPACE = "quorum-system"
ONE_MANIFEST = "dist/quorum.yaml"
COMMAND_TIMEOUT = 240  # each line; the hooks take seconds, Helm's own --timeout is 5 minutes
CERTS_HOOK = ("quorum", "certs", "ensure")


# -- the README's blocks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadmeCommands:
    helm_install: list[str]
    manifest_install: list[str]
    helm_uninstall: list[str]
    manifest_uninstall: list[str]


def block_after(text: str, marker: str) -> list[str]:
    """The command lines (comments and blank lines left out) of the fenced block that follows
    the HTML comment `<!-- marker... -->`."""
    found = re.search(
        r"<!--\s*" + re.escape(marker) + r"\b[^>]*-->\s*\n```[a-z]*\n(.*?)\n```", text, re.DOTALL
    )
    if found is None:
        raise AssertionError(
            f"README.md has no fenced block right after a `<!-- {marker} -->` comment: "
            "tests/integration/test_readme_install.py runs that block's commands"
        )
    lines = [line.strip() for line in found.group(1).splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    if not commands:
        raise AssertionError(f"README.md's block after `<!-- {marker} -->` has no command")
    return commands


def readme_commands(text: str) -> ReadmeCommands:
    """The README's install block split into its two ways, and the uninstall block likewise."""
    install, uninstall = block_after(text, "install"), block_after(text, "uninstall")
    manifest = [c for c in install if ONE_MANIFEST in c]
    helm_way = [c for c in install if ONE_MANIFEST not in c]
    helm_removal = [c for c in uninstall if c.split()[0] == "helm"]
    manifest_removal = [c for c in uninstall if c.split()[0] != "helm"]
    for way, lines in (
        ("the Helm install (lines without dist/quorum.yaml)", helm_way),
        ("the one-manifest install (a line naming dist/quorum.yaml)", manifest),
        ("the Helm uninstall (a `helm` line)", helm_removal),
        ("the one-manifest uninstall (a line other than `helm`)", manifest_removal),
    ):
        if not lines:
            raise AssertionError(f"README.md's install/uninstall blocks have no line for {way}")
    if not helm_way[0].startswith("helm "):
        raise AssertionError(f"the Helm install should start with `helm`: {helm_way}")
    return ReadmeCommands(helm_way, manifest, helm_removal, manifest_removal)


# -- running them ----------------------------------------------------------------------------------


def shell_env(instance: Instance, root: Path) -> Path:
    """An env file like `.quorum/env` for `instance`: PATH with the built kubectl and helm and
    this checkout's `quorum`, KUBECONFIG the instance's admin."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(instance.kubeconfig("admin"), root / "kubeconfig")
    return write_env_file(root, [instance.binaries.bin_dir, ensure_helm().parent])


def shell(env_file: Path, line: str) -> str:
    """One README line, as written, in bash from the repository's root; its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "HELM_NAMESPACE")}
    ran = subprocess.run(
        ["bash", "-c", f". {shlex.quote(str(env_file))}\n{line}\n"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    assert ran.returncode == 0, f"`{line}` exited {ran.returncode}:\n{ran.stdout}{ran.stderr}"
    return ran.stdout + ran.stderr


def exists(instance: Instance, *what: str) -> bool:
    return instance.kubectl("get", *what, check=False).returncode == 0


def hook_summary(runs: list[HookRun]) -> str:
    return "\n".join(
        f"{r.job} {r.pod} -> {r.returncode} in {r.seconds:.1f}s {r.observed}:\n{r.output}" for r in runs
    )


# -- what the plane stands in for ------------------------------------------------------------------


def play_cert_manager(instance: Instance) -> None:
    """The Secret the manifest's Certificate asks for (a CA and a serving certificate; with
    127.0.0.1 too, where the apiserver reaches the local server) and its CA in the webhook
    configurations that ask for it (annotation cert-manager.io/inject-ca-from)."""
    certificate = json.loads(
        instance.kubectl(
            "get", "certificates.cert-manager.io", "quorum-webhooks", f"-n={NAMESPACE}", "-o=json"
        ).stdout
    )
    names = (*certificate["spec"]["dnsNames"], "127.0.0.1")
    ca, cert, key = tls.issue(names)
    secret = certs.secret_manifest(ca, cert, key, NAMESPACE)
    secret["metadata"]["name"] = certificate["spec"]["secretName"]
    secret["metadata"]["annotations"] = {"cert-manager.io/certificate-name": "quorum-webhooks"}
    instance.kubectl("create", "-f", "-", input_text=json.dumps(secret))
    bundle = base64.b64encode(ca).decode()
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        found = json.loads(instance.kubectl("get", kind, "quorum-webhooks", "-o=json").stdout)
        assert (
            found["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            == f"{NAMESPACE}/quorum-webhooks"
        )
        for webhook in found["webhooks"]:
            webhook["clientConfig"]["caBundle"] = bundle
        instance.kubectl("replace", "-f", "-", input_text=json.dumps(found))


def run_quorum_locally(instance: Instance) -> None:
    route_installed_webhooks(instance)
    start_quorum(instance, NAMESPACE)
    configuration = json.loads(
        instance.kubectl("get", "validatingwebhookconfiguration", "quorum-webhooks", "-o=json").stdout
    )
    assert all(
        w["clientConfig"]["url"].startswith(local_webhooks_url(instance))
        and w["clientConfig"].get("caBundle")
        for w in configuration["webhooks"]
    )


async def while_quorum_webhooks_is_unreachable(api: client.ApiClient) -> None:
    """Pods are admitted in the apiserver (the cluster serves MutatingAdmissionPolicy, so the
    chart's `auto` takes `policies`): a plain pod is created with its CPU toleration and a gang
    pod gated, without the server; a gang whose name only the server can make (a dotted group)
    is refused by the backstop policy, so nothing bypasses gang admission: its controller would
    retry."""
    core = client.CoreV1Api(api)
    await create_namespace(api, "early")
    container = {"name": "c", "image": "registry.k8s.io/pause:3.10"}
    plain = await core.create_namespaced_pod(
        "early", {"metadata": {"name": "plain"}, "spec": {"containers": [container]}}
    )
    assert any(t.key == "is_cpu_compute" for t in plain.spec.tolerations or [])
    member = await core.create_namespaced_pod(
        "early",
        {
            "metadata": {"name": "member", "labels": {"pod-group.scheduling.sigs.k8s.io": "early"}},
            "spec": {"containers": [container]},
        },
    )
    assert [g.name for g in member.spec.scheduling_gates or []] == ["quorum.dev/gang"]
    gang_pod = {
        "metadata": {"name": "dotted", "labels": {"pod-group.scheduling.sigs.k8s.io": "early.1"}},
        "spec": {"containers": [container]},
    }
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod("early", gang_pod)
    assert refused.value.status == 403 and "quorum-gang-backstop" in str(refused.value.body), (
        refused.value.body
    )
    await core.delete_namespace("early")


# -- gangs through the install and the uninstall ----------------------------------------------------


async def hold_one_gang_and_run_another(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    await create_namespace(api, "ml")
    await create_podgroup(api, "ml", "held", 4)
    await apps.create_namespaced_deployment("ml", deployment("held", 2, 0, None, "held"))
    await create_podgroup(api, "ml", "train", 2)
    await apps.create_namespaced_deployment("ml", deployment("train", 2, 0, None, "train"))
    await eventually(lambda: running(api, "ml", "app=train", 2), timeout=90, what="gang train Running")

    async def held() -> bool:
        found = await pods(api, "ml", "app=held")
        gang = await get(api, GANGS, "ml", "pg-held") or {}
        return len(found) == 2 and all(gated(p) for p in found) and gang.get("status", {}).get("members") == 2

    await eventually(held, timeout=60, what="gang held at 2 of 4, recorded on its Gang")


async def uninstall_while_a_customer_creates_pods(
    instance: Instance, api: client.ApiClient, env_file: Path, lines: list[str], kubelet: HookKubelet
) -> list[str]:
    """The uninstall lines, as written, while a customer creates gang pods and plain pods; then
    the Deployments' pods (here, quorum's local processes) go, as the kubelet would end them."""
    creates, workers, customer = await start_creates(instance, "ml")
    outputs = []
    try:
        await creates.more(4)
        with kubelet:
            for line in lines:
                outputs.append(await asyncio.to_thread(shell, env_file, line))
        kubelet.check()
        apps = client.AppsV1Api(api)
        left = await apps.list_namespaced_deployment(NAMESPACE)
        assert [d.metadata.name for d in left.items] == [], "the uninstall deleted the Deployments"
        for component in ("quorum-operator", "quorum-webhooks"):
            instance.stop_component(component)
        await creates.more(4)  # and after it, with nothing of quorum running
    finally:
        creates.stop.set()
        await workers
        await customer.close()
    assert creates.refused == [], creates.refused[:5]
    return outputs


async def nothing_gated_nothing_refused_new_pods_run(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    assert await gated_anywhere(api) == []
    # The held gang's pods, released by the uninstall, run; so do a new group's.
    await eventually(lambda: running(api, "ml", "app=held", 2), timeout=60, what="the released gang runs")
    await apps.create_namespaced_deployment("ml", default_scheduled("after", 2, "after"))
    await eventually(lambda: running(api, "ml", "app=after", 2), timeout=60, what="a new group's pods run")
    assert await gated_anywhere(api) == []
    assert await failed_creates(api, "ml") == [], "a pod creation was refused during the uninstall"


def quorums_cluster_objects(instance: Instance) -> list[str]:
    kinds = (
        "mutatingwebhookconfigurations,validatingwebhookconfigurations,validatingadmissionpolicies,"
        "validatingadmissionpolicybindings,clusterroles,clusterrolebindings"
    )
    # quorum:platform:* are the local plane's own (its platform identity), not quorum's.
    return [n for n in instance.kubectl("get", kinds, "-o", "name").stdout.split() if "/quorum-" in n]


def namespace_objects(instance: Instance) -> set[str]:
    kinds = (
        "deployments,replicasets,pods,services,configmaps,secrets,serviceaccounts,roles,rolebindings,"
        "networkpolicies,poddisruptionbudgets,jobs,leases"
    )
    out = instance.kubectl("get", kinds, f"--namespace={NAMESPACE}", "-o", "name").stdout
    return set(out.split())


# -- the tests -------------------------------------------------------------------------------------


async def test_the_readmes_helm_install_and_uninstall_run_as_written(
    start_instance: Callable[..., Instance], tmp_path: Path
) -> None:
    commands = readme_commands(README.read_text())
    instance = start_instance("t-readme", install_manifests=False, webhooks=False, operator=False)
    env_file = shell_env(instance, tmp_path / "env")
    assert "gangs.quorum.dev" not in instance.kubectl("get", "crd", "-o", "name").stdout

    # Install: Helm runs the certificate hook before (the Secret, ahead of the Deployments that
    # mount it) and after (the caBundle of the configurations it has just made).
    kubelet = HookKubelet(instance, {CERTS_HOOK: ("--san", "127.0.0.1")}, lambda: release_present(instance))
    with kubelet:
        for line in commands.helm_install:
            shell(env_file, line)
    kubelet.check()
    runs = [r for r in kubelet.runs if r.job == "quorum-certs-hook"]
    summary = hook_summary(kubelet.runs)
    assert [r.returncode for r in runs] == [0, 0] and len(kubelet.runs) == 2, summary
    assert [r.observed for r in runs] == [
        {"deployment": False, "configurations": False},
        {"deployment": True, "configurations": True},
    ], f"hook order is pre-install, install, post-install:\n{summary}"
    assert "quorum-webhooks-tls: created" in runs[0].output, summary
    assert "caBundle set" in runs[1].output and "created" not in runs[1].output, summary
    assert quorums_cluster_objects(instance), "installed"
    assert not [n for n in namespace_objects(instance) if "-hook" in n], (
        "hook objects are gone after the hooks"
    )
    labels = json.loads(instance.kubectl("get", "namespace", NAMESPACE, "-o=json").stdout)["metadata"][
        "labels"
    ]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"

    # Before the webhooks are routed, the apiserver cannot reach quorum-webhooks: what a tenant
    # gets while it does not trust or reach the server (docs/install.md, "Certificates").
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        await while_quorum_webhooks_is_unreachable(api)
    run_quorum_locally(instance)
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        await hold_one_gang_and_run_another(api)
        kubelet = HookKubelet(instance, observe=lambda: release_present(instance))
        await uninstall_while_a_customer_creates_pods(
            instance, api, env_file, commands.helm_uninstall, kubelet
        )
        summary = hook_summary(kubelet.runs)
        assert [(r.job, r.returncode) for r in kubelet.runs] == [("quorum-uninstall-hook", 0)], summary
        assert kubelet.runs[0].observed == {"deployment": True, "configurations": True}, summary
        assert "ml/pg-held" in kubelet.runs[0].output, summary
        await nothing_gated_nothing_refused_new_pods_run(api)

    # Left, as docs/install.md says: the CRDs (crds.keep), the namespace Helm made, and in it
    # what quorum made at run time: the certificate hook's Secret and the operator's Lease.
    assert quorums_cluster_objects(instance) == []
    crds = instance.kubectl("get", "crd", "-o", "name").stdout
    for crd in ("gangs.quorum.dev", "podgroups.scheduling.sigs.k8s.io", "podgroups.scheduling.x-k8s.io"):
        assert f"/{crd}" in crds, crd

    async def only_what_stays() -> set[str] | None:
        left = namespace_objects(instance)
        stays = {
            "secret/quorum-webhooks-tls",
            "lease.coordination.k8s.io/quorum-operator",
            "serviceaccount/default",
            "configmap/kube-root-ca.crt",
        }
        return left if left == stays else None

    await eventually(only_what_stays, timeout=60, what="only the Secret and the Lease left in quorum-system")


async def test_the_readmes_one_manifest_install_and_uninstall_run_as_written(
    start_instance: Callable[..., Instance], tmp_path: Path
) -> None:
    commands = readme_commands(README.read_text())
    made = subprocess.run(  # noqa: ASYNC221 (before anything else runs)
        ["make", "-s", "release-manifests"],  # what the README's line says the manifest comes from
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    instance = start_instance("t-readme-manifest", install_manifests=False, webhooks=False, operator=False)
    env_file = shell_env(instance, tmp_path / "env")
    instance.kubectl("create", "-f", "-", input_text=json.dumps(cert_manager_stand_in()))
    for crd in ("issuers", "certificates"):
        instance.wait_established(f"crd/{crd}.cert-manager.io")

    for line in commands.manifest_install:
        shell(env_file, line)
    play_cert_manager(instance)
    run_quorum_locally(instance)
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        await hold_one_gang_and_run_another(api)
        kubelet = HookKubelet(instance)  # no hook here: it must find nothing to run
        outputs = await uninstall_while_a_customer_creates_pods(
            instance, api, env_file, commands.manifest_uninstall, kubelet
        )
        assert kubelet.runs == []
        assert "ml/pg-held" in "\n".join(outputs), outputs
        await nothing_gated_nothing_refused_new_pods_run(api)

    # Everything of quorum goes with `quorum uninstall`, the namespace too, but a PodGroup CRD
    # that still holds tenants' PodGroups (docs/lifecycle.md): the Gang CRD goes with quorum's
    # records (the apiserver finishes deleting a CRD's objects after the command).
    assert quorums_cluster_objects(instance) == []
    assert "podgroups.scheduling.sigs.k8s.io" in "\n".join(outputs), outputs

    def left() -> list[str]:
        crds = instance.kubectl("get", "crd", "-o", "name").stdout.split()
        found = [c for c in crds if c.endswith(".quorum.dev")]
        if "customresourcedefinition.apiextensions.k8s.io/podgroups.scheduling.sigs.k8s.io" not in crds:
            found.append("podgroups.scheduling.sigs.k8s.io deleted with the tenants' PodGroups")
        namespace = instance.kubectl("get", "namespace", NAMESPACE, "-o=json", check=False)
        if namespace.returncode == 0:
            found.append(f"namespace {NAMESPACE}: {json.loads(namespace.stdout).get('status')}")
        return found

    async def gone() -> bool:
        return not left()

    try:
        await eventually(
            gone, timeout=90, what=f"the Gang CRD and namespace {NAMESPACE} deleted, PodGroups kept"
        )
    except AssertionError as err:
        raise AssertionError(f"{err}; left: {left()}") from None
