"""DRA objects as quorum reads and writes them (`quorum.k8s.devices`): claims' requests and
constraints, ResourceSlices' pools, and the allocation quorum writes, as kube-scheduler's
allocator would."""

from __future__ import annotations

from typing import Any

from quorum.core.model import Node
from quorum.k8s.devices import DeviceObjects, allocation_status, claim_spec, consumer, slice_from_api

JSON = dict[str, Any]
ROOT = "gpu.example.com/pcieRoot"


def exactly(name: str, count: int = 1, device_class: str = "gpu") -> JSON:
    return {"name": name, "exactly": {"deviceClassName": device_class, "count": count}}


def test_match_attribute_constraints_are_modelled_what_is_not_is_said() -> None:
    one = claim_spec(
        "ns", "c", {"devices": {"requests": [exactly("gpus", 4)], "constraints": [{"matchAttribute": ROOT}]}}
    )
    assert not one.unmodeled and one.requests[0].match_attribute == ROOT
    two = claim_spec(
        "ns",
        "c",
        {"devices": {"requests": [exactly("a"), exactly("b")], "constraints": [{"matchAttribute": ROOT}]}},
    )
    assert not two.unmodeled
    assert [(r.match_attribute, r.match_with) for r in two.requests] == [(ROOT, ("a", "b"))] * 2
    twice = claim_spec(
        "ns",
        "c",
        {
            "devices": {
                "requests": [exactly("a"), exactly("b"), exactly("c")],
                "constraints": [
                    {"matchAttribute": ROOT, "requests": ["a", "b"]},
                    {"matchAttribute": "numa", "requests": ["b", "c"]},
                ],
            }
        },
    )
    assert twice.unmodeled == (
        "a matchAttribute constraint over 2 requests names a request another matchAttribute "
        "constraint names too: not modelled yet",
    )
    distinct = claim_spec(
        "ns", "c", {"devices": {"requests": [exactly("a")], "constraints": [{"distinctAttribute": ROOT}]}}
    )
    assert distinct.unmodeled == ("a distinctAttribute constraint is not modelled yet",)


def test_first_available_alternatives_are_read_in_order() -> None:
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "gpus",
                    "firstAvailable": [
                        {"name": "big", "deviceClassName": "h100", "count": 1},
                        {"name": "small", "deviceClassName": "a100", "count": 2},
                    ],
                }
            ]
        }
    }
    (request,) = claim_spec("ns", "c", spec).requests
    assert [(a.name, a.device_class, a.count) for a in request.alternatives] == [
        ("gpus/big", "h100", 1),
        ("gpus/small", "a100", 2),
    ]
    assert (request.name, request.device_class) == ("gpus", "h100")


def test_the_allocation_names_the_alternative_chosen_with_its_class_configuration() -> None:
    claim = {
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "firstAvailable": [
                            {"name": "big", "deviceClassName": "h100"},
                            {"name": "small", "deviceClassName": "a100", "count": 2},
                        ],
                    }
                ],
                "config": [
                    {"requests": ["gpus/small"], "opaque": {"driver": "d", "parameters": {"x": 1}}},
                    {"requests": ["gpus/big"], "opaque": {"driver": "d", "parameters": {"x": 2}}},
                ],
            }
        },
    }
    classes = {"a100": {"spec": {"config": [{"opaque": {"driver": "d", "parameters": {"c": 1}}}]}}}
    pod = {"metadata": {"name": "p", "uid": "u"}}
    chosen = {"gpus/small": [("d", "n1", "gpu-0"), ("d", "n1", "gpu-1")]}
    status = allocation_status(claim, classes, chosen, "n1", pod, "2026-11-29T00:00:00Z")
    allocation = status["allocation"]
    assert allocation["devices"]["results"] == [
        {"request": "gpus/small", "driver": "d", "pool": "n1", "device": "gpu-0"},
        {"request": "gpus/small", "driver": "d", "pool": "n1", "device": "gpu-1"},
    ]
    assert allocation["devices"]["config"] == [
        {
            "source": "FromClass",
            "requests": ["gpus/small"],
            "opaque": {"driver": "d", "parameters": {"c": 1}},
        },
        {
            "source": "FromClaim",
            "requests": ["gpus/small"],
            "opaque": {"driver": "d", "parameters": {"x": 1}},
        },
    ]
    terms = allocation["nodeSelector"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    assert allocation["allocationTimestamp"] == "2026-11-29T00:00:00Z"
    assert status["reservedFor"] == [{"resource": "pods", "name": "p", "uid": "u"}]


def test_a_claim_made_for_a_workload_podgroup_is_reserved_for_the_podgroup() -> None:
    """As kube-scheduler reserves it (resourceclaim.BindTo); any other claim for its pod."""
    owner = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "name": "g", "uid": "gu"}
    claim = {"metadata": {"name": "c", "namespace": "ns", "ownerReferences": [{**owner, "controller": True}]}}
    pod = {"metadata": {"name": "p", "uid": "u"}}
    assert consumer(claim, pod) == {
        "apiGroup": "scheduling.k8s.io",
        "resource": "podgroups",
        "name": "g",
        "uid": "gu",
    }
    other = {"metadata": {"name": "c", "namespace": "ns", "ownerReferences": [{**owner, "kind": "Pod"}]}}
    assert consumer(other, pod) == {"resource": "pods", "name": "p", "uid": "u"}


