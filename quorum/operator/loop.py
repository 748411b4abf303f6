"""The scheduling loop: quorum's own asyncio task (not a kopf handler).

Each pass takes a snapshot (groups from the kopf watches; gang pods, the usage of bound pods
and nodes from quorum's own watches; reservations of pods released but not yet bound),
recovers gangs whose release timed out (`recovery.py`), plans the gangs not backing off,
releases what fits — decision recorded on the Gang object first, then one conditional patch per
pod — and writes the status of every gang and its group when it changed (`status.py`).
Events: one per gang when it is released, and one when the reason it is held changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import Counter
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes_asyncio import client

from quorum.core.fit import FitSettings
from quorum.core.lifecycle import BackoffPolicy
from quorum.core.model import Node, add
from quorum.core.planner import Hold, Planner, PlannerSettings, Release
from quorum.k8s import reads, writes
from quorum.k8s.convert import node_from_api, pod_requests
from quorum.k8s.usage import BoundPods
from quorum.operator.gangs import GangView, Store, assemble, is_gated, orphans
from quorum.operator.recovery import Recoverer, backoff_message, backoff_until, recovery_of
from quorum.operator.status import GangRecords

log = logging.getLogger("quorum.operator")
T = TypeVar("T")
SLOW_PASS_SECONDS = 1.0  # a pass slower than this is logged with where its time went


@dataclass(frozen=True)
class LoopSettings:
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    resync_seconds: float = 5.0  # a pass at least this often, even without events
    release_concurrency: int = 128  # pod patches in flight at once
    gang_concurrency: int = 64  # gangs whose writes (release, status) are in flight at once
    label_gang_retention_seconds: float = 300.0  # label-only Gang objects outlive their pods this long
    # A gang still short of members is written (Gang object, status, Events) only once it has
    # waited this long: a gang whose pods arrive together is released before anyone needs to
    # read why it waits, and its writes would cost the apiserver for nothing.
    forming_grace_seconds: float = 2.0
    status_interval_seconds: float = 1.0  # one gang's status is written at most this often
    crash_after: int = 0  # tests only: SIGKILL this process after that many pod releases
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)


async def bounded(coros: Iterable[Coroutine[Any, Any, T]], limit: int) -> list[T]:
    """Run the coroutines at most `limit` at a time; results in order."""
    gate = asyncio.Semaphore(limit)

    async def one(coro: Coroutine[Any, Any, T]) -> T:
        async with gate:
            return await coro

    return list(await asyncio.gather(*(one(c) for c in coros)))


def planner_settings(org: str | None, starvation_seconds: float) -> PlannerSettings:
    return PlannerSettings(fit=FitSettings(org=org), starvation_seconds=starvation_seconds)


class GangLoop:
    def __init__(self, api: client.ApiClient, store: Store, bound: BoundPods, settings: LoopSettings) -> None:
        self.api = api
        self.store = store
        self.bound = bound
        self.settings = settings
        self.dirty = asyncio.Event()
        self.reserved: dict[str, tuple[str, dict[str, int]]] = {}  # uid -> (node, requests)
        self.records = GangRecords(api, store, settings.status_interval_seconds)
        self.recoverer = Recoverer(api, settings.backoff)
        self.told_dropped: set[str] = set()  # pods released because their group was dropped
        self.last_seen: dict[tuple[str, str], float] = {}
        self.statefulsets: dict[str, str | None] = {}  # uid -> podManagementPolicy
        self.next_backoff_end = 0.0  # the earliest end of a backoff: a pass is due then
        self.first_seen: dict[tuple[str, str], float] = {}  # gang -> when a pass first saw it
        self.next_forming_due = 0.0  # when a forming gang's grace ends: a pass is due then
        self.planner = Planner(settings.planner)  # keeps its node index between passes
        self.node_models: dict[str, tuple[str, Node]] = {}  # name -> (resourceVersion, Node)
        self.changed_nodes: set[str] = set()
        self.semaphore = asyncio.Semaphore(settings.release_concurrency)
        self.timings: dict[str, float] = {}  # where the last pass's time went
        self.lap_started = 0.0
        self.patches = 0  # releases made by this process (for the test hook)

    def wake(self) -> None:
        self.dirty.set()

    async def run(self) -> None:
        """Act while this replica leads: resume from what the API shows, then plan on every change
        (and at least every `resync_seconds`)."""
        await self.bound.synced.wait()
        await self.store.nodes_synced.wait()
        self.resume()
        while True:
            wait = self.settings.resync_seconds
            for due in (self.next_backoff_end, self.next_forming_due):
                if due:
                    wait = max(0.05, min(wait, due - time.time()))
            if due := self.records.pacing.next_due:  # a gang's status write was deferred
                wait = max(0.05, min(wait, due - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.dirty.wait(), wait)
            self.dirty.clear()
            started = time.monotonic()
            try:
                await self.step()
                took = time.monotonic() - started
                if took > SLOW_PASS_SECONDS:
                    log.info("slow pass: %.2fs (%s)", took, self.timings)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduling pass failed; next pass in %.0fs", self.settings.resync_seconds)

    def resume(self) -> None:
        """Start leading from the API's state, not from this replica's memory: statuses are
        written afresh, and pods released (by any leader) but not bound yet keep their nodes
        reserved — read from the decisions recorded on the Gang objects."""
        self.records.resume()
        self.reserved.clear()
        self.planner = Planner(self.settings.planner)  # a full first pass
        for gang in self.store.gangs.values():
            for entry in ((gang.get("status") or {}).get("admission") or {}).get("placement") or []:
                pod = self.store.pods.get(entry.get("uid", ""))
                if pod is None or is_gated(pod) or entry["uid"] in self.bound.pods:
                    continue
                if (pod.get("spec") or {}).get("nodeName"):
                    continue
                self.reserve(entry["uid"], entry["node"], pod_requests(pod))
        log.info(
            "leading: %d gangs known, %d released pods not bound yet kept reserved",
            len(self.store.gangs),
            len(self.reserved),
        )

    # -- one pass ------------------------------------------------------------------------

    def reserve(self, uid: str, node: str, requests: dict[str, int]) -> None:
        self.reserved[uid] = (node, requests)
        self.changed_nodes.add(node)

    def used(self) -> dict[str, dict[str, int]]:
        """Bound pods plus reservations. A reservation ends only when the bound-pod index shows
        that pod bound (or the pod is gone): the pod's release patch is seen before its binding, and
        in between its capacity would be counted nowhere."""
        for uid in [u for u in self.reserved if u in self.bound.pods or u not in self.store.pods]:
            self.changed_nodes.add(self.reserved.pop(uid)[0])
        used = dict(self.bound.used)  # read only: the planner never changes what it is given
        for node, requests in self.reserved.values():
            used[node] = add(used.get(node, {}), requests)
        return used

    def nodes(self) -> dict[str, Node]:
        """The planner's Node of every node, converted again only when its object changed."""
        models = {}
        for name, obj in self.store.nodes.items():
            version = obj["metadata"].get("resourceVersion", "")
            cached = self.node_models.get(name)
            if cached is None or cached[0] != version:
                cached = (version, node_from_api(obj))
                self.changed_nodes.add(name)
            models[name] = cached
        self.changed_nodes.update(n for n in self.node_models if n not in models)
        self.node_models = models
        return {name: model for name, (_, model) in models.items()}

    def changed(self) -> set[str] | None:
        """Nodes whose usage or object changed since the last pass (None: compare all)."""
        bound = self.bound.take_dirty()
        changed, self.changed_nodes = self.changed_nodes, set()
        return None if bound is None else changed | bound

    async def release_orphans(self) -> None:
        for pod, (reason, message) in orphans(self.store):
            uid = pod["metadata"]["uid"]
            if uid in self.told_dropped:
                continue
            self.told_dropped.add(uid)
            if await writes.release_pod(self.api, pod, None):
                await writes.post_event(
                    self.api, {"apiVersion": "v1", "kind": "Pod", **pod}, reason, message, warning=True
                )

    def crash_hook(self, released: bool) -> None:
        """Tests only (QUORUM_OPERATOR_TEST_CRASH_AFTER=k): die by SIGKILL right after the k-th
        pod release, to show that a restarted operator finishes the gang on its recorded plan."""
        if released and self.settings.crash_after:
            self.patches += 1
            if self.patches >= self.settings.crash_after:
                log.warning("test hook: SIGKILL after %d releases", self.patches)
                os.kill(os.getpid(), signal.SIGKILL)

    async def continue_releases(self) -> None:
        """Finish releases a previous leader started: a gang whose recorded decision has released
        some pods but not all gets the rest on the nodes recorded for them (no new plan, so the
        capacity it was promised is what it gets)."""
        for key, gang in list(self.store.gangs.items()):
            placement = ((gang.get("status") or {}).get("admission") or {}).get("placement") or []
            pods = [self.store.pods.get(entry["uid"]) for entry in placement]
            present = [(e, p) for e, p in zip(placement, pods, strict=True) if p is not None]
            pending = [(e, p) for e, p in present if is_gated(p) and e["uid"] not in self.reserved]
            if not pending or len(pending) == len(present):
                continue  # nothing started, or nothing left: the planner decides as usual
            done = 0
            for entry, pod in pending:
                if await writes.release_pod(self.api, pod, entry["node"]):
                    self.reserve(entry["uid"], entry["node"], pod_requests(pod))
                    done += 1
            log.info(
                "%s/%s: finished a release begun earlier: %d more pods onto their recorded nodes",
                key[0],
                key[1],
                done,
            )
            await writes.post_event(
                self.api,
                gang,
                "Released",
                f"finished the recorded release: {done} more pods onto their planned nodes",
            )

    def lap(self, what: str) -> None:
        now = time.monotonic()
        self.timings[what] = round(now - self.lap_started, 3)
        self.lap_started = now

    async def step(self) -> None:
        self.timings = {}
        self.lap_started = time.monotonic()
        await self.release_orphans()
        await self.continue_releases()
        now = time.time()
        views = assemble(self.store, frozenset(self.reserved))
        self.lap("assemble")
        for view in views:
            await self.recoverer.check(view, self.store.gangs.get(view.key), now)
        self.lap("recover")
        live = {v.key for v in views}
        for key, gang in list(self.store.gangs.items()):
            if key not in live and recovery_of(gang).get("suspendedJobs"):
                await self.recoverer.resume_jobs(key[0], key[1], [], gang)  # its pods are all gone
            if key not in live and recovery_of(gang).get("failures"):
                await self.records.write_recovering(key, gang)
        # From here to the plan, no await: the usage snapshot (`used`) and the nodes it changed
        # (`changed()`) must be taken together, or a node that changes in between is synced into
        # the planner's index with stale usage and never again. Views again: `used()` ended the
        # reservations of pods now bound or gone.
        used = self.used()
        views = assemble(self.store, frozenset(self.reserved))
        nodes = self.nodes()
        plannable: dict[tuple[str, str], GangView] = {}
        holds: dict[tuple[str, str], Hold] = {}
        self.next_backoff_end = 0.0
        for view in views:
            if view.waiting is not None or view.min_member is None or not view.releasable:
                admitted = view.min_member is not None and view.counts()["released"] >= view.min_member
                if view.gated and view.waiting is None and not admitted:
                    blocked = view.blocked() or ""
                    holds[view.key] = Hold(view.to_core(), "WaitingForOtherGates", blocked)
                continue
            until = backoff_until(self.store.gangs.get(view.key))
            if until > now:
                message = backoff_message(self.store.gangs.get(view.key), now)
                holds[view.key] = Hold(view.to_core(), "Backoff", message)
                self.next_backoff_end = min(self.next_backoff_end or until, until)
                continue
            plannable[view.key] = view
        queue = [v.to_core(held_since=self.records.held_since(k)) for k, v in plannable.items()]
        self.lap("snapshot")
        plan = self.planner.plan(nodes, used, queue, now, changed=self.changed())
        self.lap("plan")
        # Gangs are independent of each other: their writes go concurrently (bounded), so a pass
        # costs a few round trips, not a few per gang.
        done = await bounded(
            (self.release(plannable[r.gang.key], r) for r in plan.releases), self.settings.gang_concurrency
        )
        released = Counter({r.gang.key: n for r, n in zip(plan.releases, done, strict=True)})
        self.lap(f"release {len(plan.releases)} gangs")
        for hold in plan.holds:
            holds[hold.gang.key] = await self.explain_hold(plannable[hold.gang.key], hold)
        for view in views:
            self.last_seen[view.key] = time.monotonic()
        forming = self.forming({v.key for v in views}, holds, now)
        self.records.pacing.start_pass()
        await bounded(
            (self.records.write(v, holds.get(v.key), released[v.key]) for v in views if v.key not in forming),
            self.settings.gang_concurrency,
        )
        self.lap(f"status of {len(views)} gangs")
        await self.forget_label_gangs({v.key for v in views})

    def forming(
        self, live: set[tuple[str, str]], holds: dict[tuple[str, str], Hold], now: float
    ) -> set[tuple[str, str]]:
        """Gangs short of members, first seen less than the grace ago, with nothing written yet:
        their writes wait (a pass is due when the first grace ends)."""
        self.first_seen = {k: self.first_seen.get(k, now) for k in live}
        grace = self.settings.forming_grace_seconds
        forming = {
            key
            for key in live
            if (hold := holds.get(key)) is not None
            and hold.reason == "WaitingForMembers"
            and key not in self.store.gangs
            and now - self.first_seen[key] < grace
        }
        self.next_forming_due = min((self.first_seen[k] + grace for k in forming), default=0.0)
        return forming

    async def explain_hold(self, view: GangView, hold: Hold) -> Hold:
        """Add what the planner cannot see: pods held by others' gates too, and a StatefulSet
        whose OrderedReady policy means the gang can never form (DESIGN.md: say it again in the
        Gang's status)."""
        if blocked := view.blocked():
            # The members exist but some are held by another gate: that is what it waits for.
            waits_for_gates = hold.reason == "WaitingForMembers" and hold.gang.members >= hold.gang.min_member
            reason = "WaitingForOtherGates" if waits_for_gates else hold.reason
            hold = Hold(hold.gang, reason, f"{hold.message}; {blocked}", hold.held_nodes, hold.held_message)
        if hold.reason != "WaitingForMembers" or (view.min_member or 1) <= 1:
            return hold
        for pod in view.pods:
            for owner in pod["metadata"].get("ownerReferences") or []:
                if owner.get("kind") != "StatefulSet" or not owner.get("controller"):
                    continue
                if owner["uid"] not in self.statefulsets:
                    self.statefulsets[owner["uid"]] = await reads.statefulset_pod_management(
                        self.api, view.namespace, owner["name"]
                    )
                if self.statefulsets[owner["uid"]] == "OrderedReady":
                    hint = (
                        f"StatefulSet {owner['name']} uses podManagementPolicy OrderedReady: it creates "
                        f"each pod only after the previous one is Ready, and quorum holds every pod until "
                        f"the gang is whole, so the gang cannot form. Set podManagementPolicy: Parallel"
                    )
                    return Hold(hold.gang, hold.reason, f"{hold.message}; {hint}")
        return hold

    async def release(self, view: GangView, release: Release) -> int:
        gang = await self.records.ensure_gang(view)
        pods = {p["metadata"]["uid"]: p for p in view.gated}
        attempt = int(((gang.get("status") or {}).get("admission") or {}).get("attempt") or 0) + 1
        placement = [{"pod": pod.name, "uid": pod.uid, "node": node.name} for pod, node in release.placement]
        # The decision first: a restarted operator continues this plan instead of making another.
        admission = {"attempt": attempt, "time": writes.now(), "placement": placement}
        recorded = await self.records.record_release(view, gang, admission, len(placement))

        async def one(pod_uid: str, node: Node) -> bool:
            async with self.semaphore:
                ok = await writes.release_pod(self.api, pods[pod_uid], node.name)
                self.crash_hook(ok)
                return ok

        # The group's status (it says the gang is being scheduled) beside the pods' releases.
        _, results = await asyncio.gather(
            self.records.write_group_released(view, recorded),
            asyncio.gather(*(one(p.uid, n) for p, n in release.placement)),
        )
        done = 0
        for (pod, node), ok in zip(release.placement, results, strict=True):
            if ok:
                self.reserve(pod.uid, node.name, dict(pod.requests))
                done += 1
        spread = Counter(n.name for (_, n), ok in zip(release.placement, results, strict=True) if ok)
        nodes = "node" if len(spread) == 1 else "nodes"
        message = (
            f"released {done} of {len(release.placement)} planned pods onto {len(spread)} {nodes}: "
            + ", ".join(f"{n} ×{c}" for n, c in sorted(spread.items()))
        )
        log.info("%s/%s: %s", view.namespace, view.name, message)
        await asyncio.gather(
            *(writes.post_event(self.api, obj, "Released", message) for obj in (gang, view.group) if obj)
        )
        self.records.reasons.pop(view.key, None)
        return done

    async def forget_label_gangs(self, live: set[tuple[str, str]]) -> None:
        """Label-only gangs have no owner: delete their Gang once no pod has been left for the
        retention time (so a recovery that deletes every pod keeps the gang's state)."""
        now = time.monotonic()
        for key, gang in list(self.store.gangs.items()):
            if key in live or (gang.get("spec") or {}).get("source", {}).get("kind") != "Labels":
                continue
            seen = self.last_seen.setdefault(key, now)
            if now - seen > self.settings.label_gang_retention_seconds:
                await writes.delete_gang(self.api, *key)
                self.store.gangs.pop(key, None)
                self.records.forget(key)
