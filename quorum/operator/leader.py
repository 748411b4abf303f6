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


def identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


async def lead(
    api: client.ApiClient, act: Callable[[], Coroutine[Any, Any, None]], settings: LeaseSettings
) -> None:
    """Campaign for the Lease forever; run `act` while holding it."""
    me = identity()
    while True:
        lock = LeaseLock(settings.name, settings.namespace, me, api)

        async def stopped() -> None:
            log.warning("%s lost the Lease %s/%s; stopped acting", me, settings.namespace, settings.name)

        config = electionconfig.Config(
            lock, settings.lease_duration, settings.renew_deadline, settings.retry_period, act, stopped
        )
        log.info("%s campaigning for the Lease %s/%s", me, settings.namespace, settings.name)
        try:
            await leaderelection.LeaderElection(config).run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("leader election failed; campaigning again")
        await asyncio.sleep(settings.retry_period)
