"""Another scheduler running under a name quorum takes: the leader finds its held Lease and says
so once, in a Warning Event on it (quorum.operator.schedulers)."""

from __future__ import annotations

from typing import Any

from quorum.core.times import micro_time
from quorum.operator.events import EventRecorder
from quorum.operator.gangs import Store
from quorum.operator.schedulers import CHECK_SECONDS, OtherSchedulers, held_now
from tests.unit.fake_api import FakeApi

NOW = 1_800_000_000.0


def lease(
    name: str, renewed: float, holder: str | None = "scheduler-plugins-7d9_x", uid: str = "l1"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"renewTime": micro_time(renewed), "leaseDurationSeconds": 15}
    if holder is not None:
        spec["holderIdentity"] = holder
    return {"metadata": {"name": name, "namespace": "scheduler-plugins", "uid": uid}, "spec": spec}


def test_a_lease_is_held_only_with_a_holder_and_a_recent_renewal() -> None:
    assert held_now(lease("s", NOW - 5), NOW)
    assert not held_now(lease("s", NOW - 600), NOW), "renewed ten minutes ago: nobody runs"
    assert not held_now(lease("s", NOW - 5, holder=None), NOW), "released"
    assert not held_now({"metadata": {"name": "s"}, "spec": {"renewTime": "garbage"}}, NOW)


async def test_the_leader_tells_once_about_a_held_lease_of_a_taken_name() -> None:
    api = FakeApi(Store())
    api.leases = [
        lease("scheduler-plugins-scheduler", NOW - 3),
        lease("coscheduler", NOW - 3600, uid="l2"),  # stale: not told
        lease("other-scheduler", NOW - 3, uid="l3"),  # not a name quorum takes
    ]
    others = OtherSchedulers(
        api, EventRecorder(api), ("cw-coscheduler", "coscheduler", "scheduler-plugins-scheduler")
    )
    assert others.due(0.0) and not others.due(1.0) and others.due(CHECK_SECONDS)
    await others.check(NOW)
    await others.check(NOW)  # once per Lease
    (event,) = [e for e in api.events if e[1] == "SchedulerNameTaken"]
    name, _, message, warning = event
    assert name == "scheduler-plugins-scheduler" and warning
    assert "schedulers.schedulerPlugins: true" in message
