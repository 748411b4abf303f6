"""Only one operator replica acts: the one holding the Lease `quorum-system/quorum-operator`
(kubernetes-asyncio's leader election). Every replica watches (kopf runs standalone and writes
nothing), so a new leader starts from a warm store. Losing the Lease cancels the scheduling
loop before the lease could be taken by another replica (renew deadline < lease duration);
every release patch is conditional anyway, so a stale leader can never double-release.

How long a leader may still act once it can no longer renew (another holder took the Lease, or
the apiserver does not answer) is `LeaseSettings.acts_at_most`, always shorter than its lease
by `LeaseSettings.margin` (checked when the settings are made): `quorum uninstall` waits that
out after it takes the Lease. A Lease held by `removal.UNINSTALL_HOLDER` is left to it for the
leaseDurationSeconds it recorded, at most `removal.MAX_UNINSTALL_HOLD` (600 s), measured from
when this replica first saw that record (its own monotonic clock, as client-go does: the
uninstall's clock may be skewed); any other holder is judged by this replica's own duration, so
that nobody who may write Leases in quorum's namespace can freeze quorum with a long one."""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from quorum.core.removal import MAX_UNINSTALL_HOLD, OPERATOR_LEASE, UNINSTALL_HOLDER
from quorum.install import DEFAULT_NAMESPACE

log = logging.getLogger("quorum.operator.leader")


MIN_LEASE_SECONDS = 6  # the shortest lease with a margin (retry 1, lock 1, renew 2): `for_duration`


