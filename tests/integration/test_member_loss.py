"""A running gang that loses a member, on an instance of its own (cluster default `Replace`, set
by QUORUM_OPERATOR_MEMBER_LOSS_POLICY): a Deployment gang of 4 whose pod is deleted. With
`Replace` the replacement is released alone and the other 3 run on; with `RestartGang` (the
PodGroup's annotation) the other 3 are deleted too and the 4 new pods are admitted together."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.nodes import TestPool
from tests.integration.test_gang_lifecycle import condition, gang_where, running
from tests.integration.test_gangs import deployment
from tests.kube import (
    api_client,
    assert_no_overcommit,
    create_namespace,
    create_podgroup,
    create_pool_nodes,
    eventually,
    operator_instance,
    raw_json,
)

pytestmark = pytest.mark.cluster

ANNOTATION = "quorum.dev/member-loss-policy"


@pytest.fixture(scope="module")
def memloss() -> Iterator[Instance]:
    with operator_instance("t-memloss", {"MEMBER_LOSS_POLICY": "Replace"}) as instance:
        yield instance


@pytest.fixture
async def api(memloss: Instance) -> AsyncIterator[client.ApiClient]:
    api = await api_client(memloss.kubeconfig("admin"))
    async with api:
        yield api


@pytest.fixture
async def ns(api: client.ApiClient) -> AsyncIterator[str]:
    name = f"memloss-{secrets.token_hex(3)}"
    await create_namespace(api, name)
    yield name
    await client.CoreV1Api(api).delete_namespace(name, propagation_policy="Background")


async def running_gang_of_four(
    memloss: Instance, api: client.ApiClient, ns: str, annotations: dict[str, str] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Four 8-GPU nodes of a pool of its own, PodGroup `mem` (minMember 4) and a Deployment of 4
    pods of 8 GPUs, all running; the Gang once its status on record says 4 bound."""
    pool = TestPool(f"tp-{secrets.token_hex(3)}", 4)
    platform = await api_client(memloss.kubeconfig("platform"))
    async with platform:
        await create_pool_nodes(platform, pool)
    await create_podgroup(api, ns, "mem", 4, annotations=annotations)
    await client.AppsV1Api(api).create_namespaced_deployment(ns, deployment("mem", 4, 8, pool, "mem"))
    first = await running(api, ns, "app=mem", 4)
    gang = await gang_where(api, ns, "pg-mem", lambda g: g["status"].get("bound") == 4, "4 bound on record")
    return gang, first


async def events(api: client.ApiClient, ns: str, reason: str) -> list[dict[str, Any]]:
    found = (await raw_json(client.CoreV1Api(api).list_namespaced_event(ns, _preload_content=False)))["items"]
    return [e for e in found if e["reason"] == reason]


async def test_replace_releases_the_replacement_alone_and_the_other_three_run_on(
    memloss: Instance, api: client.ApiClient, ns: str
) -> None:
    gang, first = await running_gang_of_four(memloss, api, ns, None)
    attempt = gang["status"]["admission"]["attempt"]
    victim = first[0]["metadata"]
    await client.CoreV1Api(api).delete_namespaced_pod(victim["name"], ns)

    after = await gang_where(
        api, ns, "pg-mem", lambda g: g["status"]["admission"]["attempt"] > attempt, "the replacement released"
    )
    (entry,) = after["status"]["admission"]["placement"]
    assert entry["uid"] != victim["uid"], "the replacement, released alone"
    now = await running(api, ns, "app=mem", 4)
    survivors = {p["metadata"]["uid"] for p in first[1:]}
    assert {p["metadata"]["uid"] for p in now} == survivors | {entry["uid"]}, "the other 3 ran on"
    assert condition(after, "Restarted").get("status") == "False"
    assert not await events(api, ns, "GangRestarted")
    await assert_no_overcommit(api)


async def test_restart_gang_replaces_all_four_and_admits_them_together(
    memloss: Instance, api: client.ApiClient, ns: str
) -> None:
    gang, first = await running_gang_of_four(memloss, api, ns, {ANNOTATION: "RestartGang"})
    attempt = gang["status"]["admission"]["attempt"]
    old = {p["metadata"]["uid"] for p in first}
    victim = first[0]
    await client.CoreV1Api(api).delete_namespaced_pod(victim["metadata"]["name"], ns)

    restarted = await gang_where(
        api,
        ns,
        "pg-mem",
        lambda g: (g["status"].get("recovery") or {}).get("reason") == "MemberLost",
        "restarted after the member loss",
    )
    recovery = restarted["status"]["recovery"]
    lost = (
        f"1 of 4 members lost (pod {victim['metadata']['name']} on node {victim['spec']['nodeName']} deleted)"
    )
    assert recovery["message"].startswith(lost + "; 3 left, minMember 4; RestartGang: deleted 3 pods")
    assert recovery["attempt"] == attempt and recovery["failures"] == 0, "no partial placement counted"

    async def told() -> list[dict[str, Any]] | None:
        found = await events(api, ns, "GangRestarted")
        kinds = {e["involvedObject"]["kind"] for e in found}
        return found if kinds == {"Gang", "PodGroup"} else None

    for event in await eventually(told, timeout=30, what="GangRestarted on the Gang and the PodGroup"):
        assert event["type"] == "Warning" and event["message"] == recovery["message"]

    again = await gang_where(
        api,
        ns,
        "pg-mem",
        lambda g: (
            g["status"]["admission"]["attempt"] > attempt
            and condition(g, "Restarted").get("reason") == "Readmitted"
        ),
        "admitted again",
    )
    placement = again["status"]["admission"]["placement"]
    assert again["status"]["admission"]["attempt"] == attempt + 1, "one decision for the new gang"
    assert len(placement) == 4 and not {e["uid"] for e in placement} & old, "4 new pods, together"
    now = await running(api, ns, "app=mem", 4)
    assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in now} == {
        e["uid"]: e["node"] for e in placement
    }
    assert len(await events(api, ns, "GangRestarted")) == 2, "once for the loss (Gang and PodGroup)"
    assert condition(again, "PartiallyPlaced").get("status") == "False"
    await assert_no_overcommit(api)
