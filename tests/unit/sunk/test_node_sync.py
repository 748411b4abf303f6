"""Keeping Kubernetes nodes and Slurm nodes in step is done node by node: one node whose writes the
apiserver refuses does not keep the others from being told, and is tried again the next pass."""

from __future__ import annotations

from typing import Any

from quorum.sunk import model
from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.settings import SunkSettings
from quorum.sunk.slurm import Node
from tests.unit.sunk.fakes import FakeSlurm, FakeSunkApi

JSON = dict[str, Any]


def k8s_node(name: str) -> JSON:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": {}}, "spec": {}, "status": {}}


def told(api: FakeSunkApi, name: str) -> tuple[str | None, str | None]:
    """(SlurmCordon reason, drain annotation) of a node as the apiserver has it."""
    node = api.nodes[name]
    condition = next(
        (c for c in node["status"].get("conditions", []) if c["type"] == model.SLURM_CORDON), None
    )
    annotation = (node["metadata"].get("annotations") or {}).get(model.DRAIN_ANNOTATION)
    return (condition or {}).get("reason"), annotation


async def test_a_node_whose_writes_fail_does_not_keep_the_next_one_from_being_told() -> None:
    slurm = FakeSlurm(
        Node(name="a", state="idle", state_flags=["DRAIN"], reason="bad DIMM"),
        Node(name="b", state="down", state_flags=["NOT_RESPONDING"], reason="Not responding"),
    )
    api = FakeSunkApi()
    for name in ("a", "b"):  # "a" first: the order in which the pass meets them
        api.nodes[name] = k8s_node(name)
    api.failing.add(("set_node_condition", "a"))
    scheduler = SunkScheduler(SunkSettings(), api, slurm)
    api.sync(scheduler)

    await scheduler.sync_nodes()
    assert told(api, "a") == (None, None)
    assert told(api, "b") == ("SlurmDown", "Not responding")

    api.failing.clear()  # the apiserver is back: the next pass tells "a"
    api.sync(scheduler)
    await scheduler.sync_nodes()
    assert told(api, "a") == ("SlurmDrain", "bad DIMM")
