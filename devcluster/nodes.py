"""Fake nodes shaped like CKS nodes, from a declarative pool file, for kwok to run.

`load_pool()` reads a pool file (see `data/pool-default.yaml`), `scale_pool()` resizes it for
benchmarks, `render_nodes()` turns it into Node objects (plain dicts, ready to POST). The
`TestPool` helper gives a test its own small set of nodes that no other test's pods can use.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

STATE_LABEL = "node.coreweave.cloud/state"
RESERVED_LABEL = "node.coreweave.cloud/reserved"
ZONE_LABEL = "topology.kubernetes.io/zone"
BLOCK_LABEL = "network.topology.kubernetes.io/block"
RACK_LABEL = "network.topology.kubernetes.io/rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
TEST_POOL_KEY = "test.quorum.dev/pool"

Node = dict[str, Any]


class Taint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    value: str | None = None
    effect: str


class Topology(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    zones: list[str] = Field(min_length=1)
    nodes_per_rack: int = Field(alias="nodesPerRack", ge=1)
    racks_per_block: int = Field(alias="racksPerBlock", ge=1)


class NodeGroup(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    prefix: str
    count: int = Field(ge=0)
    scales: bool = False
    topology: bool = False
    state: str = "production"
    cordoned: bool = False
    instance_type: str = Field(alias="instanceType")
    labels: dict[str, str] = {}
    capacity: dict[str, str]
    taints: list[Taint] = []


class NodePool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    org: str
    topology: Topology
    groups: list[NodeGroup]

    @property
    def size(self) -> int:
        return sum(g.count for g in self.groups)


def load_pool(path: Path | None = None) -> NodePool:
    """Read a pool file; None means the default pool shipped with quorum."""
    if path is None:
        text = resources.files("devcluster").joinpath("data/pool-default.yaml").read_text()
    else:
        text = path.read_text()
    return NodePool.model_validate(yaml.safe_load(text))


def scale_pool(pool: NodePool, size: int) -> NodePool:
    """Resize the groups marked `scales` so that the pool has about `size` nodes in all."""
    fixed = sum(g.count for g in pool.groups if not g.scales)
    scalable = sum(g.count for g in pool.groups if g.scales)
    if size <= fixed or scalable == 0:
        raise ValueError(f"a pool of {size} nodes is too small: {fixed} nodes do not scale")
    factor = (size - fixed) / scalable
    groups = [
        g.model_copy(update={"count": max(1, round(g.count * factor))}) if g.scales else g
        for g in pool.groups
    ]
    return pool.model_copy(update={"groups": groups})


def reserved_taint_value(reserved: str) -> str:
    """CKS taints non-production nodes with a hash of their `reserved` label (seed 002)."""
    return hashlib.sha256(reserved.encode()).hexdigest()[:10]


def _place(index: int, topology: Topology) -> dict[str, str]:
    """Topology labels of the index-th topology-aware node: racks fill blocks, blocks alternate
    zones, so a default pool has 2 zones, 2 blocks and 4 racks."""
    rack = index // topology.nodes_per_rack
    block = rack // topology.racks_per_block
    zone = topology.zones[block % len(topology.zones)]
    return {
        ZONE_LABEL: zone,
        BLOCK_LABEL: f"block-{block + 1:02d}",
        RACK_LABEL: f"rack-{rack + 1:03d}",
    }


def make_node(
    name: str,
    *,
    capacity: dict[str, str],
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
) -> Node:
    """One Node as a kubelet would register it (and kwok keeps): labels, capacity, taints."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                HOSTNAME_LABEL: name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {
            "capacity": dict(capacity),
            "allocatable": dict(capacity),
        },
    }


def render_nodes(pool: NodePool) -> list[Node]:
    """Every node of the pool, in a stable order."""
    nodes: list[Node] = []
    topology_index = 0
    width = max(3, len(str(max((g.count for g in pool.groups), default=1))))
    for group in pool.groups:
        reserved = pool.org if group.state == "production" else group.state
        for i in range(group.count):
            labels = {
                INSTANCE_TYPE_LABEL: group.instance_type,
                STATE_LABEL: group.state,
                RESERVED_LABEL: reserved,
                ZONE_LABEL: pool.topology.zones[i % len(pool.topology.zones)],
                **group.labels,
            }
            if group.topology:
                labels.update(_place(topology_index, pool.topology))
                topology_index += 1
            taints = [t.model_dump(exclude_none=True) for t in group.taints]
            if group.state != "production":
                taints.append(
                    {
                        "key": RESERVED_LABEL,
                        "value": reserved_taint_value(reserved),
                        "effect": "NoSchedule",
                    }
                )
            nodes.append(
                make_node(
                    f"{group.prefix}-{i:0{width}d}",
                    capacity=group.capacity,
                    labels=labels,
                    taints=taints,
                    unschedulable=group.cordoned,
                )
            )
    return nodes


def node_groups(pool: NodePool) -> dict[str, str]:
    """{node name: the name of its pool group}, the names `render_nodes` gives."""
    width = max(3, len(str(max((g.count for g in pool.groups), default=1))))
    return {f"{g.prefix}-{i:0{width}d}": g.name for g in pool.groups for i in range(g.count)}


class TestPool:
    """A test's own nodes: labelled and tainted with `test.quorum.dev/pool=<name>`, so only
    pods that select and tolerate that pool (`pod_spec()`) land there."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        name: str,
        count: int,
        capacity: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        racks: dict[str, int] | None = None,
    ) -> None:
        """`racks={"r1": 4, "r2": 6}`: the first 4 nodes carry RACK_LABEL `<name>-r1`, the next 6
        `<name>-r2`, from their creation on (so no watcher ever sees them without it)."""
        self.name = name
        self.capacity = capacity or {
            "cpu": "32",
            "memory": "256Gi",
            "nvidia.com/gpu": "8",
            "pods": "110",
        }
        in_order = [rack for rack, size in (racks or {}).items() for _ in range(size)]
        rack_of = {i: {RACK_LABEL: f"{name}-{rack}"} for i, rack in enumerate(in_order)}
        self.nodes = [
            make_node(
                f"{name}-{i:02d}",
                capacity=self.capacity,
                labels={
                    TEST_POOL_KEY: name,
                    STATE_LABEL: "production",
                    **(labels or {}),
                    **rack_of.get(i, {}),
                },
                taints=[{"key": TEST_POOL_KEY, "value": name, "effect": "NoSchedule"}],
            )
            for i in range(count)
        ]

    @property
    def names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.nodes]

    def pod_spec(self) -> dict[str, Any]:
        """The part of a pod spec that puts a pod into this pool (merge into your spec)."""
        return {
            "nodeSelector": {TEST_POOL_KEY: self.name},
            "tolerations": [
                {
                    "key": TEST_POOL_KEY,
                    "operator": "Equal",
                    "value": self.name,
                    "effect": "NoSchedule",
                },
                {"key": "is_gpu", "operator": "Exists"},
                {"key": "is_cpu_compute", "operator": "Exists"},
            ],
        }
