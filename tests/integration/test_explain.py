"""`quorum explain`, `get` and `version` (and `kubectl quorum`) on the real control plane: a gang
held for lack of room is explained with the planner's own answer, the same the operator recorded;
a namespace's tenant, who may not read nodes, gets the recorded view and nothing of other
namespaces; with the operator stopped, explain still answers from the API alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import REPO_ROOT, Instance, write_env_file
from devcluster.nodes import TestPool
from quorum.commands.explain import diagnose
from quorum.core.diagnosis import MAX_LINE_BYTES, MAX_LINES, MAX_WIDTH, Diagnosis, columns
from quorum.k8s import command_reads
from tests.integration.test_gangs import GANGS, admitted, all_running, deployment, gang_condition, get
from tests.kube import api_client, create_namespace, create_podgroup, create_pool_nodes, eventually

pytestmark = pytest.mark.cluster
JSON = dict[str, Any]


def quorum(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    """The `quorum` command, as a person runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "quorum", *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


async def hold_for_lack_of_room(customer_api: client.ApiClient, namespace: str, pool: TestPool) -> None:
    """Gang pg-train, 3 pods of 8 GPUs, on a pool of two 8-GPU nodes, the second half used by a
    pod of no gang: one pod fits, two do not."""
    spec = {
        **pool.pod_spec(),
        "containers": [
            {
                "name": "c",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": "4"}},
            }
        ],
    }
    spec["nodeSelector"] = {**spec["nodeSelector"], "kubernetes.io/hostname": pool.names[1]}
    await client.CoreV1Api(customer_api).create_namespaced_pod(
        namespace, {"metadata": {"name": "filler"}, "spec": spec}
    )
    await create_podgroup(customer_api, namespace, "train", 3)
    await client.AppsV1Api(customer_api).create_namespaced_deployment(
        namespace, deployment("train", 3, 8, pool, "train")
    )


def recorded_message(gang: JSON | None) -> str:
    return str(admitted(gang).get("message") or "")


async def planned_as_recorded(api: client.ApiClient, namespace: str) -> tuple[Diagnosis, str]:
    """explain's planned view once it says what the operator recorded (nodes of other tests come
    and go, changing the counts of both: they agree once the operator's next pass has written)."""

    async def agree() -> tuple[Diagnosis, str] | None:
        diagnosis = await diagnose(api, namespace, "pg-train", time.time())
        recorded = recorded_message(await get(api, GANGS, namespace, "pg-train"))
        said = f"{diagnosis.message}; no preemption{diagnosis.preemption.removeprefix('none')}"
        return (diagnosis, recorded) if said == recorded else None

    return await eventually(agree, timeout=60, interval=1.0, what="explain to say what the operator recorded")


def assert_one_screen(out: str) -> list[str]:
    lines = out.splitlines()
    assert 0 < len(lines) <= MAX_LINES, out
    assert all(columns(line) <= MAX_WIDTH and len(line.encode()) <= MAX_LINE_BYTES for line in lines), out
    return lines


async def test_explain_gives_the_planners_answer_and_what_the_operator_recorded(
    cluster: Instance,
    customer_api: client.ApiClient,
    api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
) -> None:
    pool: TestPool = await test_pool(count=2)
    await hold_for_lack_of_room(customer_api, namespace, pool)
    await all_running(api, namespace, 1, "")  # the filler
    await gang_condition(
        api, namespace, "pg-train", "Unschedulable", containing="no preemption (NothingToPreempt)"
    )

    diagnosis, _ = await planned_as_recorded(api, namespace)
    assert diagnosis.view.startswith("planned now from ") and diagnosis.view.endswith(" nodes you can read")
    assert "3 pods × 8 nvidia.com/gpu" in diagnosis.message and "1 has room for one" in diagnosis.message
    assert "1 such pods fit in all: short by 2" in diagnosis.message
    assert diagnosis.shortfall == (("nvidia.com/gpu", 24000, 12000),)
    mine = {v.node: v for v in diagnosis.nodes if v.node in pool.names}
    assert (mine[pool.names[0]].reason, mine[pool.names[0]].room) == (None, 1)
    assert (mine[pool.names[1]].reason, mine[pool.names[1]].free) == ("Insufficient nvidia.com/gpu", 4000)
    assert not [v for v in diagnosis.nodes if v.reason is None and v.node not in pool.names]
    assert (diagnosis.members, diagnosis.min_member, diagnosis.reason) == (3, 3, "Unschedulable")
    assert any(e.reason == "Unschedulable" and e.type == "Warning" for e in diagnosis.events)

    shown = quorum("explain", f"{namespace}/pg-train", kubeconfig=cluster.kubeconfig("admin"))
    assert shown.returncode == 0, shown.stderr
    lines = assert_one_screen(shown.stdout)
    assert lines[0].startswith(f"gang {namespace}/pg-train: Pending, not admitted for ")
    assert f"1 node with room (1 pod in all): {pool.names[0]} (1)" in shown.stdout
    assert f"1 node: Insufficient nvidia.com/gpu (a pod needs 8, 4 free): {pool.names[1]}" in shown.stdout
    assert (
        "short in all, on the nodes it may use: nvidia.com/gpu needs 24, 12 free (short by 12)"
        in shown.stdout
    )

    listed = quorum("get", "-A", kubeconfig=cluster.kubeconfig("admin"))
    assert listed.returncode == 0, listed.stderr
    row = next(line.split() for line in listed.stdout.splitlines() if f"{namespace} " in line)
    assert row[:5] == [namespace, "pg-train", "Pending", "3/3", "0/0"] and row[6] == "Unschedulable", row


