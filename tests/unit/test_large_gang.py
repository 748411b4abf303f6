"""A gang of 20,000 pods (quorum admits groups of up to 100,000) is recorded and released: its
decision fits in a Gang object (etcd takes at most 1.5 MiB per object; a placement of ~16,000
pods with real names took more, and such a gang could never be released), and a release cut
off by a failover is finished without promising any node twice."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest

from quorum.core.record import Placement
from quorum.operator.loop import GangLoop
from quorum.operator.release import PLACEMENT_BYTES, decision
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, cluster, settings, step

PODS, NODES = 20_000, 2_500
ETCD_LIMIT = 1_572_864  # etcd's --max-request-bytes default, which the apiserver keeps to


def large_cluster() -> tuple[FakeApi, GangLoop]:
    store, bound = cluster(NODES, {"train": PODS}, gpus=1)
    renamed = {}
    for i, p in enumerate(store.pods.values()):
        uid = str(uuid.UUID(int=i + 1))
        p["metadata"]["uid"], p["metadata"]["name"] = uid, f"llm-pretrain-worker-5b688d98c7-{i:05d}"
        renamed[uid] = p
    store.pods = renamed
    for name in list(store.nodes):
        store.nodes[name]["metadata"]["name"] = name  # node names as short as a cloud's are long
    bound.replace_all(list(store.pods.values()))
    api = FakeApi(store, bound)
    return api, GangLoop(api, store, bound, settings(gang_timeout_seconds=600.0))


def promised(api: FakeApi) -> Counter[str]:
    return Counter(node for node in api.pinned.values() if node is not None)


def test_a_placement_too_large_for_a_gang_object_is_recorded_by_its_size() -> None:
    small = [Placement(f"p{i}", f"u{i}", "n") for i in range(10)]
    assert decision(1, "t", small).placement == tuple(small)
    entry = Placement("x" * 60, str(uuid.uuid4()), "gpu-node-0001.example.internal")
    large = [entry] * (PLACEMENT_BYTES // 100)
    assert decision(2, "t", large).to_json() == {"attempt": 2, "time": "t", "pods": len(large)}


async def test_a_gang_of_20000_pods_is_recorded_within_etcds_limit_and_released_across_a_failover() -> None:
    api, first = large_cluster()
    cut_off = {str(uuid.UUID(int=i + 1)) for i in range(PODS // 2, PODS)}
    api.fail("release_pod", when=lambda pod, node: pod["metadata"]["uid"] in cut_off)  # the leader dies
    await step(first)
    writes = [status for (_, name, status) in api.called("patch_gang_status") if "admission" in status]
    assert writes, "the decision was recorded"
    size = len(json.dumps({"status": writes[0]}, separators=(",", ":")))
    assert size < ETCD_LIMIT // 2, f"the decision's write is {size} bytes"
    assert writes[0]["admission"]["pods"] == PODS
    assert len(api.pinned) == PODS // 2
    api.heal()
    second = GangLoop(api, first.store, first.bound, settings(gang_timeout_seconds=600.0))
    second.resume()
    await step(second)
    await step(second)
    gang = api.server.gangs[(NS, "pg-train")]
    assert len(api.pinned) == PODS, "the rest released by the next leader"
    assert gang["status"]["admission"]["attempt"] == 2, "planned anew: no placement was recorded"
    assert max(promised(api).values()) <= 8, "no node promised beyond its 8 GPUs"
    assert api.called("delete_pod") == []


async def test_a_gang_of_20000_pods_partially_placed_is_recovered_with_its_record_within_etcds_limit() -> (
    None
):
    """Its disruption names each pod by uid alone (a record of 20,000 names and uids took 1.9 MB,
    more than etcd takes, and the gang could never be recovered)."""
    from quorum.operator import clock
    from tests.unit.test_loop import REPLICA_SET

    with clock.using(clock.ManualClock()) as now:
        api, loop = large_cluster()
        for p in loop.store.pods.values():
            p["metadata"]["ownerReferences"] = [REPLICA_SET]
        await step(loop)
        assert len(api.pinned) == PODS
        for uid in list(api.pinned)[:100]:  # kube-scheduler binds a few; the rest never bind
            p = loop.store.pods[uid]
            p["spec"]["nodeName"], p["status"] = api.pinned[uid], {"phase": "Running"}
            loop.bound.upsert(p)
        now.advance(61)
        await step(loop)
        records = [s for (_, _, _, s) in api.called("patch_gang_status_if") if s.get("disruption")]
        assert records, "the recovery was recorded"
        size = len(json.dumps({"status": records[0]}, separators=(",", ":")))
        assert size < ETCD_LIMIT * 2 // 3, f"the disruption's write is {size} bytes"
        assert all(set(t) == {"uid"} for t in records[0]["disruption"]["pods"]), "by uid alone"
        assert len(api.called("delete_pod")) == PODS, "every pod recovered"


def test_a_disruption_too_large_even_by_uid_is_not_recorded_and_so_not_acted_on() -> None:
    from quorum.core.record import Disruption, Target
    from quorum.operator.recovery import RECORD_BYTES, recordable

    def pods(n: int) -> tuple[Target, ...]:
        return tuple(
            Target(f"llm-pretrain-worker-5b688d98c7-{i:05d}", str(uuid.UUID(int=i + 1))) for i in range(n)
        )

    small = Disruption("PartiallyPlaced", 1, "t", "m", pods(10))
    assert recordable(small) == small, "names kept"
    large = Disruption("PartiallyPlaced", 1, "t", "m", pods(20_000))
    compact = recordable(large)
    assert compact is not None and {t.uid for t in compact.pods} == {t.uid for t in large.pods}
    assert all(t.name == "" for t in compact.pods)
    too_large = Disruption("PartiallyPlaced", 1, "t", "m", pods(RECORD_BYTES // 40))
    assert recordable(too_large) is None


async def test_a_recovery_it_cannot_record_deletes_nothing_and_is_told_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing is deleted that is not recorded first: a gang whose pods' uids alone would not fit
    in its Gang is left as it is, with one Warning Event saying what to do."""
    from quorum.operator import clock, recovery
    from tests.unit.test_loop import REPLICA_SET, cluster

    monkeypatch.setattr(recovery, "NAMED_BYTES", 10)  # as if the gang had 40,000 pods
    monkeypatch.setattr(recovery, "RECORD_BYTES", 10)
    with clock.using(clock.ManualClock()) as now:
        store, bound = cluster(2, {"g": 2}, owner=REPLICA_SET)
        api = FakeApi(store, bound)
        loop = GangLoop(api, store, bound, settings())
        await step(loop)
        assert len(api.pinned) == 2
        now.advance(61)
        for _ in range(3):
            await step(loop)
        assert api.called("delete_pod") == [] and not any(
            s.get("disruption") for (_, _, _, s) in api.called("patch_gang_status_if")
        )
        told = [m for name, reason, m, _ in api.events if reason == "RecoveryTooLarge" and name == "pg-g"]
        assert len(told) == 1 and "deletes none" in told[0], told
