"""The status of a gang in recovery while it has no pod (its Job suspended): what a person reads
with `kubectl describe gang`."""

from __future__ import annotations

import time

from quorum.core.conditions import iso
from quorum.operator.gangs import Store
from quorum.operator.status import GangRecords
from tests.unit.fake_api import FakeApi


async def test_a_gang_without_pods_in_recovery_says_what_happened_and_when_next() -> None:
    gang = {
        "metadata": {"name": "pg-train", "namespace": "ml"},
        "status": {
            "recovery": {
                "attempt": 1,
                "failures": 1,
                "message": "1 of 2 pods bound 5s after the release; suspended Job train",
                "nextAttemptTime": iso(time.time() + 30),
                "suspendedJobs": ["train"],
            }
        },
    }
    store = Store(gangs={("ml", "pg-train"): gang})
    api = FakeApi(store)
    records = GangRecords(api, store)
    write = records.recovering_due(("ml", "pg-train"), gang, None)
    assert write is not None
    await records.write_recovering(("ml", "pg-train"), write)
    assert records.recovering_due(("ml", "pg-train"), gang, None) is None, "unchanged: not written again"
    (patch,) = [args[2] for args in api.called("patch_gang_status")]
    conditions = {c["type"]: c for c in patch["conditions"]}
    assert patch["members"] == 0 and patch["phase"] == "Pending"
    assert conditions["Admitted"]["reason"] == "Recovering"
    assert conditions["Admitted"]["message"].endswith("waiting for the pods of Job train to go")
    assert conditions["PartiallyPlaced"]["status"] == "True"
    assert conditions["Backoff"]["status"] == "True" and "next try at" in conditions["Backoff"]["message"]
    assert conditions["PlanningFailed"]["status"] == "False"
    assert all(c["lastTransitionTime"] for c in conditions.values())
