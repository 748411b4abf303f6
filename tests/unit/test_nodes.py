"""The fake node pool: shaped like CKS nodes, scalable for benchmarks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devcluster.nodes import (
    BLOCK_LABEL,
    HOSTNAME_LABEL,
    RACK_LABEL,
    RESERVED_LABEL,
    STATE_LABEL,
    ZONE_LABEL,
    TestPool,
    load_pool,
    render_nodes,
    reserved_taint_value,
    scale_pool,
)


def by_prefix(prefix: str) -> list[dict]:  # type: ignore[type-arg]
    return [
        n
        for n in render_nodes(load_pool())
        if n["metadata"]["name"].startswith(prefix + "-")
        and n["metadata"]["name"][len(prefix) + 1 :].isdigit()
    ]


def test_default_pool_has_the_nodes_the_issue_lists() -> None:
    nodes = render_nodes(load_pool())
    assert len(nodes) == 22
    gpu = by_prefix("gpu-h100")
    assert len(gpu) == 16
    for node in gpu:
        labels = node["metadata"]["labels"]
        assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert node["status"]["capacity"]["cpu"] == "128"
        assert node["status"]["capacity"]["memory"] == "1Ti"
        assert labels["node.kubernetes.io/instance-type"] == "gd-8xh100ib-i128"
        assert labels[STATE_LABEL] == "production"
        assert labels[RESERVED_LABEL] == "org-quorum-dev"
        assert {"key": "is_gpu", "value": "true", "effect": "PreferNoSchedule"} in node["spec"]["taints"]
    assert len({n["metadata"]["labels"][ZONE_LABEL] for n in gpu}) == 2
    assert len({n["metadata"]["labels"][BLOCK_LABEL] for n in gpu}) == 2
    assert Counter(n["metadata"]["labels"][RACK_LABEL] for n in gpu) == {
        "rack-001": 4,
        "rack-002": 4,
        "rack-003": 4,
        "rack-004": 4,
    }
    # A rack lies in one block, a block in one zone.
    for key, parent in ((RACK_LABEL, BLOCK_LABEL), (BLOCK_LABEL, ZONE_LABEL)):
        pairs = {(n["metadata"]["labels"][key], n["metadata"]["labels"][parent]) for n in gpu}
        assert len(pairs) == len({p[0] for p in pairs})
    cpu = by_prefix("cpu-epyc")
    assert len(cpu) == 4
    assert all("nvidia.com/gpu" not in n["status"]["capacity"] for n in cpu)
    assert all({"key": "is_cpu_compute", "effect": "NoSchedule"} in n["spec"]["taints"] for n in cpu)


def test_triage_and_cordoned_nodes_are_kept_from_workloads() -> None:
    nodes = {n["metadata"]["name"]: n for n in render_nodes(load_pool())}
    triage = nodes["gpu-h100-triage-000"]
    assert triage["metadata"]["labels"][STATE_LABEL] == "triage"
    assert triage["metadata"]["labels"][RESERVED_LABEL] == "triage"
    assert {
        "key": RESERVED_LABEL,
        "value": reserved_taint_value("triage"),
        "effect": "NoSchedule",
    } in triage["spec"]["taints"]
    cordoned = nodes["gpu-h100-cordoned-000"]
    assert cordoned["spec"]["unschedulable"] is True
    assert all(
        not n["spec"]["unschedulable"] for name, n in nodes.items() if name != cordoned["metadata"]["name"]
    )


def test_every_node_has_the_labels_a_kubelet_sets() -> None:
    for node in render_nodes(load_pool()):
        labels = node["metadata"]["labels"]
        assert labels[HOSTNAME_LABEL] == node["metadata"]["name"]
        assert labels["kubernetes.io/os"] == "linux"
        assert labels["kubernetes.io/arch"] == "amd64"
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_pool_scales_to_a_thousand_nodes() -> None:
    nodes = render_nodes(scale_pool(load_pool(), 1000))
    assert 990 <= len(nodes) <= 1010
    names = [n["metadata"]["name"] for n in nodes]
    assert len(set(names)) == len(names)
    assert sum(1 for n in nodes if n["metadata"]["labels"][STATE_LABEL] == "triage") == 1


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=3, max_value=5000))
def test_scaled_pool_is_about_the_size_asked(size: int) -> None:
    pool = scale_pool(load_pool(), size)
    assert abs(pool.size - size) <= 2
    nodes = render_nodes(pool)
    racks = Counter(
        n["metadata"]["labels"].get(RACK_LABEL) for n in nodes if RACK_LABEL in n["metadata"]["labels"]
    )
    assert all(count <= 4 for count in racks.values())


def test_too_small_a_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="too small"):
        scale_pool(load_pool(), 2)


def test_pool_file_errors_are_reported(tmp_path: Path) -> None:
    bad = tmp_path / "pool.yaml"
    bad.write_text(
        "org: x\ntopology: {zones: [a], nodesPerRack: 4, racksPerBlock: 2}\n"
        "groups: [{name: g, prefix: g, count: -1, instanceType: t, capacity: {}}]\n"
    )
    with pytest.raises(ValueError, match="count"):
        load_pool(bad)


def test_test_pool_is_labelled_tainted_and_selected() -> None:
    pool = TestPool("tp-abc", 3)
    assert pool.names == ["tp-abc-00", "tp-abc-01", "tp-abc-02"]
    spec = pool.pod_spec()
    for node in pool.nodes:
        key, value = next(iter(spec["nodeSelector"].items()))
        assert node["metadata"]["labels"][key] == value
        taint = node["spec"]["taints"][0]
        assert any(t["key"] == taint["key"] and t.get("value") == taint["value"] for t in spec["tolerations"])


def test_a_test_pool_labels_its_racks_in_order_from_creation() -> None:
    pool = TestPool("tp-x", 5, racks={"r2": 2, "r1": 3})
    racks = [n["metadata"]["labels"].get(RACK_LABEL) for n in pool.nodes]
    assert racks == ["tp-x-r2", "tp-x-r2", "tp-x-r1", "tp-x-r1", "tp-x-r1"]
    assert all(RACK_LABEL not in n["metadata"]["labels"] for n in TestPool("tp-y", 2).nodes)
