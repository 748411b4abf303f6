"""Only one operator replica acts: the one holding the Lease `quorum-system/quorum-operator`
(kubernetes-asyncio's leader election). Every replica watches (kopf runs standalone and writes
nothing), so a new leader starts from a warm store. Losing the Lease cancels the scheduling
loop before the lease could be taken by another replica (renew deadline < lease duration);
every release patch is conditional anyway, so a stale leader can never double-release.

How long a leader may still act once it can no longer renew (another holder took the Lease, or
the apiserver does not answer) is `LeaseSettings.acts_at_most`: `quorum uninstall` waits that
out after it takes the Lease. A Lease held by another is left to it for the
leaseDurationSeconds *it* recorded when that is longer than this replica's own (as client-go
does; kubernetes-asyncio uses its own duration alone): `quorum uninstall` holds the Lease so,
and no replica acts meanwhile."""

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

from quorum.core.removal import OPERATOR_LEASE
from quorum.install import DEFAULT_NAMESPACE

log = logging.getLogger("quorum.operator.leader")


@dataclass(frozen=True)
class LeaseSettings:
    name: str = OPERATOR_LEASE
    namespace: str = DEFAULT_NAMESPACE
    # Whole seconds: the library writes lease_duration into the Lease as an int of its str().
    lease_duration: int = 15
    renew_deadline: int = 10
    retry_period: int = 2

    @classmethod
    def for_duration(cls, namespace: str, seconds: float) -> LeaseSettings:
        lease = max(3, int(seconds))
        return cls(
            namespace=namespace,
            lease_duration=lease,
            renew_deadline=max(2, lease * 2 // 3),
            retry_period=max(1, lease // 8),
        )

    @property
    def lock_timeout(self) -> float:
        """The time limit of each read and write of the Lease (`BoundedLeaseLock`)."""
        return max(1.0, self.renew_deadline / 2)

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
    """kubernetes-asyncio's election, except that a Lease another replica (or `quorum
    uninstall`) holds is left to it until the leaseDurationSeconds it recorded has passed since
    this replica last saw the record change, when that is longer than this replica's own
    duration: the library measures every holder's lease by the candidate's own setting, so a
    longer hold written by `quorum uninstall` would be taken back after 15 s. The hold ends no
    later than that duration after the record's renewTime either, so that a replica that starts
    long after (quorum installed again into the namespace) does not wait it out once more."""

    _told: str | None = None

    async def update_lock(self, leader_election_record: Any) -> bool:
        seen = self.observed_record
        me = self.election_config.lock.identity
        if seen is not None and seen.holder_identity and seen.holder_identity != me:
            try:
                recorded = float(seen.lease_duration or 0)
            except ValueError:
                recorded = 0.0
            held_until = self.observed_time_milliseconds / 1000 + recorded
            renewed = utc_epoch(seen.renew_time)
            if renewed is not None:  # seen late (a replica started since): not beyond its term
                held_until = min(held_until, renewed + recorded)
            if recorded > self.election_config.lease_duration and held_until > time.time():
                if self._told != seen.holder_identity:
                    self._told = seen.holder_identity
                    log.info(
                        "%s: the Lease is held by %s for %.0f s (its leaseDurationSeconds): not taken",
                        me,
                        seen.holder_identity,
                        recorded,
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
