"""quorum-sunk-scheduler's ClusterRole holds exactly what its code calls, both ways: each
kubernetes-asyncio method its modules name is mapped to the grant it needs, and the grants are
compared with manifests/optional/sunk-scheduler.yaml."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
CODE = sorted((REPO / "quorum" / "sunk").glob("*.py"))
MANIFEST = REPO / "manifests" / "optional" / "sunk-scheduler.yaml"
# What each API method needs: (API group, resource, verbs).
NEEDS: dict[str, set[tuple[str, str, str]]] = {
    "list_pod_for_all_namespaces": {("", "pods", "list"), ("", "pods", "watch")},
    "list_node": {("", "nodes", "list"), ("", "nodes", "watch")},
    "read_node": {("", "nodes", "get")},
    "patch_node": {("", "nodes", "patch")},
    "patch_node_status": {("", "nodes/status", "patch")},
    "patch_namespaced_pod": {("", "pods", "patch")},
    "create_namespaced_pod_binding": {("", "pods/binding", "create")},
    "get_namespaced_custom_object": {
        ("scheduling.x-k8s.io", "podgroups", "get"),
        ("scheduling.sigs.k8s.io", "podgroups", "get"),
        ("scheduling.k8s.io", "podgroups", "get"),
    },
    # Shared with the operator (quorum.k8s.writes), called through quorum.sunk.api:
    "delete_pod": {("", "pods", "delete")},
    "post_event": {("", "events", "create")},
    "create_gang": {("quorum.dev", "gangs", "create"), ("quorum.dev", "gangs", "get")},  # get on 409
    "delete_gang": {("quorum.dev", "gangs", "delete")},
    "patch_gang_status": {("quorum.dev", "gangs/status", "patch")},
}


def used_names() -> set[str]:
    names: set[str] = set()
    for path in CODE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in NEEDS:
                names.add(node.attr)
    return names


def granted() -> set[tuple[str, str, str]]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "ClusterRole"]
    (role,) = docs
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_scan_sees_the_calls() -> None:
    assert {"create_namespaced_pod_binding", "patch_node", "list_pod_for_all_namespaces"} <= used_names()


def test_the_cluster_role_is_what_the_code_calls_both_ways() -> None:
    needed = set().union(*(NEEDS[name] for name in used_names()))
    assert needed - granted() == set(), "the code calls what the ClusterRole does not grant"
    assert granted() - needed == set(), "the ClusterRole grants what the code never calls"
