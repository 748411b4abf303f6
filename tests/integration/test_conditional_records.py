"""A decision that leads to a removal is recorded on the real apiserver only while the Gang
still holds the decision it follows (`writes.patch_gang_status_if`, a JSON Patch of `test`s then
`add`s, as quorum's operator identity): the apiserver's json-patch refuses a failed test with
422, a missing member tests as null, and a Gang made without a status gets one first
(`GangRecords.record_if`); a value the Gang's schema refuses is an error, not a later decision."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from quorum.core.gangs import PLACED_BY_LABEL, PLACED_BY_SLURM
from quorum.k8s import writes
from quorum.k8s.api import LiveApi
from quorum.k8s.writes import Superseded
from quorum.operator.gangs import Store
from quorum.operator.status import GangRecords
from tests.kube import api_client

pytestmark = pytest.mark.cluster

DISRUPTION = {"reason": "PartiallyPlaced", "attempt": 1, "time": "2026-11-28T00:00:00Z", "message": "m"}
# Gangs the running quorum-operator does not watch (it leaves Slurm's to quorum-sunk-scheduler):
# it would otherwise finish the disruption recorded here on a Gang without pods, mid-test.
UNWATCHED = {PLACED_BY_LABEL: PLACED_BY_SLURM}


async def test_a_record_is_written_only_while_the_gang_holds_its_decision(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    operator = await api_client(cluster.kubeconfig("quorum-operator"))
    async with operator:
        await writes.create_gang(
            operator,
            namespace,
            "pg-a",
            {"minMember": 1, "source": {"kind": "Labels", "name": "a"}},
            None,
            UNWATCHED,
        )
        assert await writes.patch_gang_status(operator, namespace, "pg-a", {"admission": {"attempt": 1}})
        expect = {"admission/attempt": 1, "disruption": None}
        assert await writes.patch_gang_status_if(
            operator, namespace, "pg-a", expect, {"disruption": DISRUPTION}
        )
        with pytest.raises(Superseded):  # a disruption is recorded now
            await writes.patch_gang_status_if(operator, namespace, "pg-a", expect, {"disruption": DISRUPTION})
        with pytest.raises(Superseded):  # another decision
            later = {"admission/attempt": 2}
            await writes.patch_gang_status_if(
                operator, namespace, "pg-a", later, {"preemption": {"token": "t"}}
            )
        still = {
            "admission/attempt": 1,
            "disruption/reason": "PartiallyPlaced",
            "disruption/time": DISRUPTION["time"],
        }
        assert await writes.patch_gang_status_if(operator, namespace, "pg-a", still, {}), "a test-only patch"
        # A value the schema refuses: a bug of ours, raised as such, not taken for a later decision.
        with pytest.raises(ApiException) as refused:
            bad = {"disruption": {**DISRUPTION, "attempt": "one"}}
            await writes.patch_gang_status_if(operator, namespace, "pg-a", still, bad)
        assert refused.value.status == 422
        gang = await writes.get_gang(operator, namespace, "pg-a")
        assert gang is not None and gang["status"]["disruption"]["attempt"] == 1

        await writes.create_gang(
            operator,
            namespace,
            "pg-b",
            {"minMember": 1, "source": {"kind": "Labels", "name": "a"}},
            None,
            UNWATCHED,
        )
        records = GangRecords(LiveApi(operator), Store())
        assert await records.record_if(
            (namespace, "pg-b"), {"preemption": None}, {"preemption": {"token": "t"}}
        )
        assert not await records.record_if(
            (namespace, "pg-b"), {"preemption": None}, {"preemption": {"token": "u"}}
        )
        fresh = await writes.get_gang(operator, namespace, "pg-b")
        assert fresh is not None and fresh["status"]["preemption"]["token"] == "t"
