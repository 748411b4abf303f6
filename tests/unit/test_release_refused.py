"""A release the apiserver refuses because an earlier leader term did it already (found by
`make bench-scale` at 1,000 nodes on a loaded machine: the operator lost its Lease 26 times in 4
minutes; each next term, in the same process with its pod watch behind, finished the releases the
last term had begun, the apiserver refused the patches of pods released already, and their
reservations ended while they were pinned and unbound: 238 pods left Unschedulable on full nodes).
The refused pod keeps the room of the node it is pinned to; one gone or still gated does not."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from quorum.k8s.usage import BoundPods
from quorum.operator.loop import GangLoop
from quorum.operator.release import FairSlots
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
    limit (54 releases cut off at 30 s). A freed slot goes to the waiting gangs in turn."""
    server, _ = cluster(3, {"big": 16}, gpus=1)
    api = FakeApi(server, BoundPods(), lag=True)
    api.server = server
    store, bound = api.relist()
    loop = GangLoop(api, store, bound, settings(release_concurrency=4, gang_timeout_seconds=60.0))
    loop.resume()
    held = api.hang("release_pod", lambda pod, node: pod["metadata"]["name"].startswith("big-"))
    await loop.step()  # the big gang released: its first 4 patches hang (a slow apiserver), 12 queue
    for _ in range(1000):
        if len(api.called("release_pod")) == 4:
            break
        await asyncio.sleep(0.001)
    for table in (server, store):  # then a small gang arrives
        table.groups[("scheduling.sigs.k8s.io", NS, "small")] = podgroup("small", 1)
    small = pod("small", 0, 1)
    server.pods["small-0"] = small
    api.changed("pods", "small-0", small)
    api.deliver_all()
    await loop.step()
    for _ in range(1000):  # until its patch waits for a slot
        if loop.releaser.pod_patches.waiting.get((NS, "pg-small")):
            break
        await asyncio.sleep(0.001)
    held.set()  # the apiserver answers again
    await settle(loop)
    api.deliver_all()
    order = [args[0]["metadata"]["name"] for args in api.called("release_pod")]
    assert order.index("small-0") <= 5, f"the small gang's patch waited behind the big gang's: {order}"
    assert len(released(store, "big")) == 16 and "small-0" in api.pinned


async def test_fair_slots_hand_a_freed_slot_to_the_gangs_in_turn() -> None:
    slots = FairSlots(1)
    order: list[str] = []
    go = asyncio.Event()

    async def patch(gang: str, pod: int) -> None:
        async with slots.slot((NS, gang)):
            order.append(f"{gang}-{pod}")
            await go.wait()

    tasks = [asyncio.create_task(patch("big", i)) for i in range(4)]
    for _ in range(100):  # big-0 holds the slot; big-1..3 wait
        await asyncio.sleep(0)
    tasks += [asyncio.create_task(patch("small", 0))]
    for _ in range(100):
        await asyncio.sleep(0)
    assert order == ["big-0"]
    go.set()
    await asyncio.gather(*tasks)
    assert order == ["big-0", "big-1", "small-0", "big-2", "big-3"]
    assert slots.free == 1 and not slots.waiting


async def test_a_cancelled_waiter_gives_up_its_place_and_a_handed_slot() -> None:
    slots = FairSlots(1)
    await slots.acquire((NS, "a"))
    waiter = asyncio.create_task(slots.acquire((NS, "b")))
    await asyncio.sleep(0)
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    assert not slots.waiting
    handed = asyncio.create_task(slots.acquire((NS, "c")))
    await asyncio.sleep(0)
    slots.release()  # handed to c ...
    handed.cancel()  # ... cancelled before it ran: the slot is passed on, not lost
    with contextlib.suppress(asyncio.CancelledError):
        await handed
    assert slots.free == 1 and not slots.waiting
