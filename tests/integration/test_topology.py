"""Topology on the real control plane: a seed PodGroup with `quorum.dev/topology-key` lands in
one rack — the one that fits with the least room left — or is held with the reason per rack."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.nodes import RACK_LABEL, TestPool
from tests.integration.test_gangs import (
    GANGS,
    admitted,
    all_running,
    assert_as_planned,
    deployment,
    gang_condition,
    get,
)
from tests.kube import create_podgroup

pytestmark = pytest.mark.cluster

# Racks are labelled at the nodes' creation, the rack expected to win created first: the
# operator's view of nodes is eventually consistent, and a rack it has not fully seen looks smaller.
RACK = RACK_LABEL


async def rack_gang(api: client.ApiClient, namespace: str, pool: TestPool, name: str) -> None:
    """A seed PodGroup of 4 whole-node pods (a Deployment) that must sit in one rack
    (`quorum.dev/topology-key`)."""
    await create_podgroup(api, namespace, name, 4, annotations={"quorum.dev/topology-key": RACK})
    await client.AppsV1Api(api).create_namespaced_deployment(namespace, deployment(name, 4, 8, pool, name))


async def test_a_rack_gang_lands_in_the_rack_that_fits_with_the_least_room(
    cluster: Instance,
    customer_api: client.ApiClient,
    api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
) -> None:
    pool: TestPool = await test_pool(count=10, racks={"r1": 4, "r2": 6})
    await rack_gang(customer_api, namespace, pool, "train")
    running = await all_running(api, namespace, 4, "app=train")
    nodes = {p["spec"]["nodeName"] for p in running}
    labels = {(await client.CoreV1Api(api).read_node(n)).metadata.labels[RACK] for n in nodes}
    assert labels == {f"{pool.name}-r1"}, "the 4-node rack, so the 6-node rack stays whole"
    gang = await get(api, GANGS, namespace, "pg-train")
    assert gang is not None and gang["spec"]["topologyKey"] == RACK
    await assert_as_planned(api, namespace, "pg-train")


async def test_a_gang_that_fits_only_across_racks_is_held_with_the_reason_per_rack(
    cluster: Instance,
    customer_api: client.ApiClient,
    api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
) -> None:
    pool: TestPool = await test_pool(count=6, racks={"r1": 3, "r2": 3})
    await rack_gang(customer_api, namespace, pool, "wide")
    held = await gang_condition(api, namespace, "pg-wide", "Unschedulable", containing="r2: 3 of 3")
    message = admitted(held)["message"]
    assert message.startswith(f"needs 4 pods in one rack (node label {RACK}); none has room: "), message
    assert f"rack {pool.name}-r1: 3 of 3 nodes have room (3 pods)" in message
    assert f"rack {pool.name}-r2: 3 of 3 nodes have room (3 pods)" in message
