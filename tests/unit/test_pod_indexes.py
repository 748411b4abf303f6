"""The operator's one pod watch: its event parsing, and the indexes it feeds (the Store's gang
pods, bound pods' usage)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.k8s.usage import BoundPods
from quorum.k8s.watch import RawWatch, apply
from quorum.operator.gangs import JSON, GangPods, Store, store_groups, store_nodes


def pod(uid: str, *, gang: str | None = None, node: str | None = None, phase: str = "Pending") -> JSON:
    labels = {"quorum.dev/gang": gang} if gang else {"app": "web"}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"uid": uid, "labels": labels}, "spec": spec, "status": {"phase": phase}}


def test_gang_pods_keeps_only_gang_pods() -> None:
    store = Store()
    index = GangPods(store)
    index.upsert(pod("a", gang="g"))
    index.upsert(pod("b"))
    assert set(store.pods) == {"a"}
    index.upsert(pod("a", gang="g", node="n1"))
    assert store.pods["a"]["spec"]["nodeName"] == "n1"
    index.delete(pod("a", gang="g"))
    assert store.pods == {}


def test_gang_pods_relist_replaces_everything() -> None:
    store = Store()
    index = GangPods(store)
    index.upsert(pod("gone", gang="g"))
    index.replace_all([pod("a", gang="g"), pod("b")])
    assert set(store.pods) == {"a"}


def test_bound_pods_counts_bound_non_terminal_pods() -> None:
    bound = BoundPods()
    bound.upsert(pod("a", gang="g"))  # gated or pending: uses nothing yet
    assert bound.used == {}
    bound.upsert(pod("a", gang="g", node="n1"))
    bound.upsert(pod("b", node="n1", phase="Running"))
    assert bound.used["n1"]["cpu"] == 2000
    bound.upsert(pod("b", node="n1", phase="Succeeded"))
    assert bound.used["n1"]["cpu"] == 1000 and "b" not in bound.pods


def test_bound_pods_keep_what_preemption_reads_from_the_binding_on() -> None:
    bound = BoundPods()
    bound.upsert(pod("a", gang="g"))
    assert "a" not in bound.facts  # not bound: nothing to take
    bound.upsert(pod("a", gang="g", node="n1"))  # the binding: first seen on a node
    assert bound.facts["a"].running.node == "n1" and bound.facts["a"].running.gang == "g"
    bound.upsert(pod("a", gang="g", node="n1", phase="Running"))
    assert bound.facts["a"].running.node == "n1"
    bound.upsert(pod("a", gang="g", node="n1", phase="Failed"))
    assert "a" not in bound.facts


def test_a_running_pods_status_change_leaves_its_node_clean() -> None:
    bound = BoundPods()
    bound.upsert(pod("a", node="n1"))
    bound.take_dirty()
    bound.take_dirty()
    bound.upsert(pod("a", node="n1", phase="Running"))
    assert bound.take_dirty() == set()
    bound.remove("a")
    assert bound.take_dirty() == {"n1"}


async def test_watch_events_are_plain_json_with_their_resource_version() -> None:
    watch = RawWatch()
    obj = pod("a", gang="g") | {"kind": "Pod"}
    obj["metadata"]["resourceVersion"] = "42"
    event = watch.unmarshal_event(json.dumps({"type": "MODIFIED", "object": obj}), "")
    assert event["raw_object"] == obj and event["type"] == "MODIFIED"
    assert watch.resource_version == "42"
    bookmark = {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "50"}}}
    assert watch.unmarshal_event(json.dumps(bookmark), "")["type"] == "BOOKMARK"
    assert watch.resource_version == "50"
    assert watch.unmarshal_event("not json", "") == "not json"
    gone = {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "too old"}}
    with pytest.raises(ApiException) as expired:
        watch.unmarshal_event(json.dumps(gone), "")
    assert expired.value.status == 410


def test_store_nodes_by_name() -> None:
    store = Store()
    index = store_nodes(store)
    node = {"metadata": {"name": "n1", "uid": "u1"}, "status": {}}
    index.upsert(node)
    index.replace_all([node, {"metadata": {"name": "n2", "uid": "u2"}}])
    assert set(store.nodes) == {"n1", "n2"}
    index.delete(node)
    assert set(store.nodes) == {"n2"}


def test_a_relisting_of_one_podgroup_kind_replaces_only_that_kinds_groups() -> None:
    store = Store()
    sigs, x = store_groups(store, "scheduling.sigs.k8s.io"), store_groups(store, "scheduling.x-k8s.io")
    group = {"metadata": {"name": "g", "namespace": "ns"}}
    sigs.upsert(group)
    x.upsert(group)
    x.replace_all([])
    assert set(store.groups) == {("scheduling.sigs.k8s.io", "ns", "g")}


def test_the_indexes_get_objects_without_managed_fields() -> None:
    store = Store()
    obj = pod("a", gang="g")
    obj["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    apply([GangPods(store)], "ADDED", obj, "pods")
    (kept,) = store.pods.values()
    assert "managedFields" not in kept["metadata"]
    assert kept["metadata"]["labels"] == obj["metadata"]["labels"]
