"""Leadership: however an election ends — the Lease lost, or the election itself failing (an
apiserver restarting resets the connection; a hung one makes a Lease read time out) — the
scheduling loop is cancelled and has finished before the replica campaigns again, so no
orphaned loop acts without the Lease; a leader whose Lease another takes stops within
`LeaseSettings.acts_at_most` (what `quorum uninstall` waits out); a Lease held for longer than
this replica's own duration is left to its holder for as long as it recorded. Against a
stateful fake Lease."""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.leaderelectionrecord import LeaderElectionRecord

from quorum.core import removal
from quorum.operator.leader import MIN_LEASE_SECONDS, BoundedLeaseLock, Election, LeaseSettings, lead
from quorum.operator.settings import OperatorSettings


class FakeLease:
    """One Lease; `broken` makes the next reads raise, `hung` makes them never answer."""

    def __init__(self) -> None:
        self.record: Any = None
        self.broken = 0
        self.hung = False

    def lock(self, name: str, namespace: str, identity: str, api: Any) -> Any:
        lease = self

        class Lock:
            def __init__(self) -> None:
                self.name, self.namespace, self.identity = name, namespace, identity

            async def get(self, name: str, namespace: str) -> Any:
                if lease.hung:
                    await asyncio.sleep(3600)
                if lease.broken:
                    lease.broken -= 1
                    raise ConnectionResetError("connection reset by peer")
                if lease.record is None:
                    missing = ApiException(status=404, reason="Not Found")
                    missing.body = b'{"code": 404}'
                    return False, missing
                return True, lease.record

            async def create(self, name: str, namespace: str, election_record: Any) -> bool:
                lease.record = election_record
                return True

            async def update(self, name: str, namespace: str, updated_record: Any) -> bool:
                lease.record = updated_record
                return True

        return Lock()


async def test_a_failing_election_stops_the_loop_before_campaigning_again() -> None:
    lease = FakeLease()
    running: list[int] = []  # loops acting now
    peak = 0
    started = asyncio.Event()
    stops = 0

    async def act() -> None:
        nonlocal stops, peak
        running.append(1)
        peak = max(peak, len(running))
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            running.pop()
            stops += 1

    settings = LeaseSettings(lease_duration=6, renew_deadline=2, retry_period=1, lock_timeout=1)
    election = asyncio.create_task(lead(None, act, settings, lock_of=lease.lock))  # type: ignore[arg-type]
    await asyncio.wait_for(started.wait(), 5)
    started.clear()
    lease.broken = 1  # the renewal's read raises: the library leaves its task running
    await asyncio.wait_for(started.wait(), 10)
    election.cancel()
    await asyncio.gather(election, return_exceptions=True)
    assert stops >= 1 and peak == 1, f"a loop kept acting after its election ended ({peak} at once)"


async def test_a_hung_lease_read_times_out() -> None:
    """The Lease API hangs (a wedged apiserver): the bounded lock gives up after its timeout, which
    ends the election and with it the loop (above)."""

    class HungCoordination:
        async def read_namespaced_lease(self, name: str, namespace: str) -> Any:
            await asyncio.sleep(3600)

    lock = BoundedLeaseLock("quorum-operator", "quorum-system", "me", None)  # type: ignore[arg-type]
    lock.api_instance = HungCoordination()  # type: ignore[assignment]
    lock.timeout = 0.2
    began = asyncio.get_running_loop().time()
    try:
        await lock.get("quorum-operator", "quorum-system")
    except TimeoutError:
        pass
    else:
        raise AssertionError("a hung Lease read must time out")
    assert asyncio.get_running_loop().time() - began < 2


def held_by(holder: str, seconds: int, renewed_ago: float = 0.0) -> LeaderElectionRecord:
    """A record as the library reads it from a Lease: UTC times without a zone."""
    at = str(
        (datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=renewed_ago)).replace(tzinfo=None)
    )
    return LeaderElectionRecord(holder, str(seconds), at, at)


async def test_a_leader_whose_lease_is_taken_stops_within_acts_at_most() -> None:
    """What `quorum uninstall` relies on: it writes the Lease for another holder, then waits
    `acts_at_most` of the duration the leader recorded (plus a margin)."""
    lease = FakeLease()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def act() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    settings = LeaseSettings(lease_duration=6, renew_deadline=2, retry_period=1, lock_timeout=1)
    assert settings.acts_at_most() == 5  # 2 retry periods, the renew deadline, a bounded read of 1 s
    election = asyncio.create_task(lead(None, act, settings, lock_of=lease.lock))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.sleep(1.5)  # mid-term: a renewal has just been made, or is about to be
        lease.record = held_by("quorum-uninstall", 600)
        taken = time.monotonic()
        await asyncio.wait_for(stopped.wait(), settings.acts_at_most() + 2)
        assert time.monotonic() - taken <= settings.acts_at_most()
        assert lease.record.holder_identity == "quorum-uninstall"  # not taken back
    finally:
        election.cancel()
        await asyncio.gather(election, return_exceptions=True)
    assert LeaseSettings.for_duration("ns", 15).acts_at_most() == 12  # the operator's default


