"""JobSet on the local control plane with quorum. JobSet has no gang object of its own: its pods
name one. Seed 004's JobSet (a Workload and its PodGroup, `spec.schedulingGroup` on the pods), as
the CKS customer applies it, is released whole; a member lost makes JobSet restart all of its
Jobs (`failurePolicy.maxRestarts`), and quorum admits the new pods whole again."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from devcluster.cluster import REPO_ROOT, Instance
from tests.integration.test_gangs import GANGS, admitted, get, pods
from tests.integrations.helpers import apply
from tests.kube import assert_no_overcommit, eventually

pytestmark = pytest.mark.cluster
JSON = dict[str, Any]
JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
SEED_004 = REPO_ROOT / "examples/seed-004-workload-aware/jobset.yaml"


async def ready_jobs(api: client.ApiClient, namespace: str, name: str) -> int:
    jobset = await get(api, JOBSETS, namespace, name)
    statuses = ((jobset or {}).get("status") or {}).get("replicatedJobsStatus") or []
    return sum(int(s.get("ready") or 0) for s in statuses)


async def test_seed_004s_jobset_is_released_whole_and_restarted_whole(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    objs = [d for d in yaml.safe_load_all(SEED_004.read_text()) if d]
    jobset = next(d for d in objs if d["kind"] == "JobSet")
    jobset["spec"]["failurePolicy"] = {"maxRestarts": 1}  # JobSet's own way to survive a lost pod
    apply(cluster, namespace, *copy.deepcopy(objs))

    async def released(attempt: int) -> JSON | None:
        gang = await get(api, GANGS, namespace, "wpg-pretrain-workers")
        admission = ((gang or {}).get("status") or {}).get("admission") or {}
        whole = admitted(gang).get("status") == "True" and len(admission.get("placement") or []) == 4
        return gang if whole and admission.get("attempt") == attempt else None

    await eventually(lambda: released(1), timeout=120, what="the 4 workers released in one decision")

    async def ready() -> bool:
        return await ready_jobs(api, namespace, "pretrain") == 1

    await eventually(ready, timeout=120, what="the JobSet's Job ready")
    await assert_no_overcommit(api)
    first = await pods(api, namespace, "")

    # A member lost: JobSet restarts its Jobs, and the new pods are admitted whole again.
    await client.CoreV1Api(api).delete_namespaced_pod(first[0]["metadata"]["name"], namespace)
    await eventually(lambda: released(2), timeout=180, what="the restarted JobSet's workers released whole")

    async def all_new_running() -> bool:
        now = [p for p in await pods(api, namespace, "") if not p["metadata"].get("deletionTimestamp")]
        old = {p["metadata"]["uid"] for p in first}
        running = [
            p for p in now if p["status"].get("phase") == "Running" and p["metadata"]["uid"] not in old
        ]
        return len(running) == 4

    await eventually(all_new_running, timeout=120, what="4 new workers running")

    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        *JOBSETS[:2], namespace, JOBSETS[2], "pretrain"
    )

    async def no_pods() -> bool:
        return not await pods(api, namespace, "")

    await eventually(no_pods, timeout=120, what="the JobSet's pods gone")


async def test_a_jobset_whose_pods_name_a_scheduler_plugins_podgroup_is_released_whole(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    """The other way a JobSet asks for a gang: a scheduler-plugins PodGroup beside it, its pod
    template labelled with it and asking for scheduler-plugins' scheduler (as scheduler-plugins'
    docs write a coscheduled workload)."""
    podgroup = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "pretrain"},
        "spec": {"minMember": 4},
    }
    jobset = next(d for d in yaml.safe_load_all(SEED_004.read_text()) if d and d["kind"] == "JobSet")
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    del template["spec"]["schedulingGroup"]
    template["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "pretrain"}
    template["spec"]["schedulerName"] = "scheduler-plugins-scheduler"
    apply(cluster, namespace, podgroup, jobset)

    async def released() -> JSON | None:
        gang = await get(api, GANGS, namespace, "xpg-pretrain")
        admission = ((gang or {}).get("status") or {}).get("admission") or {}
        return gang if len(admission.get("placement") or []) == 4 else None

    await eventually(released, timeout=120, what="the 4 workers released in one decision")

    async def ready() -> bool:
        return await ready_jobs(api, namespace, "pretrain") == 1

    await eventually(ready, timeout=120, what="the JobSet's Job ready")
