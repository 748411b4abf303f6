"""Keeping Kubernetes nodes and Slurm nodes in step is done node by node: one node whose writes the
apiserver refuses does not keep the others from being told, and is tried again the next pass."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.settings import SunkSettings
from quorum.sunk.slurm import Node

JSON = dict[str, Any]


class FakeSlurmNodes:
    def __init__(self, *nodes: Node) -> None:
        self.listed = list(nodes)

    async def nodes(self) -> list[Node]:
        return self.listed


class FailingApiserver(SunkScheduler):
    """The scheduler with its node writes kept in lists; writes to the nodes in `failing` fail as
    an apiserver error would, as long as they are in it."""

    def __init__(self, slurm: FakeSlurmNodes, failing: set[str]) -> None:
        super().__init__(SunkSettings(), None, slurm)  # type: ignore[arg-type]
        self.failing = failing
        self.conditions: list[tuple[str, str, str]] = []
        self.annotations: list[tuple[str, str]] = []

    async def set_node_condition(self, name: str, condition: JSON) -> None:
        if name in self.failing:
            raise ApiException(status=500, reason="etcdserver: request timed out")
        self.conditions.append((name, condition["status"], condition["reason"]))

    async def annotate_drain(self, node: JSON, reason: str) -> None:
        self.annotations.append((node["metadata"]["name"], reason))


def k8s_node(name: str) -> JSON:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": {}}, "spec": {}, "status": {}}


async def test_a_node_whose_writes_fail_does_not_keep_the_next_one_from_being_told() -> None:
    slurm = FakeSlurmNodes(
        Node(name="a", state="idle", state_flags=["DRAIN"], reason="bad DIMM"),
        Node(name="b", state="down", state_flags=["NOT_RESPONDING"], reason="Not responding"),
    )
    scheduler = FailingApiserver(slurm, failing={"a"})
    for name in ("a", "b"):  # "a" first: the order in which the pass meets them
        scheduler.nodes.upsert(k8s_node(name))

    await scheduler.sync_nodes()
    assert scheduler.conditions == [("b", "True", "SlurmDown")]
    assert scheduler.annotations == [("b", "Not responding")]

    scheduler.failing.clear()  # the apiserver is back: the next pass tells "a"
    await scheduler.sync_nodes()
    assert ("a", "True", "SlurmDrain") in scheduler.conditions
    assert ("a", "bad DIMM") in scheduler.annotations
