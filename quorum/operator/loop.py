"""The scheduling loop: quorum's own asyncio task (not a kopf handler), run while this replica
holds the Lease. It decides what runs for which gang and in which order, and hands the work on;
it makes no API call itself.

It starts only once every watched kind has been listed, resumes from the decisions recorded on
the Gang objects, and then makes a pass on every change (paced, and at least every
`resync_seconds`). A pass:

1. ends the reservations of pods now bound or gone (`ledger.py`) and assembles the gangs from
   the store (`gangs.py`);
2. starts, as each gang's own task (`work.py`), what is due outside the plan: finishing a
   release cut off (`release.py`), recovery (`recovery.py`), ending preemptions;
3. sorts out the gangs the planner may see (`holds.py`) and plans one `Snapshot` in a worker
   thread (`snapshot.py`, `quorum.core.planner`), so the watches, the Lease and the writes go on;
4. starts each release (`release.py`: reserved at once, recorded, then patched) and, for a gang
   held for lack of room, a preemption (`preemption.py`);
5. composes every gang's status and starts the writes that are due (`status.py`).

The pass awaits none of the gangs' tasks: one gang's slow or failing writes delay nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from quorum.core.devices import DeviceKey
from quorum.core.model import Gang
from quorum.core.planner import Hold, Planner
from quorum.k8s.api import KubeApi
from quorum.k8s.convert import newer_or_same
from quorum.k8s.devices import DeviceObjects
from quorum.k8s.usage import BoundPods
from quorum.operator import clock, metrics
from quorum.operator.delegation import Delegation
from quorum.operator.gangs import GangView, Store, assemble, composites
from quorum.operator.health import Health
from quorum.operator.holds import Holds
from quorum.operator.ledger import Ledger
from quorum.operator.memory import GangMemories
from quorum.operator.preemption import Preempter
from quorum.operator.recovery import Recoverer
from quorum.operator.release import Releaser, ReleaseSettings
from quorum.operator.schedulers import OTHER_SCHEDULERS, OtherSchedulers
from quorum.operator.settings import LoopSettings
from quorum.operator.snapshot import DeviceNodes, NodeModels, PodModels, Snapshot, plan, victims_devices
from quorum.operator.status import GangRecords
from quorum.operator.work import GangWork

log = logging.getLogger("quorum.operator")
GangKey = tuple[str, str]
JSON = dict[str, Any]
SLOW_PASS_SECONDS = 1.0  # a pass slower than this is logged with where its time went


@dataclass(frozen=True)
class CatchUp:
    """The gang pods and Gangs the apiserver listed when this replica took the lead (uid or
    key -> resourceVersion). The watches have caught up once the store holds each at that
    version or later, or its watch has delivered past that version without it (deleted since);
    one the store does not hold is waited for at most until `deadline` (monotonic): a watch
    that relisted after the object went delivers nothing past it."""

    pods: Mapping[str, str]
    gangs: Mapping[GangKey, str]
    deadline: float
    # DRA claims: allocations an earlier leader wrote must be seen, or their devices look free.
    claims: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        pods: Mapping[str, str],
        gangs: list[JSON],
        deadline: float,
        claims: Mapping[str, str] | None = None,
    ) -> CatchUp:
        def version(obj: JSON) -> str:
            return str((obj.get("metadata") or {}).get("resourceVersion") or "")

        return cls(
            dict(pods),
            {(str(g["metadata"].get("namespace")), str(g["metadata"]["name"])): version(g) for g in gangs},
            deadline,
            dict(claims or {}),
        )

    def behind(self, store: Store, devices: DeviceObjects | None = None) -> int:
        """How many listed objects the store (and the DRA claims' index) does not show yet."""
        waiting_for_absent = clock.monotonic() < self.deadline

        def lags(progress: str, seen: JSON | None, version: str) -> bool:
            if seen is None:  # made since, or deleted since: a relist may never say which
                return waiting_for_absent and newer_or_same(progress, version) is not True
            return newer_or_same(str(seen["metadata"].get("resourceVersion") or ""), version) is False

        claims = devices.claims if devices is not None else None
        return (
            sum(lags(store.progress.get("pods", ""), store.pods.get(uid), v) for uid, v in self.pods.items())
            + sum(lags(store.progress.get("gangs", ""), store.gangs.get(k), v) for k, v in self.gangs.items())
            + sum(
                lags(claims.progress, claims.object(uid), v) if claims is not None else 1
                for uid, v in self.claims.items()
            )
        )


class GangLoop:
    def __init__(
        self,
        api: KubeApi,
        store: Store,
        bound: BoundPods,
        settings: LoopSettings,
        health: Health | None = None,
    ) -> None:
        self.api = api
        self.store = store
        self.bound = bound
        self.settings = settings
        self.health = health or Health()
        self.dirty = asyncio.Event()
        self.ledger = Ledger()
        self.memory = GangMemories()  # what this process knows of each gang: one entry per gang
        self.records = GangRecords(api, store, settings.status_interval_seconds, self.memory)
        self.events = self.records.events
        self.recoverer = Recoverer(
            api, self.records, settings.backoff, self.ledger, settings.member_loss_policy, settings.placement
        )
        self.preempter = Preempter(api, self.records, bound, settings.preemption, settings.planner)
        self.work = GangWork(
            settings.gang_concurrency,
            settings.gang_timeout_seconds,
            settings.failure_backoff,
            self.wake,
            self.records.report_failure,
        )
        self.devices = DeviceObjects()  # DRA objects, fed by the watches
        self.releaser = Releaser(
            api,
            self.records,
            bound,
            self.ledger,
            self.work,
            self.preempter.tokens,
            self.recoverer.recovered_already,
            self.fail,
            ReleaseSettings(
                settings.planner.fit, settings.release_concurrency, settings.gang_timeout_seconds
            ),
            self.devices,
        )
        self.holds = Holds(api, self.records, self.work, self.recoverer, settings.forming_grace_seconds)
        self.delegation = Delegation(api, self.records, self.work, settings.placement)
        self.other_schedulers = OtherSchedulers(api, self.events, settings.coscheduler_names)
        self.planner = Planner(settings.planner)  # keeps its node index between passes
        self.pod_models = PodModels()
        self.node_models = NodeModels()
        self.device_nodes = DeviceNodes()
        self.timings: dict[str, float] = {}  # where the last pass's time went
        self.lap_started = 0.0
        self.worst_pass = 0.0
        self.last_pass_took = 0.0  # how long the last pass took, and when it ended (monotonic)
        self.last_pass_end = 0.0
        self.leading = False
        self.reports: set[asyncio.Task[None]] = set()  # Warning Events of failures found by the pass
        self.told_twice: set[DeviceKey] = set()  # DRA devices allocated twice, told already
        self.catch_up: CatchUp | None = None  # what was listed at the takeover, till the watches show it

    def wake(self) -> None:
        self.dirty.set()

    # -- leading ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Act while this replica leads: wait until every watched kind is listed, resume from
        what the API shows, then plan on every change (and at least every `resync_seconds`)."""
        if self.leading:
            raise RuntimeError("the scheduling loop is running already")
        self.leading = True
        self.health.set_leading(True)
        try:
            for kind, event in list(self.store.synced.items()):
                if not event.is_set():
                    log.info("waiting for the first listing of %s before planning", kind)
                    await event.wait()
            while True:
                try:
                    await self.take_over()
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    log.warning("listing the gangs to take over failed (%s); again in 1s", err)
                    await asyncio.sleep(1.0)
            self.health.pass_completed()  # the first pass resumes, once the watches caught up
            while True:
                await self.wait_for_work()
                started = time.monotonic()
                try:
                    await self.step()
                    self.health.pass_completed()
                    took = time.monotonic() - started
                    self.last_pass_took, self.last_pass_end = took, time.monotonic()
                    metrics.PASS_DURATION.observe(took)
                    self.worst_pass = max(self.worst_pass, took)
                    metrics.PASS_DURATION_MAX.set(self.worst_pass)
                    if took > SLOW_PASS_SECONDS:
                        log.info("slow pass: %.2fs (%s)", took, self.timings)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("scheduling pass failed; next pass in %.0fs", self.settings.resync_seconds)
        finally:
            self.health.set_leading(False)
            await self.work.cancel_all()
            self.leading = False

    async def wait_for_work(self) -> None:
        wait = self.settings.resync_seconds
        for due in (self.holds.next_backoff_end, self.holds.next_forming_due):
            if due:
                wait = max(0.05, min(wait, due - clock.time()))
        for due in (self.records.pacing.next_due, self.work.next_retry()):
            if due:  # a deferred status write, the end of a gang's failure backoff
                wait = max(0.05, min(wait, due - clock.monotonic()))
        # Not asyncio.wait_for: on Python 3.11 it can swallow a cancel that arrives as the wait
        # ends, and leader election cancels this task once when the Lease is lost.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self.dirty.wait()
        gap = self.settings.pass_gap_factor * self.last_pass_took - (time.monotonic() - self.last_pass_end)
        if gap > 0:
            await asyncio.sleep(min(gap, 1.0))  # what arrives meanwhile is in the same pass
        self.dirty.clear()

    async def take_over(self) -> None:
        """Before this replica acts as leader, what the apiserver holds now: the gang pods and
        Gangs, listed afresh. It plans nothing until its watches have shown each of them at
        least as new as that (`CatchUp`): a standby's watches may lag, most when an overloaded
        apiserver breaks watches and Leases together, and a leader that acted on a Gang from
        before the last decision once deleted a gang that had run for an hour."""
        pods = await self.api.gang_pod_versions()
        gangs = await self.api.list_gangs()
        claims = await self.api.resource_claim_versions()
        self.catch_up = CatchUp.of(pods, gangs, clock.monotonic() + self.settings.catch_up_seconds, claims)
        behind = self.catch_up.behind(self.store, self.devices)
        if behind:
            log.info("taking over: waiting for the watches to show %d objects listed afresh", behind)

    def resume(self) -> None:
        """Start leading from the API's state, not from this replica's memory: statuses are
        written afresh, and pods released (by any leader) but not bound yet keep their nodes
        reserved — read from the decisions recorded on the Gang objects."""
        self.records.resume()
        self.ledger.resume(self.store.gangs, self.store.pods, self.bound.pods, self.store.gang_of)
        self.releaser.resume()
        self.planner = Planner(self.settings.planner)  # a full first pass
        self.pod_models = PodModels()  # a plan of the last term may still be using the old ones
        self.health.pass_completed()
        log.info(
            "leading: %d gangs known, %d released pods not bound yet kept reserved",
            len(self.store.gangs),
            len(self.ledger),
        )

    # -- one pass ---------------------------------------------------------------------------

    def lap(self, what: str) -> None:
        now = time.monotonic()
        self.timings[what] = round(now - self.lap_started, 3)
        self.lap_started = now

    async def step(self) -> None:
        if self.catch_up is not None:
            if self.catch_up.behind(self.store, self.devices):
                return  # the watches have not shown what was true at the takeover yet
            self.catch_up = None
            self.resume()  # from what they show now
        self.timings = {}
        self.lap_started = time.monotonic()
        now = clock.time()
        self.releaser.start_orphans()
        self.releaser.tell_unclaimed()
        self.tell_devices_allocated_twice()
        if self.other_schedulers.due(clock.monotonic()) and not self.work.busy(OTHER_SCHEDULERS):
            self.work.start(OTHER_SCHEDULERS, "check", self.other_schedulers.check(now))
        # From here to the plan's snapshot, no await: the usage (`used`) and the nodes it changed
        # must be taken together, or a node that changes in between is synced into the
        # planner's index with stale usage and never again.
        self.ledger.settle(self.bound.pods, self.store.pods)
        views = {v.key: v for v in assemble(self.store, self.ledger.uids)}
        for view in views.values():
            if view.failure:
                if not self.work.backing_off(view.key):  # tried again once its backoff ends
                    self.fail(view.key, "assemble", view.failure)
            else:
                self.work.succeeded(view.key, "assemble")
            self.memory[view.key].first_pod = view.pods[0]  # for Events before its Gang exists
        self.lap("assemble")
        nodes = self.node_models.refresh(self.store.nodes)
        self.releaser.start_continued(views, nodes, now)
        self.recoverer.start_due(views, self.work, self.fail, now)
        self.delegation.start_due(views)
        self.preempter.start_upkeep(views, self.work, now)
        self.lap("recover")
        # Gangs with a task in flight that the planner does not see this pass: their status
        # waits for the next pass (woken when the task ends), even if the task ends during the
        # plan, so that it is never composed without the pass's hold (a held gang shown not
        # held, its Unschedulable time and its starvation clock restarted, depending on timing).
        unplanned = {key for key in views if self.work.blocks_planning(key)}
        holds, plannable = self.holds.sort_out(views, now)
        holds.update(self.delegation.holds(views, holds))
        snapshot = Snapshot(
            nodes=nodes,
            used=self.ledger.usage(self.bound.used),  # with the reservations just made
            gangs=plannable,
            held_since={key: self.records.held_since(key) for key in plannable},
            tokens=self.preempter.tokens(),
            changed=self.changed(),
            now=now,
            composites=composites(self.store, views.values()),
            devices=self.devices.world(nodes, self.ledger.devices()),
        )
        self.lap("snapshot")
        planned = await asyncio.to_thread(plan, snapshot, self.planner, self.pod_models, self.device_nodes)
        metrics.PLAN_DURATION.observe(time.monotonic() - self.lap_started)
        self.lap("plan")
        for key, message in planned.failed.items():
            holds[key] = Hold(Gang(*key, 1, ()), "PlanningFailed", message)
            self.fail(key, "plan", message)
        for release in planned.plan.releases:
            self.releaser.start(plannable[release.gang.key], release, planned.devices.get(release.gang.key))
        for hold in planned.plan.holds:
            key = hold.gang.key
            if hold.reason == "PlanningFailed":
                self.fail(key, "plan", hold.message.removeprefix("planning failed: "))
            else:
                self.work.succeeded(key, "plan")
            holds[key] = self.holds.explain(plannable[key], hold)
        for release in planned.plan.releases:
            self.work.succeeded(release.gang.key, "plan")
        self.lap(f"release {len(planned.plan.releases)} gangs")
        await self.preempter.start(
            views,
            plannable,
            planned.plan,
            planned.nodes or nodes,
            self.planner.room_for,
            self.work,
            self.ledger,
            self.fail,
            now,
            victims_devices(planned.counts, self.devices),
        )
        self.holds.add_why_not(holds, self.preempter.why_not)
        self.lap("preempt")
        self.start_status_writes(views, holds, now, unplanned)
        self.lap(f"status of {len(views)} gangs")
        self.collect_garbage(views)

    def changed(self) -> set[str] | None:
        """Nodes whose usage or object changed since the last pass (None: compare all)."""
        bound = self.bound.take_dirty()
        changed = self.node_models.take_changed() | self.ledger.take_changed()
        return None if bound is None else changed | bound

    # -- status -------------------------------------------------------------------------------

    def start_status_writes(
        self,
        views: dict[GangKey, GangView],
        holds: dict[GangKey, Hold],
        now: float,
        unplanned: set[GangKey],
    ) -> None:
        forming = self.holds.forming(set(views), holds, now)
        statuses = self.records.start_writes(views, holds, forming | unplanned, self.work, self.fail)
        phases: Counter[tuple[str, str]] = Counter()
        for key, status in statuses.items():
            self.observe_bound(views[key], status.counts)
            phases[(status.phase, status.condition("Admitted")["reason"])] += 1
        metrics.set_gangs(phases)
        metrics.GATED_PODS.set(sum(status.counts["gated"] for status in statuses.values()))
        metrics.STARVATION_HELD_NODES.set(sum(len(hold.held_nodes) for hold in holds.values()))
        metrics.STARVATION_RESTING_TENANTS.set(len(self.planner.resting_tenants(now)))

    def observe_bound(self, view: GangView, counts: Mapping[str, int]) -> None:
        """The time from a released gang's last member to minMember of its pods bound."""
        entry = self.memory.get(view.key)
        if entry is not None and entry.complete_at is not None and counts["bound"] >= (view.min_member or 1):
            metrics.BOUND_LATENCY.observe(max(0.0, clock.time() - entry.complete_at))
            entry.complete_at = None

    def tell_devices_allocated_twice(self) -> None:
        """A device two allocated claims hold (kube-scheduler allocated it to a pod outside
        gangs while quorum did for a gang, neither seeing the other's write yet): counted in a
        metric, and a Warning Event on each such claim, once per device."""
        twice = self.devices.claims.twice
        metrics.DRA_DEVICES_ALLOCATED_TWICE.set(len(twice))
        for key in twice - self.told_twice:
            claims = self.devices.claims.holding(key)
            names = ", ".join(f"{c['metadata'].get('namespace')}/{c['metadata']['name']}" for c in claims)
            message = (
                f"device {'/'.join(key)} is allocated to more than one ResourceClaim ({names}): two "
                "allocators took it at once; the pods of all but one cannot start on it (docs/dra.md)"
            )
            log.warning("%s", message)
            objects = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **c} for c in claims]
            self.report(self.events.post_all(objects, "DeviceAllocatedTwice", message, True))
        self.told_twice = set(twice)

    # -- failures and garbage -------------------------------------------------------------------

    def fail(self, key: GangKey, stage: str, message: str) -> None:
        """A failure found by the pass itself (not in a gang's task): kept like a task's, and
        reported the same way."""
        failure = self.work.fail(key, stage, message)
        log.warning("%s/%s: %s", key[0], key[1], failure.sentence())
        self.report(self.records.report_failure(key, failure))

    def report(self, telling: Coroutine[Any, Any, None]) -> None:
        """Tell in the background (Events, a status), kept in `reports` until done."""
        task = asyncio.create_task(telling)
        self.reports.add(task)
        task.add_done_callback(self.reports.discard)

    def collect_garbage(self, views: dict[GangKey, GangView]) -> None:
        """Forget what is kept per gang once the gang is gone; delete expired label-only Gangs."""
        live = set(views)
        for key in self.records.label_gangs_expired(live, self.settings.label_gang_retention_seconds):
            if not self.work.busy(key):
                self.work.start(key, "status", self.records.delete_label_gang(key))
        known = live | set(self.store.gangs)
        self.memory.keep(known)  # a gang gone is forgotten here, at once
        self.records.prune()
        self.recoverer.prune(self.store.pods)
        self.preempter.prune(known)
        self.work.prune(known)
        self.releaser.prune()
        self.holds.prune()
