"""The scheduling loop defers the writes of a gang still forming (short of members, first seen
less than the grace ago): a gang whose pods arrive together costs no status writes or Events
before its release; one that keeps waiting is written once the grace is over."""

from __future__ import annotations

import pytest

from quorum.core.model import Gang
from quorum.core.planner import Hold
from quorum.k8s.usage import BoundPods
from quorum.operator.gangs import Store
from quorum.operator.holds import Holds
from quorum.operator.loop import GangLoop
from quorum.operator.settings import LoopSettings, OperatorSettings

A, B, C = ("ns", "a"), ("ns", "b"), ("ns", "c")


def hold(key: tuple[str, str], reason: str) -> Hold:
    return Hold(Gang(key[0], key[1], 4, ()), reason, "")


def loop() -> Holds:
    gangs = GangLoop(None, Store(), BoundPods(), LoopSettings(forming_grace_seconds=2.0))  # type: ignore[arg-type]
    return gangs.holds


def test_a_gang_short_of_members_waits_out_the_grace_then_is_written() -> None:
    gangs = loop()
    holds = {A: hold(A, "WaitingForMembers"), B: hold(B, "Unschedulable")}
    assert gangs.forming({A, B}, holds, now=100.0) == {A}  # an Unschedulable gang is written at once
    assert gangs.next_forming_due == 102.0  # a pass is due when the grace ends
    assert gangs.forming({A, B}, holds, now=101.0) == {A}
    assert gangs.forming({A, B}, holds, now=102.5) == set()
    assert gangs.next_forming_due == 0.0


def test_a_gang_with_a_gang_object_or_no_hold_is_never_deferred() -> None:
    gangs = loop()
    gangs.store.gangs[A] = {"metadata": {"name": "a"}}
    assert gangs.forming({A, C}, {A: hold(A, "WaitingForMembers")}, now=100.0) == set()


def test_gangs_that_are_gone_are_forgotten() -> None:
    gangs = loop()
    holds = {A: hold(A, "WaitingForMembers")}
    gangs.forming({A}, holds, now=100.0)
    gangs.forming(set(), {}, now=101.0)
    assert gangs.first_seen == {}
    assert gangs.forming({A}, holds, now=105.0) == {A}  # back again: a new grace


def test_operator_settings_read_the_forming_grace_pacing_and_concurrency_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QUORUM_OPERATOR_FORMING_GRACE_SECONDS", "0.5")
    monkeypatch.setenv("QUORUM_OPERATOR_GANG_CONCURRENCY", "8")
    monkeypatch.setenv("QUORUM_OPERATOR_STATUS_INTERVAL_SECONDS", "0.25")
    settings = OperatorSettings.from_env()
    assert (settings.forming_grace_seconds, settings.gang_concurrency) == (0.5, 8)
    assert settings.status_interval_seconds == 0.25
    monkeypatch.delenv("QUORUM_OPERATOR_FORMING_GRACE_SECONDS")
    assert OperatorSettings.from_env().forming_grace_seconds == 2.0
