"""Only one operator replica acts: the one holding the Lease `quorum-system/quorum-operator`
(kubernetes-asyncio's leader election). Every replica watches (kopf runs standalone and writes
nothing), so a new leader starts from a warm store. Losing the Lease cancels the scheduling
loop before the lease could be taken by another replica (renew deadline < lease duration);
every release patch is conditional anyway, so a stale leader can never double-release."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from quorum.install import DEFAULT_NAMESPACE

log = logging.getLogger("quorum.operator.leader")


@dataclass(frozen=True)
class LeaseSettings:
    name: str = "quorum-operator"
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
            lock.timeout = max(1.0, settings.renew_deadline / 2)
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
            await leaderelection.LeaderElection(config).run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("leader election failed; campaigning again")
        finally:
            for task in acting:
                task.cancel()
            await asyncio.gather(*acting, return_exceptions=True)
        await asyncio.sleep(settings.retry_period)
