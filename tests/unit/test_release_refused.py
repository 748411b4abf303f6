"""A release the apiserver refuses because an earlier leader term did it already (found by
`make bench-scale` at 1,000 nodes on a loaded machine: the operator lost its Lease 26 times in 4
minutes; each next term, in the same process with its pod watch behind, finished the releases the
last term had begun, the apiserver refused the patches of pods released already, and their
reservations ended while they were pinned and unbound: 238 pods left Unschedulable on full nodes).
The refused pod keeps the room of the node it is pinned to; one gone or still gated does not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from quorum.k8s.usage import BoundPods
from quorum.operator.loop import GangLoop
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, cluster, pod, podgroup, released, settings, settle, step


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


async def test_a_big_gangs_release_leaves_patch_slots_to_the_others() -> None:
    """Found by `make bench-scale` at 5,000 nodes: the 4,096 patches of the large gang's release
    queued at the shared limit, and gangs released after it waited behind them past their time
    limit (54 releases cut off at 30 s). One gang takes at most a quarter of the slots."""
    server, _ = cluster(3, {"big": 16}, gpus=1)
    api = FakeApi(server, BoundPods(), lag=True)
    api.server = server
    store, bound = api.relist()
    loop = GangLoop(api, store, bound, settings(release_concurrency=4, gang_timeout_seconds=60.0))
    loop.resume()
    held = api.hang("release_pod", lambda pod, node: pod["metadata"]["name"].startswith("big-"))
    await loop.step()  # the big gang released: its patches hang (a slow apiserver)
    for _ in range(1000):
        if api.called("release_pod"):
            break
        await asyncio.sleep(0.001)
    for table in (server, store):  # then a small gang arrives
        table.groups[("scheduling.sigs.k8s.io", NS, "small")] = podgroup("small", 1)
    small = pod("small", 0, 1)
    server.pods["small-0"] = small
    api.changed("pods", "small-0", small)
    api.deliver_all()
    await loop.step()
    for _ in range(1000):  # until its one patch is done, or it waits behind the big gang's
        api.deliver_all()
        if "small-0" in api.pinned:
            break
        await asyncio.sleep(0.001)
    in_flight = len(api.called("release_pod")) - ("small-0" in api.pinned)
    held.set()
    await settle(loop)
    api.deliver_all()
    assert "small-0" in api.pinned and in_flight == 1, (
        f"the small gang's release waited behind the big gang's {in_flight} patches in flight"
    )
    assert len(released(store, "big")) == 16
