"""A gang of 20,000 pods (quorum admits groups of up to 100,000) is recorded and released: its
decision fits in a Gang object (etcd takes at most 1.5 MiB per object; a placement of ~16,000
pods with real names took more, and such a gang could never be released), and a release cut
off by a failover is finished without promising any node twice."""

from __future__ import annotations

import json
import uuid
from collections import Counter

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
