"""Leadership: however an election ends — the Lease lost, or the election itself failing (an
apiserver restarting resets the connection; a hung one makes a Lease read time out) — the
scheduling loop is cancelled and has finished before the replica campaigns again, so no
orphaned loop acts without the Lease. Against a stateful fake Lease."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from quorum.operator.leader import BoundedLeaseLock, LeaseSettings, lead


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

    settings = LeaseSettings(lease_duration=3, renew_deadline=2, retry_period=1)
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
