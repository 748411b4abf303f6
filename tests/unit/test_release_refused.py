"""A release the apiserver refuses because an earlier leader term did it already (found by
`make bench-scale` at 1,000 nodes on a loaded machine: the operator lost its Lease 26 times in 4
minutes; each next term, in the same process with its pod watch behind, finished the releases the
last term had begun, the apiserver refused the patches of pods released already, and their
reservations ended while they were pinned and unbound: 238 pods left Unschedulable on full nodes).
The refused pod keeps the room of the node it is pinned to; one gone or still gated does not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quorum.k8s.usage import BoundPods
from quorum.operator.loop import GangLoop
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, cluster, pod, podgroup, settings, step


async def next_term_after(
    meanwhile: Callable[[Any], None] = lambda server: None,
) -> tuple[Any, FakeApi, GangLoop]:
    """Gang a (2 pods, 2 nodes) released by a first leader term whose pod watch showed only a-0
    released; `meanwhile(server)` changes the apiserver's pods; then the next term, in the same
    process, resumes and takes a step (finishing the recorded release)."""
    server, _ = cluster(2, {"a": 2})
    api = FakeApi(server, BoundPods(), lag=True)
    api.server = server
    store, bound = api.relist()
    first = GangLoop(api, store, bound, settings())
    first.resume()
    await step(first)  # a-0 -> n0 and a-1 -> n1 released on the apiserver; no watch event seen yet
    assert api.pinned == {"a-0": "n0", "a-1": "n1"}
    api.deliver("gangs")  # the Gang's recorded decision
    api.deliver("pods", 1)  # the pod watch shows a-0 released, not a-1 yet
    meanwhile(server)
    second = GangLoop(api, store, bound, settings())
    second.resume()
    await step(second)  # finishes the recorded release: a-1's patch is refused
    return server, api, second


async def test_a_release_refused_as_done_already_keeps_the_pods_room_promised() -> None:
    server, api, second = await next_term_after()  # a-1 released already: its gate is gone
    api.deliver_all()  # the watch catches up: a-1 released, pinned to n1, not bound
    for table in (server, second.store):
        table.groups[("scheduling.sigs.k8s.io", NS, "b")] = podgroup("b", 1)
    b = pod("b", 0)
    server.pods["b-0"] = b
    api.changed("pods", "b-0", b)
    api.deliver_all()
    await step(second)
    assert "b-0" not in api.pinned, f"b-0 released onto {api.pinned.get('b-0')}, where a-1 is pinned"


async def test_a_release_refused_for_a_pod_gone_frees_its_room() -> None:
    def delete(server: Any) -> None:  # deleted meanwhile (its controller, a person)
        del server.pods["a-1"]

    _, _, second = await next_term_after(delete)
    assert "a-1" not in second.ledger
    assert second.ledger.entries["a-0"].node == "n0"  # released, pinned, unbound: its room kept


async def test_a_release_refused_for_a_pod_bound_meanwhile_keeps_its_room_until_the_index_has_it() -> None:
    def bind(server: Any) -> None:  # bound by kube-scheduler; no watch event yet
        server.pods["a-1"]["spec"]["nodeName"] = "n1"

    _, _, second = await next_term_after(bind)
    assert second.ledger.entries["a-1"].node == "n1", "its room stays until the bound index shows it"