async def test_a_lease_held_for_longer_than_this_replicas_duration_is_left_to_its_holder() -> None:
    """kubernetes-asyncio measures every holder by the candidate's own lease duration: the
    uninstall's longer hold would be taken back 3 s (here; 15 s by default) after it was seen.
    quorum's election honours the duration the holder recorded, as client-go does."""

    async def nothing() -> None:
        return None

    for holder_seconds, ours_after in ((600, 10), (600, 601), (3, 10)):
        lease = FakeLease()
        lease.record = held_by("quorum-uninstall", holder_seconds)
        lock = lease.lock("quorum-operator", "quorum-system", "replica-1", None)
        config = electionconfig.Config(lock, 3, 2, 1, nothing, nothing)
        election = Election(config)
        assert not await election.try_acquire_or_renew()  # seen now: held
        election.observed_time_milliseconds -= ours_after * 1000  # unchanged since
        taken = await election.try_acquire_or_renew()
        assert taken == (ours_after > holder_seconds), (holder_seconds, ours_after)
        assert lease.record.holder_identity == ("replica-1" if taken else "quorum-uninstall")

    # First seen long after it was written, beyond any skew (quorum installed again): over.
    lease = FakeLease()
    lease.record = held_by("quorum-uninstall", 600, renewed_ago=1300)
    election = Election(
        electionconfig.Config(
            lease.lock("quorum-operator", "q", "replica-1", None), 3, 2, 1, nothing, nothing
        )
    )
    assert not await election.try_acquire_or_renew()  # seen now: its own 3 s first, as for any holder
    election.observed_time_milliseconds -= 4000
    assert await election.try_acquire_or_renew() and lease.record.holder_identity == "replica-1"

    lease = FakeLease()
    lease.record = held_by("quorum-uninstall", 600)
    plain = leaderelection.LeaderElection(
        electionconfig.Config(
            lease.lock("quorum-operator", "quorum-system", "replica-1", None), 3, 2, 1, nothing, nothing
        )
    )
    assert not await plain.try_acquire_or_renew()
    plain.observed_time_milliseconds -= 10_000
    assert await plain.try_acquire_or_renew(), "the library alone takes it: the reason for Election"


class Clocks:
    """This replica's wall clock (time.time, which the library reads too) and monotonic clock,
    moved together."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.wall, self.mono = time.time(), 1000.0
        monkeypatch.setattr(time, "time", lambda: self.wall)

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def election_on(lease: FakeLease, clocks: Clocks) -> Election:
    async def nothing() -> None:
        return None

    lock = lease.lock("quorum-operator", "quorum-system", "replica-1", None)
    election = Election(electionconfig.Config(lock, 15, 8, 1, nothing, nothing))
    election.monotonic = clocks.monotonic
    return election


async def test_a_long_lease_written_by_anyone_but_the_uninstall_is_judged_by_the_replicas_own_duration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anyone who may write Leases in quorum's namespace (the static self-protection leaves
    Leases out but quorum-operator's) must not freeze quorum by recording a huge duration."""
    clocks = Clocks(monkeypatch)
    lease = FakeLease()
    lease.record = held_by("x", 2147483647)
    election = election_on(lease, clocks)
    assert not await election.try_acquire_or_renew()
    clocks.advance(16)  # this replica's own 15 s
    assert await election.try_acquire_or_renew() and lease.record.holder_identity == "replica-1"

    # The uninstall's hold is honoured, but at most MAX_UNINSTALL_HOLD.
    lease = FakeLease()
    lease.record = held_by(removal.UNINSTALL_HOLDER, 2147483647)
    election = election_on(lease, clocks)
    assert not await election.try_acquire_or_renew()
    clocks.advance(removal.MAX_UNINSTALL_HOLD - 1)
    assert not await election.try_acquire_or_renew()
    clocks.advance(2)
    assert await election.try_acquire_or_renew() and lease.record.holder_identity == "replica-1"


async def test_the_uninstalls_hold_is_measured_from_this_replicas_observation_not_its_skewed_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The uninstall's laptop runs 500 s behind: its renewTime says the 600 s hold ends 100 s
    after this replica saw it. The hold is measured from this replica's own observation."""
    clocks = Clocks(monkeypatch)
    lease = FakeLease()
    lease.record = held_by(removal.UNINSTALL_HOLDER, 600, renewed_ago=500)  # skewed, written now
    election = election_on(lease, clocks)
    assert not await election.try_acquire_or_renew()
    clocks.advance(300)
    assert not await election.try_acquire_or_renew(), "taken 300 s into a 600 s hold"
    clocks.advance(301)
    assert await election.try_acquire_or_renew() and lease.record.holder_identity == "replica-1"


def test_a_leader_stops_acting_before_its_lease_could_be_taken_for_every_allowed_duration() -> None:
    assert LeaseSettings().acts_at_most() == 12 and LeaseSettings().margin == 3
    default = LeaseSettings.for_duration("ns", OperatorSettings().lease_seconds)
    assert (default.retry_period, default.renew_deadline, default.lock_timeout) == (1, 8, 2)
    lowest = OperatorSettings.model_fields["lease_seconds"].metadata[0].ge
    assert LeaseSettings.for_duration("ns", lowest).lease_duration == MIN_LEASE_SECONDS  # taken as 8
    for seconds in [*range(int(lowest), 400), 3600, 86400]:
        lease = LeaseSettings.for_duration("ns", seconds + 0.5)  # any float the setting allows
        assert lease.acts_at_most() + lease.margin <= lease.lease_duration, seconds
        electionconfig.Config(object(), lease.lease_duration, lease.renew_deadline, lease.retry_period, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="may act 19 s"):  # the old defaults
        LeaseSettings(lease_duration=15, renew_deadline=10, retry_period=2, lock_timeout=5)