@dataclass(frozen=True)
class LeaseSettings:
    name: str = OPERATOR_LEASE
    namespace: str = DEFAULT_NAMESPACE
    # Whole seconds: the library writes lease_duration into the Lease as an int of its str().
    lease_duration: int = 15
    renew_deadline: float = 8
    retry_period: float = 1
    lock_timeout: float = 2  # the time limit of each read and write of the Lease (`BoundedLeaseLock`)

    def __post_init__(self) -> None:
        acts = self.acts_at_most()
        if acts + self.margin > self.lease_duration:
            raise ValueError(
                f"lease settings {self.lease_duration} s (renew deadline {self.renew_deadline} s, retry "
                f"period {self.retry_period} s, lock timeout {self.lock_timeout} s): a leader that can no "
                f"longer renew may act {acts:g} s, which must be at most the lease duration minus "
                f"{self.margin:g} s, or another replica could take the Lease while it still acts"
            )
        if self.retry_period < 1 or self.lock_timeout < 1 or self.renew_deadline <= 1.2 * self.retry_period:
            raise ValueError(
                f"lease settings: retry period {self.retry_period} s and lock timeout {self.lock_timeout} s "
                f"must be at least 1 s, the renew deadline {self.renew_deadline} s over 1.2 retry periods"
            )

    @property
    def margin(self) -> float:
        """How much shorter than the lease `acts_at_most` must be: for clocks that run at
        slightly different rates and a write already sent (a fifth of the lease, 1 s at least)."""
        return max(1, self.lease_duration // 5)

    @classmethod
    def for_duration(cls, namespace: str, seconds: float) -> LeaseSettings:
        """Timings for a lease of `seconds` (at least `MIN_LEASE_SECONDS`), derived so that
        `acts_at_most` is the lease minus `margin`: 15 s gives retry 1, lock timeout 2, renew
        deadline 8, so 12 s."""
        lease = max(MIN_LEASE_SECONDS, int(seconds))
        retry = max(1, lease // 15)
        lock = max(1, lease // 7)
        margin = max(1, lease // 5)
        return cls(
            namespace=namespace,
            lease_duration=lease,
            renew_deadline=lease - margin - 2 * retry - lock,
            retry_period=retry,
            lock_timeout=lock,
        )

    def acts_at_most(self) -> float:
        """How long a leader may still act after its last successful renewal, at most (seconds):
        the renewal round after it starts `retry_period` later; its attempts fail (another holds
        the Lease, or the apiserver does not answer) until `renew_deadline`; the last one, started
        just before that, takes at most `lock_timeout` (a bounded Lease read) and is followed by
        one more `retry_period`; then the election ends and `lead` cancels the scheduling loop
        and awaits it. (A process paused as a whole, stopped or swapped out, is not bounded by
        anything of its own; its writes are conditional.)"""
        return 2 * self.retry_period + self.renew_deadline + self.lock_timeout


class BoundedLeaseLock(LeaseLock):
    """A LeaseLock whose every read and write of the Lease has a time limit: a hung apiserver
    ends the election (and with it the scheduling loop) instead of leaving this replica acting
    while its Lease runs out and another takes it."""

    timeout: float = 5.0

    async def get(self, name: str, namespace: str) -> Any:
        return await asyncio.wait_for(super().get(name, namespace), self.timeout)

    async def create(self, name: str, namespace: str, election_record: Any) -> bool:
        return await asyncio.wait_for(super().create(name, namespace, election_record), self.timeout)

    async def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        return await asyncio.wait_for(super().update(name, namespace, updated_record), self.timeout)


class Election(leaderelection.LeaderElection):
    """kubernetes-asyncio's election, except that a Lease held by `removal.UNINSTALL_HOLDER` is
    left to it for the leaseDurationSeconds it recorded (at most `MAX_UNINSTALL_HOLD`) when that
    is longer than this replica's own duration: the library measures every holder's lease by the
    candidate's own setting, so the uninstall's longer hold would be taken back after 15 s. Any
    other holder is judged as the library does (this replica's own duration): a Lease written
    with a huge leaseDurationSeconds by whoever may write Leases does not stop quorum.

    The hold is measured from when this replica first saw that holder with that renewTime, on
    its own monotonic clock (as client-go does), never from the recorded renewTime: the
    uninstall's clock may be skewed. A record first seen long after it was written (quorum
    installed again) is still left to its holder at most the cap from this replica's own
    observation; one whose renewTime is older than its duration plus the cap by this replica's
    clock (beyond any plausible skew) is over."""

    _told: str | None = None
    _seen: tuple[str, str] | None = None  # (holder, renewTime) first seen at `_seen_at`
    _seen_at: float = 0.0
    monotonic: Callable[[], float] = staticmethod(time.monotonic)  # tests give a fake one

    def honoured_until(self, seen: Any) -> float | None:
        """Until when (this replica's monotonic clock) the uninstall's recorded hold keeps this
        replica off the Lease, or None: not a holder whose longer hold is honoured."""
        if seen is None or seen.holder_identity != UNINSTALL_HOLDER:
            return None
        try:
            recorded = min(float(seen.lease_duration or 0), float(MAX_UNINSTALL_HOLD))
        except ValueError:
            return None
        if recorded <= self.election_config.lease_duration:
            return None
        key = (str(seen.holder_identity), str(seen.renew_time))
        if key != self._seen:  # first seen when the library observed it (this replica's clock)
            ago = max(0.0, time.time() - self.observed_time_milliseconds / 1000)
            self._seen, self._seen_at = key, self.monotonic() - ago
        renewed = utc_epoch(seen.renew_time)
        if renewed is not None and renewed + recorded + MAX_UNINSTALL_HOLD < time.time():
            return None  # written long ago, whatever the skew: its term is over
        return self._seen_at + recorded

    async def update_lock(self, leader_election_record: Any) -> bool:
        seen = self.observed_record
        me = self.election_config.lock.identity
        if seen is not None and seen.holder_identity and seen.holder_identity != me:
            until = self.honoured_until(seen)
            if until is not None and until > self.monotonic():
                if self._told != seen.holder_identity:
                    self._told = seen.holder_identity
                    log.info(
                        "%s: the Lease is held by %s for %.0f s more (its leaseDurationSeconds, at most "
                        "%d s): not taken",
                        me,
                        seen.holder_identity,
                        until - self.monotonic(),
                        MAX_UNINSTALL_HOLD,
                    )
                return False
        result: bool = await super().update_lock(leader_election_record)
        return result


def utc_epoch(value: str | None) -> float | None:
    """Epoch seconds of a Lease time as the library's record holds it (UTC, without a zone)."""
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value).replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return None


def identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


async def lead(
    api: client.ApiClient,
    act: Callable[[], Coroutine[Any, Any, None]],
    settings: LeaseSettings,
    lock_of: Callable[[str, str, str, client.ApiClient], Any] | None = None,
) -> None:
    """Campaign for the Lease forever; run `act` while holding it. However the election ends
    (the Lease lost, or the election itself failing: an apiserver restarting resets its
    connection), `act` is cancelled and has finished before this replica campaigns again. (The
    library cancels it only when a renewal is refused, not when a renewal raises, and does not
    wait for it: an orphaned loop would act without the Lease.)"""
    me = identity()
    while True:
        if lock_of is None:
            lock = BoundedLeaseLock(settings.name, settings.namespace, me, api)
            lock.timeout = settings.lock_timeout
        else:
            lock = lock_of(settings.name, settings.namespace, me, api)
        acting: list[asyncio.Task[Any]] = []

        async def start(acting: list[asyncio.Task[Any]] = acting) -> None:
            task = asyncio.current_task()
            if task is not None:
                acting.append(task)
            await act()

        async def stopped() -> None:
            log.warning("%s lost the Lease %s/%s; stopped acting", me, settings.namespace, settings.name)

        config = electionconfig.Config(
            lock, settings.lease_duration, settings.renew_deadline, settings.retry_period, start, stopped
        )
        log.info("%s campaigning for the Lease %s/%s", me, settings.namespace, settings.name)
        try:
            await Election(config).run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("leader election failed; campaigning again")
        finally:
            for task in acting:
                task.cancel()
            await asyncio.gather(*acting, return_exceptions=True)
        await asyncio.sleep(settings.retry_period)
