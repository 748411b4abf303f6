"""Fixtures for every test that needs the real local control plane (marker `cluster`).

- `cluster`: the shared instance for the session. If `make up` is running it is reused (and
  left running) when it runs the Kubernetes release under test (QUORUM_K8S, default 1.37);
  otherwise one is started for the run and stopped at the end.
- `start_instance`: starts a separate named instance with other flags, stopped after the test.
- `api` / `customer_api`: kubernetes-asyncio clients as the admin and as a customer.
- `namespace`: a fresh namespace per test (waits for its default ServiceAccount), deleted after.
- `test_pool`: a test's own small node pool, registered as the platform identity, deleted after.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from devcluster.nodes import TestPool
from devcluster.versions import DEFAULT_RELEASE
from tests.kube import api_client, create_namespace, create_pool_nodes

# The ML controllers' tests build and run other systems: `make test-integrations` only.
collect_ignore = [] if os.environ.get("QUORUM_INTEGRATIONS") else ["integrations"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `late` wait for wall-clock time to pass; run them last so that the rest of
    the suite runs meanwhile."""
    items.sort(key=lambda item: item.get_closest_marker("late") is not None)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Instance]:
    instance = Instance(os.environ.get("QUORUM_TEST_INSTANCE", "default"))
    state = instance.state()
    if instance.is_up() and state is not None and state.spec.kubernetes == DEFAULT_RELEASE:
        yield instance  # `make up`'s instance, of the release under test: reused, left running
        return
    instance.up(ClusterSpec(name=instance.name))
    try:
        yield instance
    finally:
        instance.down()


@pytest.fixture
def start_instance() -> Iterator[Callable[..., Instance]]:
    """`start_instance("noWAS", runtime_config=..., feature_gates=...)` -> a running Instance."""
    started: list[Instance] = []

    def start(name: str, **overrides: Any) -> Instance:
        instance = Instance(name)
        started.append(instance)
        instance.up(ClusterSpec(name=name, **overrides))
        return instance

    yield start
    for instance in started:
        instance.down(quiet=True)


@pytest.fixture
async def api(cluster: Instance) -> AsyncIterator[client.ApiClient]:
    api = await api_client(cluster.kubeconfig("admin"))
    async with api:
        yield api


@pytest.fixture
async def customer_api(cluster: Instance) -> AsyncIterator[client.ApiClient]:
    """A CKS customer: cluster-admin by RBAC, not system:masters."""
    api = await api_client(cluster.kubeconfig("customer"))
    async with api:
        yield api


@pytest.fixture
async def namespace(api: client.ApiClient, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    core = client.CoreV1Api(api)
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{stem}-{secrets.token_hex(3)}"
    await create_namespace(api, name, {"quorum.dev/test": "1"})
    yield name
    await core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
async def test_pool(cluster: Instance, request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., Any]]:
    """`pool = await test_pool(count=4, capacity={...}, racks={"r1": 2, "r2": 2})`: nodes only
    this test's pods use."""
    platform = await api_client(cluster.kubeconfig("platform"))
    core = client.CoreV1Api(platform)
    pools: list[TestPool] = []

    async def make(
        count: int,
        capacity: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        racks: dict[str, int] | None = None,
    ) -> TestPool:
        name = f"tp-{secrets.token_hex(3)}"
        pool = TestPool(name, count, capacity, labels, racks)
        pools.append(pool)
        await create_pool_nodes(platform, pool)
        return pool

    async with platform:
        yield make
        for pool in pools:
            for node_name in pool.names:
                try:
                    await core.delete_node(node_name)
                except ApiException as err:
                    if err.status != 404:
                        raise
