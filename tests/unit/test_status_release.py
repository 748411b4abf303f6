"""A release writes the Gang's status once: the decision together with the status the gang has
once its pods are released; the pass after it writes nothing more unless a release failed."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.k8s import writes
from quorum.operator.gangs import Store, assemble
from quorum.operator.status import GangRecords
from tests.unit.test_operator_gangs import gang_pod, podgroup

GANG = {
    "metadata": {"name": "pg-pg1", "namespace": "ns", "ownerReferences": [{"uid": "g1"}]},
    "spec": {},
}


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Every status write, as (what, body): `gang` or the group's plural."""
    seen: list[tuple[str, dict[str, Any]]] = []

    async def gang_status(api: object, namespace: str, name: str, status: dict[str, Any]) -> bool:
        seen.append(("gang", status))
        return True

    async def group_status(api: object, group: str, version: str, plural: str, *rest: Any) -> bool:
        seen.append((plural, rest[-1]))
        return True

    monkeypatch.setattr(writes, "patch_gang_status", gang_status)
    monkeypatch.setattr(writes, "patch_status", group_status)
    return seen


def released_store() -> Store:
    store = Store(pods={u: gang_pod(u, u) for u in ("a", "b")})
    store.groups[("scheduling.sigs.k8s.io", "ns", "pg1")] = podgroup(2)
    store.gangs[("ns", "pg-pg1")] = GANG
    return store


async def test_the_decision_and_the_released_status_are_one_write(
    written: list[tuple[str, dict[str, Any]]],
) -> None:
    store = released_store()
    (view,) = assemble(store)
    records = GangRecords(api=None, store=store)  # type: ignore[arg-type]
    admission = {"attempt": 1, "time": "t", "placement": [{"uid": "a"}, {"uid": "b"}]}
    recorded = await records.record_release(view, GANG, admission, 2)
    await records.write_group_released(view, recorded)
    await records.write(view, None, 2)  # the pass's write, with both releases done

    assert [what for what, _ in written] == ["gang", "podgroups"]
    gang, group = written[0][1], written[1][1]
    assert gang["admission"] == admission
    assert (gang["phase"], gang["released"], gang["gated"]) == ("Scheduling", 2, 0)
    admitted = next(c for c in gang["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "True" and admitted["lastTransitionTime"]
    assert group["phase"] == "Scheduling" and group["scheduleStartTime"]


async def test_a_failed_release_is_corrected_by_the_next_write(
    written: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = released_store()
    (view,) = assemble(store)
    records = GangRecords(api=None, store=store, interval=0.0)  # type: ignore[arg-type]
    await records.record_release(view, GANG, {"attempt": 1, "placement": []}, 2)
    await records.write(view, None, 1)  # one pod was gone by its release

    gang_writes = [body for what, body in written if what == "gang"]
    assert len(gang_writes) == 2
    assert (gang_writes[-1]["released"], gang_writes[-1]["gated"]) == (1, 1)
    assert "admission" not in gang_writes[-1], "the decision is not written again"


async def test_a_failed_group_write_does_not_fail_the_release_and_is_written_again(
    written: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = [ApiException(status=500, reason="etcd timeout")]

    async def group_status(api: object, group: str, version: str, plural: str, *rest: Any) -> bool:
        if failures:
            raise failures.pop()
        written.append((plural, rest[-1]))
        return True

    monkeypatch.setattr(writes, "patch_status", group_status)
    store = released_store()
    (view,) = assemble(store)
    records = GangRecords(api=None, store=store)  # type: ignore[arg-type]
    recorded = await records.record_release(view, GANG, {"attempt": 1, "placement": []}, 2)
    await records.write_group_released(view, recorded)  # raises nothing
    await records.write(view, None, 2)  # the pass's write: the group's status, and the Gang's again

    assert [what for what, _ in written] == ["gang", "gang", "podgroups"]
    assert written[-1][1]["phase"] == "Scheduling"