async def test_the_planning_reads_page_through_the_apiserver(
    api: client.ApiClient, test_pool: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two objects a page, the apiserver's continue tokens followed: the same nodes as one list."""
    await test_pool(count=3)
    monkeypatch.setattr(command_reads, "PAGE", 2)
    found = await command_reads.cluster_objects(api)
    listed = (await client.CoreV1Api(api).list_node()).items
    assert len(listed) >= 3
    assert sorted(n["metadata"]["name"] for n in found.nodes) == sorted(n.metadata.name for n in listed)
    assert len({p["metadata"]["uid"] for p in found.pods}) == len(found.pods)


@pytest.fixture
async def tenant(cluster: Instance, api: client.ApiClient, namespace: str) -> AsyncIterator[Path]:
    """The kubeconfig of a tenant with `edit` in the test's namespace and nothing elsewhere."""
    binding = {
        "metadata": {"name": "tenant-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tenant@example.com"}],
    }
    await client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(namespace, binding)
    yield cluster.kubeconfig("tenant")


async def test_a_tenant_who_cannot_read_nodes_gets_the_recorded_view_and_nothing_of_others(
    cluster: Instance,
    customer_api: client.ApiClient,
    api: client.ApiClient,
    namespace: str,
    tenant: Path,
    test_pool: Callable[..., Any],
) -> None:
    pool: TestPool = await test_pool(count=2)
    await hold_for_lack_of_room(customer_api, namespace, pool)
    held = await gang_condition(api, namespace, "pg-train", "Unschedulable", containing="no preemption")
    async with await api_client(tenant) as tenant_api:
        diagnosis = await diagnose(tenant_api, namespace, "pg-train", time.time())
    assert (
        diagnosis.view.startswith("as recorded by quorum-operator at ")
        and "(you cannot read nodes)" in diagnosis.view
    )
    assert recorded_message(held).startswith(diagnosis.message + "; no preemption")
    assert not diagnosis.nodes and diagnosis.shortfall is None

    shown = quorum("explain", "pg-train", "-n", namespace, kubeconfig=tenant)
    assert shown.returncode == 0, shown.stderr
    assert_one_screen(shown.stdout)
    assert "(you cannot read nodes)" in shown.stdout and "why: needs 3 pods placed together" in shown.stdout
    for other in [*pool.names, "kube-system", "quorum-system"]:  # nothing it may not read itself
        assert other not in shown.stdout, other

    mine = quorum("get", "-n", namespace, kubeconfig=tenant)
    assert mine.returncode == 0 and "pg-train" in mine.stdout, mine.stderr
    everywhere = quorum("get", "-A", kubeconfig=tenant)
    assert everywhere.returncode == 1
    assert "you may not list gangs.quorum.dev in every namespace" in everywhere.stderr
    missing = quorum("explain", "train", "-n", namespace, kubeconfig=tenant)
    assert missing.returncode == 2 and "did you mean pg-train" in missing.stderr, missing.stderr


async def test_explain_answers_with_the_operator_stopped(start_instance: Callable[..., Instance]) -> None:
    instance = start_instance("t-explain")
    admin = instance.kubeconfig("admin")
    pool = TestPool("tp-explain", 2)
    async with await api_client(instance.kubeconfig("platform")) as platform:
        await create_pool_nodes(platform, pool)
    async with await api_client(admin) as api:
        await create_namespace(api, "ml")
        await hold_for_lack_of_room(api, "ml", pool)
        held = await gang_condition(api, "ml", "pg-train", "Unschedulable", containing="no preemption")
        instance.stop_component("quorum-operator")

        diagnosis = await diagnose(api, "ml", "pg-train", time.time())
        assert diagnosis.view.startswith("planned now from ")
        assert (
            recorded_message(held)
            == f"{diagnosis.message}; no preemption{diagnosis.preemption.removeprefix('none')}"
        )
    shown = quorum("explain", "ml/pg-train", kubeconfig=admin)
    assert shown.returncode == 0, shown.stderr
    assert_one_screen(shown.stdout)
    assert f"1 node: Insufficient nvidia.com/gpu (a pod needs 8, 4 free): {pool.names[1]}" in shown.stdout
    listed = quorum("get", "-A", kubeconfig=admin)
    assert listed.returncode == 0 and "pg-train" in listed.stdout and "Unschedulable" in listed.stdout


def test_kubectl_finds_the_plugin_after_sourcing_the_env_file(cluster: Instance, tmp_path: Path) -> None:
    shutil.copyfile(cluster.kubeconfig("admin"), tmp_path / "kubeconfig")
    env = write_env_file(tmp_path, [cluster.binaries.bin_dir])
    ran = subprocess.run(
        ["bash", "-c", f". {env} && kubectl quorum version"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("client: quorum ")
    assert lines[1].startswith("server: Kubernetes v1.3"), lines
    assert "quorum-operator: not installed (no Deployment quorum-system/quorum-operator)" in lines