def pool_slice(name: str, node: str | None, generation: int, count: int, devices: list[str]) -> JSON:
    spec: JSON = {
        "driver": "d",
        "pool": {"name": "pool", "generation": generation, "resourceSliceCount": count},
        "devices": [{"name": d} for d in devices],
    }
    if node is not None:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {"metadata": {"name": name, "uid": name, "resourceVersion": "1"}, "spec": spec}


def test_only_a_pools_newest_complete_generation_counts() -> None:
    objects = DeviceObjects()
    objects.slices.replace_all(
        [
            pool_slice("old", "n1", 1, 1, ["gpu-9"]),
            pool_slice("new-a", "n1", 2, 2, ["gpu-0"]),
        ]
    )
    assert objects.world({}).all_devices == {}, "generation 2 has 1 of its 2 slices: incomplete"
    objects.slices.upsert(pool_slice("new-b", "n1", 2, 2, ["gpu-1"]))
    assert [d.name for d in objects.world({}).all_devices["n1"]] == ["gpu-0", "gpu-1"]
    tainted = pool_slice("t", "n2", 1, 1, ["gpu-0"])
    tainted["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    tainted["spec"]["pool"]["name"] = "other"
    assert slice_from_api(tainted).devices == (), "a device tainted NoSchedule is not planned on"


def test_a_pool_serving_several_nodes_is_among_the_devices_of_each_node_it_serves() -> None:
    """allNodes, a nodeSelector, and per device: each device once, on every node it reaches;
    a node's labels changing moves it (the mapping is the same object while nothing moved)."""
    nodes = {
        name: Node(name, {"rack": rack}, {}) for name, rack in (("n1", "r1"), ("n2", "r1"), ("n3", "r2"))
    }
    everywhere = pool_slice("net", None, 1, 1, ["nic-0"])
    everywhere["spec"]["pool"]["name"] = "net"
    rack = pool_slice("rack", None, 1, 1, ["link-0", "link-1"])
    del rack["spec"]["allNodes"]
    rack["spec"]["pool"]["name"] = "rack-r1"
    rack["spec"]["nodeSelector"] = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]
    }
    per_device = pool_slice("per", None, 1, 1, ["x-0", "x-1"])
    del per_device["spec"]["allNodes"]
    per_device["spec"]["pool"]["name"] = "fabric"
    per_device["spec"]["perDeviceNodeSelection"] = True
    per_device["spec"]["devices"][0]["nodeName"] = "n3"
    per_device["spec"]["devices"][1]["allNodes"] = True
    objects = DeviceObjects()
    objects.slices.replace_all([pool_slice("local", "n1", 1, 1, ["gpu-0"]), everywhere, rack, per_device])
    world = objects.world(nodes)
    names = {node: sorted(d.name for d in devices) for node, devices in world.all_devices.items()}
    assert names == {
        "n1": ["gpu-0", "link-0", "link-1", "nic-0", "x-1"],
        "n2": ["link-0", "link-1", "nic-0", "x-1"],
        "n3": ["nic-0", "x-0", "x-1"],
    }
    assert world.shared_pools == {"d/net", "d/rack-r1", "d/fabric"}
    assert objects.world(dict(nodes)).all_devices is world.all_devices, "nothing moved: kept"
    moved = {**nodes, "n3": Node("n3", {"rack": "r1"}, {})}
    assert sorted(d.name for d in objects.world(moved).all_devices["n3"]) == [
        "link-0",
        "link-1",
        "nic-0",
        "x-0",
        "x-1",
    ]


def test_allocated_devices_are_counted_as_claims_change() -> None:
    objects = DeviceObjects()
    objects.slices.replace_all([pool_slice("s", "n1", 1, 1, ["gpu-0", "gpu-1"])])

    def claim(version: str, devices: list[str]) -> JSON:
        results = [{"request": "r", "driver": "d", "pool": "pool", "device": d} for d in devices]
        status = {"allocation": {"devices": {"results": results}}} if devices else {}
        return {
            "metadata": {"name": "c", "namespace": "ns", "uid": "c", "resourceVersion": version},
            "status": status,
        }

    objects.claims.upsert(claim("1", []))
    assert [d.name for d in objects.world({}).devices["n1"]] == ["gpu-0", "gpu-1"]
    objects.claims.upsert(claim("2", ["gpu-1"]))
    assert [d.name for d in objects.world({}).devices["n1"]] == ["gpu-0"]
    objects.claims.delete(claim("3", ["gpu-1"]))
    assert [d.name for d in objects.world({}).devices["n1"]] == ["gpu-0", "gpu-1"]
    assert not objects.claims.taken


def test_devices_quorum_allocated_stay_taken_until_the_claim_watch_shows_them() -> None:
    objects = DeviceObjects()
    objects.slices.replace_all([pool_slice("s", "n1", 1, 1, ["gpu-0", "gpu-1"])])
    objects.assume([("d", "pool", "gpu-0")])  # written; the watch has not delivered it yet
    assert [d.name for d in objects.world({}).devices["n1"]] == ["gpu-1"]
    results = [{"request": "r", "driver": "d", "pool": "pool", "device": "gpu-0"}]
    seen = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "c", "resourceVersion": "2"},
        "status": {"allocation": {"devices": {"results": results}}},
    }
    objects.claims.upsert(seen)
    assert [d.name for d in objects.world({}).devices["n1"]] == ["gpu-1"]
    assert not objects.assumed, "seen: the watch counts it from now on"
    objects.claims.delete(seen)
    assert [d.name for d in objects.world({}).devices["n1"]] == ["gpu-0", "gpu-1"]
