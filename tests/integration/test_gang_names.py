"""Gang names on the real control plane: two groups never share one, and an upgrade from a
release that named them otherwise splits no gang (quorum.core.gangs.gang_name,
docs/install.md "Upgrading")."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from quorum.core.gangs import GangSource, gang_name, legacy_gang_name
from tests.integration.test_gangs import GANGS, GATE, get, pods
from tests.kube import create_podgroup, eventually

pytestmark = pytest.mark.cluster

GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"


def pod(name: str, group: str, gang: str | None = None) -> dict[str, Any]:
    """A gang pod of PodGroup `group`; with `gang`, as an earlier release's webhook wrote it
    (its gate and its quorum.dev/gang label)."""
    labels = {GROUP_LABEL: group, "app": group}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": "10m"}}}
        ]
    }
    if gang is not None:
        labels["quorum.dev/gang"] = gang
        spec["schedulingGates"] = [{"name": GATE}]
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


async def running(api: client.ApiClient, namespace: str, group: str, count: int) -> list[dict[str, Any]]:
    async def probe() -> list[dict[str, Any]] | None:
        found = await pods(api, namespace, f"app={group}")
        ok = len(found) == count and all(p["status"].get("phase") == "Running" for p in found)
        return found if ok else None

    return await eventually(probe, timeout=60, what=f"the {count} pods of {group} Running")


async def test_a_group_named_like_another_groups_shortened_name_is_a_gang_of_its_own(
    api: client.ApiClient, namespace: str
) -> None:
    """PodGroup `lk.x` is shortened to `pg-lk-x-<hash>`; a PodGroup named `lk-x-<hash>` once got
    the same gang name, and the two were held as one merged gang."""
    shortened = gang_name(GangSource.SIGS_POD_GROUP, "lk.x")
    lookalike = shortened.removeprefix("pg-")
    core = client.CoreV1Api(api)
    for group in ("lk.x", lookalike):
        await create_podgroup(api, namespace, group, 1)
        await core.create_namespaced_pod(namespace, pod(f"p-{group.replace('.', '-')}", group))
    for group in ("lk.x", lookalike):
        (member,) = await running(api, namespace, group, 1)
        assert member["metadata"]["labels"]["quorum.dev/gang"] == gang_name(GangSource.SIGS_POD_GROUP, group)
    assert await get(api, GANGS, namespace, shortened) is not None
    assert await get(api, GANGS, namespace, gang_name(GangSource.SIGS_POD_GROUP, lookalike)) is not None


async def test_a_gang_named_by_an_earlier_release_keeps_its_name_and_takes_its_new_pods(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    """Two pods of PodGroup `train-0badcafe` (minMember 3) were made under an earlier release,
    which named the gang `pg-train-0badcafe` (their label; the operator made the Gang so). The
    third pod comes after the upgrade, labelled with today's name: it joins that gang, which is
    released whole under its old name, with no second Gang."""
    group = "train-0badcafe"
    legacy, now = (
        legacy_gang_name(GangSource.SIGS_POD_GROUP, group),
        gang_name(GangSource.SIGS_POD_GROUP, group),
    )
    assert legacy == "pg-train-0badcafe" and now != legacy
    core = client.CoreV1Api(api)
    await create_podgroup(api, namespace, group, 3)
    # The earlier release's webhook is gone; its pods are made as it made them (gate and label;
    # quorum's mutating webhook fails open, and the apiserver's gang backstop lets them in).
    cluster.stop_component("quorum-webhooks")
    try:
        for i in range(2):
            await core.create_namespaced_pod(namespace, pod(f"old-{i}", group, gang=legacy))
    finally:
        cluster.start_component("quorum-webhooks")

    async def gang_made() -> dict[str, Any] | None:
        return await get(api, GANGS, namespace, legacy)

    await eventually(gang_made, timeout=60, what=f"the Gang {legacy}, of the two pods waiting for a third")
    await core.create_namespaced_pod(namespace, pod("new-0", group))
    members = await running(api, namespace, group, 3)
    labels = {p["metadata"]["name"]: p["metadata"]["labels"]["quorum.dev/gang"] for p in members}
    assert labels == {"old-0": legacy, "old-1": legacy, "new-0": now}, (
        "each pod keeps the label it was made with"
    )
    gang = await get(api, GANGS, namespace, legacy)
    assert gang is not None
    placed = {e["uid"] for e in gang["status"]["admission"]["placement"]}
    assert placed == {p["metadata"]["uid"] for p in members}, "one decision placed all three"
    assert await get(api, GANGS, namespace, now) is None, "no second Gang under today's name"
