"""What every bound, non-terminal pod uses, per node: the planner's view of occupied capacity.

Fed by the operator's pod watch (`quorum/k8s/watch.py`) with every pod; only bound pods that
are neither Succeeded nor Failed count, and only what the planner needs is kept: for each pod
uid, its node and effective requests; for each node, the sum.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quorum.core.lifecycle import Owner
from quorum.core.model import add, subtract
from quorum.core.preemption import RunningPod
from quorum.k8s.convert import pod_requests, running_pod_from_api


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What preemption needs of a bound pod beyond its usage: its model, its labels (for
    PodDisruptionBudget selectors) and its controller (a Job is suspended, not evicted)."""

    running: RunningPod
    labels: Mapping[str, str]
    owner: Owner | None


class BoundPods:
    def __init__(self) -> None:
        self.pods: dict[str, tuple[str, dict[str, int]]] = {}  # uid -> (node, requests)
        self.facts: dict[str, PodFacts] = {}  # uid -> what preemption needs
        self.used: dict[str, dict[str, int]] = {}  # node -> sum of requests
        self.synced = asyncio.Event()
        # Nodes whose usage changed since the planner last asked (None: all of them, a relist).
        self.dirty: set[str] | None = None

    def take_dirty(self) -> set[str] | None:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def _mark(self, node: str) -> None:
        if self.dirty is not None:
            self.dirty.add(node)

    def upsert(self, pod: dict[str, Any]) -> None:
        uid, node = pod["metadata"]["uid"], (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.remove(uid)
            return
        requests = pod_requests(pod)
        meta = pod["metadata"]
        owner = next(
            (
                Owner(r["kind"], r["name"], r.get("uid", ""))
                for r in meta.get("ownerReferences") or []
                if r.get("controller")
            ),
            None,
        )
        facts = PodFacts(running_pod_from_api(pod, requests), meta.get("labels") or {}, owner)
        if self.pods.get(uid) == (node, requests):
            self.facts[uid] = facts
            return  # a status change of a running pod: its node's usage is the same
        self.remove(uid)
        self.facts[uid] = facts
        self.pods[uid] = (node, requests)
        self.used[node] = add(self.used.get(node, {}), requests)
        self._mark(node)

    def delete(self, pod: dict[str, Any]) -> None:
        self.remove(pod["metadata"]["uid"])

    def remove(self, uid: str) -> None:
        self.facts.pop(uid, None)
        old = self.pods.pop(uid, None)
        if old is not None:
            node, requests = old
            self.used[node] = subtract(self.used.get(node, {}), requests)
            self._mark(node)

    def replace_all(self, pods: list[dict[str, Any]]) -> None:
        self.pods.clear()
        self.used.clear()
        self.facts.clear()
        for pod in pods:
            self.upsert(pod)
        self.dirty = None  # a relist: the planner compares every node
