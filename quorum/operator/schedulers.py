"""Another scheduler that runs under a name quorum takes (docs/integrations.md, "One list of
scheduler names"): scheduler-plugins' scheduler, run with leader election, holds a Lease named
after itself. quorum cannot leave such pods to it once its webhooks have taken them (the list is
rendered into the in-apiserver policies), so the leader says so where the platform looks: one
Warning Event on that Lease, with the value that leaves the name to it."""

from __future__ import annotations

import logging

from quorum.core.times import timestamp
from quorum.k8s.api import JSON, KubeApi
from quorum.operator.events import EventRecorder

log = logging.getLogger("quorum.operator")

OTHER_SCHEDULERS = ("", "another scheduler's Lease")  # the work key of the check
CHECK_SECONDS = 60.0  # how often the leader looks
SCHEDULER_PLUGINS_NAME = "scheduler-plugins-scheduler"
FRESH_SECONDS = 60.0  # a Lease renewed this recently is held by a running process


def held_now(lease: JSON, now: float) -> bool:
    """Whether the Lease has a holder that renewed it within FRESH_SECONDS of `now` (epoch
    seconds; clocks differ, hence a minute's margin)."""
    spec = lease.get("spec") or {}
    renewed = timestamp(spec.get("renewTime") or spec.get("acquireTime"))
    return bool(spec.get("holderIdentity")) and renewed > 0 and now - renewed < FRESH_SECONDS


class OtherSchedulers:
    """Looks, at most every CHECK_SECONDS, for a held Lease named after scheduler-plugins'
    scheduler while quorum takes that name, and tells each once per process (a Lease a tenant
    makes so gets the same Warning, in its own namespace: nothing else follows from it)."""

    def __init__(self, api: KubeApi, events: EventRecorder, names: tuple[str, ...]) -> None:
        self.api = api
        self.events = events
        # Only scheduler-plugins' name: its Lease is named after it, and the advice is its value.
        self.names = tuple(n for n in names if n == SCHEDULER_PLUGINS_NAME)
        self.next_check = 0.0
        self.told: set[str] = set()  # Lease uids

    def due(self, monotonic_now: float) -> bool:
        if monotonic_now < self.next_check:
            return False
        self.next_check = monotonic_now + CHECK_SECONDS
        return True

    async def check(self, now: float) -> None:
        seen: set[str] = set()
        for name in self.names:
            for lease in await self.api.leases_named(name):
                meta = lease["metadata"]
                seen.add(str(meta.get("uid")))
                if meta.get("uid") in self.told or not held_now(lease, now):
                    continue
                self.told.add(str(meta.get("uid")))
                holder = str((lease.get("spec") or {}).get("holderIdentity"))[:253]
                message = (
                    f"a scheduler named {name} runs in this cluster (this Lease is held by {holder}), "
                    f"and quorum also takes pods that ask for {name}: it holds them at its gate and "
                    f"releases them to the default scheduler. To leave them to {name}, set the chart "
                    f"value schedulers.schedulerPlugins: true"
                )
                log.warning("Lease %s/%s: %s", meta.get("namespace"), meta.get("name"), message)
                await self.events.post(
                    {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **lease},
                    "SchedulerNameTaken",
                    message,
                    warning=True,
                )
        self.told &= seen  # a Lease gone is forgotten
