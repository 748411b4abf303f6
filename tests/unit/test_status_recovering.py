"""The status of a gang in recovery while it has no pod (its Job suspended): what a person reads
with `kubectl describe gang`."""

from __future__ import annotations

import time
from typing import Any

import pytest

from quorum.k8s import writes
from quorum.operator.gangs import Store
from quorum.operator.recovery import iso
from quorum.operator.status import GangRecords


async def test_a_gang_without_pods_in_recovery_says_what_happened_and_when_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    patches: list[dict[str, Any]] = []

    async def capture(api: object, namespace: str, name: str, status: dict[str, Any]) -> bool:
        patches.append(status)
        return True

    monkeypatch.setattr(writes, "patch_gang_status", capture)
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
    records = GangRecords(api=None, store=Store())  # type: ignore[arg-type]
    await records.write_recovering(("ml", "pg-train"), gang)
    await records.write_recovering(("ml", "pg-train"), gang)
    assert len(patches) == 1, "unchanged status is not written again"
    conditions = {c["type"]: c for c in patches[0]["conditions"]}
    assert patches[0]["members"] == 0 and patches[0]["phase"] == "Pending"
    assert conditions["Admitted"]["reason"] == "Recovering"
    assert conditions["Admitted"]["message"].endswith("waiting for the pods of Job train to go")
    assert conditions["PartiallyPlaced"]["status"] == "True"
    assert conditions["Backoff"]["status"] == "True" and "next try at" in conditions["Backoff"]["message"]
    assert all(c["lastTransitionTime"] for c in conditions.values())
