"""Releasing: a gang's pods freed from quorum's gate onto the nodes its plan chose.

A release is reserved in the ledger the moment it is decided, recorded on the Gang
(`status.admission`) before any pod is touched, and then made one conditional patch per pod in
the gang's own task. A release cut off (a patch failed, a leader died) is finished on the
recorded nodes for the pods that still fit there; the others are planned anew. Nothing here
deletes or recovers anything (that is `recovery.py`, by docs/lifecycle.md's rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Container
from dataclasses import dataclass, replace

from quorum.core.devices import Assignment, DeviceKey
from quorum.core.fit import FitSettings, why_not
from quorum.core.model import Gang, Node, Toleration, fits, subtract
from quorum.core.planner import Release
from quorum.core.record import Admission, GangRecord, Placement
from quorum.k8s.api import KubeApi
from quorum.k8s.convert import pod_claims, pod_from_api, pod_requests, timestamp
from quorum.k8s.devices import DeviceObjects, allocated_node, allocation_status
from quorum.k8s.usage import BoundPods
from quorum.k8s.writes import RESERVED_TAINT
from quorum.operator import clock, metrics
from quorum.operator.events import pod_object
from quorum.operator.gangs import GROUP_APIS, JSON, GangView, Store, Unclaimed, is_gated, orphans
from quorum.operator.ledger import Ledger, placed_node, recorded_placement
from quorum.operator.status import GangRecords, now_rfc3339
from quorum.operator.work import GangWork, describe

log = logging.getLogger("quorum.operator")
GangKey = tuple[str, str]
ORPHANS: GangKey = ("", "pods without a group")  # the work key of releasing orphaned pods
UNCLAIMED: GangKey = ("", "pods of another scheduler")  # the work key of telling about them
UNCLAIMED_PER_PASS = 64  # pods told about per pass: Events are writes too


class FairSlots:
    """At most `limit` holders at once; a slot that frees goes to the gangs that wait in turn,
    not to whoever asked first. A gang alone may use every slot, but one of 4,096 pods, whose
    patches queue at once, does not hold the release of a gang decided after it behind them all
    (at 5,000 nodes a plain semaphore held such releases past their time limit)."""

    def __init__(self, limit: int) -> None:
        self.free = limit
        self.waiting: OrderedDict[GangKey, deque[asyncio.Future[None]]] = OrderedDict()

    @contextlib.asynccontextmanager
    async def slot(self, key: GangKey) -> AsyncIterator[None]:
        await self.acquire(key)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, key: GangKey) -> None:
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(key, deque()).append(handed)
        try:
            await handed
        except asyncio.CancelledError:
            if handed.done() and not handed.cancelled():
                self.release()  # handed a slot as it was cancelled: pass it on
            else:
                queue = self.waiting.get(key)
                if queue is not None and handed in queue:
                    queue.remove(handed)
                    if not queue:
                        del self.waiting[key]
            raise

    def release(self) -> None:
        while self.waiting:
            key, queue = next(iter(self.waiting.items()))
            handed = queue.popleft()
            if queue:
                self.waiting.move_to_end(key)  # the next slot to the next gang
            else:
                del self.waiting[key]
            if not handed.done():
                handed.set_result(None)
                return
        self.free += 1


@dataclass(frozen=True)
class ReleaseSettings:
    fit: FitSettings
    release_concurrency: int  # pod patches in flight at once, shared fairly among gangs (`FairSlots`)
    gang_timeout_seconds: float  # a gang's release task is cut off after this (grows with its pods)


class Releaser:
    def __init__(
        self,
        api: KubeApi,
        records: GangRecords,
        bound: BoundPods,
        ledger: Ledger,
        work: GangWork,
        tokens: Callable[[], dict[GangKey, str]],
        recovered_already: Callable[[GangKey, GangRecord], bool],
        fail: Callable[[GangKey, str, str], None],
        settings: ReleaseSettings,
        devices: DeviceObjects | None = None,
    ) -> None:
        self.api = api
        self.devices = devices or DeviceObjects()  # DRA objects as the watches show them
        self.records = records
        self.store: Store = records.store
        self.bound = bound
        self.ledger = ledger
        self.work = work
        self.tokens = tokens  # the reservation token of each gang that preempts
        self.recovered_already = recovered_already
        self.fail = fail
        self.settings = settings
        self.pod_patches = FairSlots(settings.release_concurrency)
        # Per gang (`GangMemory.unfinished`): pods of a recorded release still to be released
        # onto their recorded nodes: their patch failed, or a leader before this one began it.
        self.memory = records.memory
        self.resumed: set[GangKey] = set()  # gangs whose recorded release a new leader checks
        self.told_dropped: set[str] = set()  # pods released because their group was dropped
        # Pods (by uid) and groups (namespace, describe()) told they are left to another scheduler.
        self.told_unclaimed: set[str] = set()
        self.told_unclaimed_groups: set[tuple[str, str]] = set()

    def resume(self) -> None:
        for _, entry in self.memory.items():
            entry.unfinished = {}
        self.resumed = {key for key, gang in self.store.gangs.items() if recorded_placement(gang)}

    def prune(self) -> None:
        if self.told_dropped:
            self.told_dropped = {uid for uid in self.told_dropped if uid in self.store.pods}
        if self.told_unclaimed:
            self.told_unclaimed = {uid for uid in self.told_unclaimed if uid in self.store.unclaimed}
            groups = {(u.namespace, u.marker.describe()) for u in self.store.unclaimed.values()}
            self.told_unclaimed_groups &= groups

    def start(self, view: GangView, release: Release, devices: Assignment | None = None) -> None:
        """Reserve the release's room now (no later pass may plan it), with the DRA devices
        chosen for its pods' claims, then release in the gang's task (its time limit grows with
        the pods it patches)."""
        devices = devices or {}
        for pod, node in release.placement:
            chosen = tuple(key for keys in devices.get(pod.uid, {}).values() for key in keys)
            self.ledger.reserve(view.key, pod.uid, node.name, pod.requests, chosen)
        pods = len(release.placement)
        timeout = self.settings.gang_timeout_seconds * (1 + pods / self.settings.release_concurrency)
        if not self.work.start(view.key, "release", self.release(view, release, devices), timeout):
            for pod, _ in release.placement:  # cannot happen (busy gangs are not planned): undo
                self.ledger.drop(pod.uid)

    async def release(self, view: GangView, release: Release, devices: Assignment | None = None) -> None:
        placement = [(pod.uid, node.name) for pod, node in release.placement]
        try:
            gang = await self.records.ensure_gang(view)
            attempt = GangRecord.of(self.records.gang(view.key) or gang).attempt + 1
            entries = [Placement(pod.name, pod.uid, node.name) for pod, node in release.placement]
            # The decision first: a restarted operator continues this plan instead of making another.
            admission = decision(attempt, now_rfc3339(), entries)
            await self.records.record_release(view, gang, admission, len(entries))
        except BaseException:
            for uid, _ in placement:  # not recorded: nothing was promised
                self.ledger.drop(uid)
            raise
        complete_at = self.memory[view.key].complete_at = member_complete_time(view)
        metrics.RELEASE_LATENCY.observe(max(0.0, clock.time() - complete_at))
        pods = {p["metadata"]["uid"]: p for p in view.gated}
        results, error = await self.release_pods(
            view.key, [(pods[uid], node) for uid, node in placement if uid in pods], devices
        )
        await self.tell_released(view, gang, results)
        if error is not None:
            raise error

    async def release_pods(
        self, key: GangKey, pods: list[tuple[JSON, str]], devices: Assignment | None = None
    ) -> tuple[list[tuple[str, bool]], BaseException | None]:
        """One conditional patch per pod, after its DRA claims are allocated to the devices the
        plan chose (a pod whose claim could not be allocated is not released: it is planned
        anew); (node, released?) per pod, and the first error, for
        the gang's task to raise once it has told what was done. A failing patch does not stop
        the others. A pod whose patch raised stays reserved and is kept as unfinished (the
        release is finished on its recorded node after the gang's backoff); one the apiserver
        refused (gone, changed, released already) is final, and its reservation follows the pod
        as the apiserver has it now (`keep_room_of_refused`)."""

        tolerate = self.tokens().get(key)

        # The claims first, all of them: a pod is released only once every claim it names is
        # allocated (a claim its gang's pods share is allocated by the first of them).
        allocated: set[str] = set()  # claims allocated here, by name

        async def allocate(pod: JSON, node: str) -> bool:
            chosen = (devices or {}).get(pod["metadata"]["uid"])
            if not chosen:
                return True
            async with self.pod_patches.slot(key):
                return await self.allocate_claims(pod, node, chosen, allocated)

        firsts = await asyncio.gather(*(allocate(pod, node) for pod, node in pods), return_exceptions=True)
        if not all(first is True for first in firsts):
            # A claim not allocated: none of this release's pods goes (they stay gated and are
            # planned anew; a claim allocated already pins its pod to its devices' node).
            problem = next((f for f in firsts if isinstance(f, BaseException)), None)
            firsts = [problem if isinstance(problem, BaseException) else False for _ in firsts]

        async def one(pod: JSON, node: str, first: bool | BaseException) -> bool:
            if isinstance(first, BaseException):
                raise first
            if not first or not self.claims_allocated(pod, allocated):
                return False  # stays gated: planned anew
            async with self.pod_patches.slot(key):
                return await self.api.release_pod(pod, node, tolerate)

        results = await asyncio.gather(
            *(one(pod, node, first) for (pod, node), first in zip(pods, firsts, strict=True)),
            return_exceptions=True,
        )
        unfinished = self.memory[key].unfinished
        error: BaseException | None = None
        refused: dict[str, str] = {}
        for (pod, node), result in zip(pods, results, strict=True):
            uid = pod["metadata"]["uid"]
            if isinstance(result, BaseException):
                unfinished[uid] = node
                error = error or result
            else:
                unfinished.pop(uid, None)
                if not result:
                    refused[uid] = node
        if refused:
            try:
                await self.keep_room_of_refused(key, list(refused))
            except Exception as err:  # their reservations stay; the release is tried again
                unfinished.update(refused)
                error = error or err
        done = [(node, r is True) for (_, node), r in zip(pods, results, strict=True)]
        metrics.PODS_RELEASED.inc(sum(1 for _, ok in done if ok))
        return done, error

    async def allocate_claims(
        self,
        pod: JSON,
        node: str,
        chosen: dict[tuple[str, str], tuple[DeviceKey, ...]],
        allocated: set[str],
    ) -> bool:
        """Allocate each claim of the pod to the devices chosen for it (by its entry in the
        pod's `spec.resourceClaims`), as the watch shows the claim; False if one is not there
        or the apiserver refused it (the pod then stays gated and is planned anew: a claim
        allocated already pins it to that claim's node)."""
        namespace = pod["metadata"]["namespace"]
        entries = {c.name: c for c in pod_claims(pod)}
        per_claim: dict[str, dict[str, tuple[DeviceKey, ...]]] = {}
        for (entry, request), keys in chosen.items():
            per_claim.setdefault(entry, {})[request] = keys
        stamp = now_rfc3339()
        classes = {c["metadata"]["name"]: c for _, _, c in self.devices.classes.items.values()}
        for entry, requests in sorted(per_claim.items()):
            if not entry:
                continue  # an extended resource's devices: kube-scheduler makes its claim
            found = entries.get(entry)
            name = found and (found.claim or found.made)
            claim = self.devices.claims.get(namespace, name) if name else None
            if claim is None:
                return False
            if (claim.get("status") or {}).get("allocation") is not None:
                if allocated_node(claim) not in (None, node):
                    return False  # allocated by someone else elsewhere: its pin plans it anew
                allocated.add(claim["metadata"]["name"])
                continue  # allocated already (an earlier attempt of this release)
            status = allocation_status(claim, classes, requests, node, pod, stamp)
            if not await self.api.allocate_claim(claim, status):
                return False
            allocated.add(claim["metadata"]["name"])
            self.devices.assume(key for keys in requests.values() for key in keys)
        return True

    def claims_allocated(self, pod: JSON, allocated: Container[str] = ()) -> bool:
        """Whether every claim the pod names is allocated: by this release (`allocated`, by
        name), or as the watch shows it."""
        namespace = pod["metadata"]["namespace"]
        for entry in pod_claims(pod):
            name = entry.claim or entry.made
            if name in allocated:
                continue
            claim = self.devices.claims.get(namespace, name) if name else None
            if claim is None or (claim.get("status") or {}).get("allocation") is None:
                return False
        return True

    async def keep_room_of_refused(self, key: GangKey, uids: list[str]) -> None:
        """The reservations of pods whose release the apiserver refused, from the pods as it has
        them now (the watch may be behind): a pod released already (by an earlier leader term,
        or a patch whose answer was lost) keeps the room of the node it is bound or pinned to
        until the bound-pod index shows it there; one gone, finished or still gated (planned
        anew) holds none."""
        pods = await self.api.read_gang_pods(key[0], *self.store.labels_of(key))
        now = {p["metadata"]["uid"]: p for p in pods}
        for uid in uids:
            pod = now.get(uid)
            node = placed_node(pod) if pod is not None else None
            if pod is not None and node is not None:
                self.ledger.reserve_pod(key, pod, node)  # ended by `Ledger.settle` once the index has it
            else:
                self.ledger.drop(uid)

    async def tell_released(self, view: GangView, gang: JSON, results: list[tuple[str, bool]]) -> None:
        spread = Counter(node for node, ok in results if ok)
        done = sum(spread.values())
        nodes = "node" if len(spread) == 1 else "nodes"
        message = f"released {done} of {len(results)} planned pods onto {len(spread)} {nodes}: " + ", ".join(
            f"{n} ×{c}" for n, c in sorted(spread.items())
        )
        log.info("%s/%s: %s", view.namespace, view.name, message)
        metrics.RELEASES.inc()
        self.memory[view.key].reason = None  # its next hold is announced again
        # One Event per release: on the group object, where its owner looks (on the Gang for a
        # gang of labels only); `kubectl quorum explain` shows both objects' Events.
        await self.records.events.post(view.group or gang, "Released", message)

    def start_continued(self, views: dict[GangKey, GangView], nodes: dict[str, Node], now: float) -> None:
        """Finish releases begun earlier, on the nodes recorded for them (no new plan, so the
        capacity the gang was promised is what it gets): pods whose patch failed in this
        process, and, once after a restart, the still gated pods of a recorded release that had
        begun (some of its pods released). Those are checked for room on their recorded nodes
        first; those that no longer fit there are planned anew, like any gated pod (the gang's
        running pods stay: only the timeout, `recovery.py`, ever recovers a gang). A release not
        finished within the gang's scheduleTimeoutSeconds is given up: its gated pods are
        planned anew."""
        tokens = self.tokens()
        for key in sorted(self.resumed):
            self.resumed.discard(key)
            view, gang = views.get(key), self.records.gang(key)
            if view is None or gang is None or self.recovered_already(key, GangRecord.of(gang)):
                continue
            try:
                placement = recorded_placement(gang)
                pods = {p["metadata"]["uid"]: p for p in view.active}
                present = [(e, pods[e.uid]) for e in placement if e.uid in pods]
                pending = [(e, p) for e, p in present if is_gated(p)]
                if not pending or len(pending) == len(present):
                    continue  # nothing left, or nothing started: the planner decides as usual
                if not all(self.claims_allocated(p) for _, p in pending):
                    continue  # a claim not allocated: the planner decides, for all of them
                fitting = self.room_for(key, pending, nodes, tokens.get(key))
            except Exception as err:
                self.fail(key, "release", describe(err))
                continue
            if len(fitting) < len(pending):
                log.info(
                    "%s/%s: %d pods of the recorded release no longer fit their planned nodes: planned anew",
                    *key,
                    len(pending) - len(fitting),
                )
            if fitting:
                self.memory[key].unfinished = {e.uid: e.node for e, _ in pending if e.uid in fitting}
        for key, entry in self.memory.items():
            uids = entry.unfinished
            if not uids:
                continue
            view, gang = views.get(key), self.records.gang(key)
            if self.work.blocks_planning(key) or self.work.backing_off(key):
                continue
            to_release = [
                (p, uids[uid])
                for p in (view.active if view else [])
                if (uid := p["metadata"]["uid"]) in uids and is_gated(p)
            ]
            late = gang is not None and self.records.since_decision(key, GangRecord.of(gang).attempt) > (
                view.schedule_timeout if view is not None else 0
            )
            if view is None or gang is None or not to_release or late:
                for uid in uids:  # gone, released meanwhile, or too late: planned anew if still gated
                    self.ledger.drop(uid)
                entry.unfinished = {}
                continue
            if not all(self.claims_allocated(p) for p, _ in to_release):
                # A claim not allocated: the gang's devices come from a new plan, its pods with
                # it (one whose claim is allocated is pinned there by it): none goes on its own.
                for uid in uids:
                    self.ledger.drop(uid)
                entry.unfinished = {}
                continue
            self.work.start(key, "release", self.continue_release(view, gang, to_release))

    def room_for(
        self, key: GangKey, pending: list[tuple[Placement, JSON]], nodes: dict[str, Node], token: str | None
    ) -> set[str]:
        """Reserve the recorded node of each `pending` pod that still fits there now (with the
        toleration of its gang's reservation, if the gang preempts); the uids reserved."""
        used = self.ledger.usage(self.bound.used)
        taken: dict[str, dict[str, int]] = {}
        fit_settings = self.settings.fit
        reserved: set[str] = set()
        for entry, pod in pending:
            node = nodes.get(entry.node)
            if node is None:
                continue
            model = pod_from_api(pod)
            if token is not None:
                model = replace(model, tolerations=(*model.tolerations, reservation_toleration(token)))
            room = taken.get(node.name) or subtract(node.allocatable, used.get(node.name, {}))
            if why_not(model, node, fit_settings) or not fits(model.requests, room):
                continue
            taken[node.name] = subtract(room, model.requests)
            self.ledger.reserve(key, entry.uid, entry.node, pod_requests(pod))
            reserved.add(entry.uid)
        return reserved

    async def continue_release(self, view: GangView, gang: JSON, pending: list[tuple[JSON, str]]) -> None:
        results, error = await self.release_pods(view.key, pending)
        done = sum(1 for _, ok in results if ok)
        log.info(
            "%s/%s: finished a release begun earlier: %d more pods onto their recorded nodes", *view.key, done
        )
        if done:
            message = f"finished the recorded release: {done} more pods onto their planned nodes"
            await self.records.events.post(gang, "Released", message)
        if error is not None:
            raise error

    def start_orphans(self) -> None:
        found = [
            (pod, why) for pod, why in orphans(self.store) if pod["metadata"]["uid"] not in self.told_dropped
        ]
        if found and not self.work.busy(ORPHANS) and not self.work.backing_off(ORPHANS):
            self.work.start(ORPHANS, "release", self.release_orphans(found))

    def tell_unclaimed(self) -> None:
        """One Event on each pod with a group marker that asks for a scheduler quorum does not
        take, and one on its group object: quorum leaves it to that scheduler (where none runs,
        it stays Pending; the Event says which setting takes it)."""
        found = [p for uid, p in self.store.unclaimed.items() if uid not in self.told_unclaimed]
        if found and not self.work.busy(UNCLAIMED) and not self.work.backing_off(UNCLAIMED):
            self.work.start(UNCLAIMED, "tell", self.post_unclaimed(found[:UNCLAIMED_PER_PASS]))

    async def post_unclaimed(self, found: list[Unclaimed]) -> None:
        for pod in found:
            marker = pod.marker
            message = (
                f"this pod names {marker.describe()} but asks for scheduler {pod.scheduler!r}, which quorum "
                f"does not take: quorum leaves its gang to that scheduler. If no such scheduler runs in "
                f"this cluster, the pod stays Pending: have the platform add {pod.scheduler!r} to quorum's "
                f"coscheduler names (chart value schedulers.coschedulerNames; schedulers.volcano for "
                f"Volcano's dialect), or remove schedulerName from the pod's template"
            )
            await self.records.events.post(pod.pod, "SchedulerNotQuorums", message)
            self.told_unclaimed.add(pod.uid)
            group_key = (pod.namespace, marker.describe())
            if marker.source in GROUP_APIS and group_key not in self.told_unclaimed_groups:
                self.told_unclaimed_groups.add(group_key)
                api_group, _ = GROUP_APIS[marker.source]
                group = self.store.groups.get((api_group, pod.namespace, marker.group))
                await self.records.events.post(group, "SchedulerNotQuorums", message)

    async def release_orphans(self, found: list[tuple[JSON, tuple[str, str]]]) -> None:
        first_error: BaseException | None = None
        for pod, (reason, message) in found:
            try:
                if await self.api.release_pod(pod, None):
                    await self.records.events.post(pod_object(pod), reason, message, warning=True)
                    self.told_dropped.add(pod["metadata"]["uid"])
            except Exception as err:
                first_error = first_error or err
        if first_error is not None:
            raise first_error


# A decision whose placement would take more than this is recorded without it (etcd takes at most
# 1.5 MiB per object; a gang of 16,000 pods with long names took more, and could never be released).
PLACEMENT_BYTES = 512 * 1024


def decision(attempt: int, time: str, entries: list[Placement]) -> Admission:
    """A release's record (`status.admission`): its attempt, time and placement (pod, uid, node
    per pod), or, for a gang whose placement would not fit in a Gang object, only how many pods
    it releases. Without a placement a new leader finishes nothing on recorded nodes: the pods
    released keep their room by their own pin (`Ledger.resume`), and those still gated are
    planned anew."""
    size = sum(len(e.pod) + len(e.uid) + len(e.node) + 32 for e in entries)
    if size > PLACEMENT_BYTES:
        return Admission(attempt, time, pods=len(entries))
    return Admission.placing(attempt, time, tuple(entries))


def tolerating(gang: Gang, token: str) -> Gang:
    """The gang as the planner sees it while nodes are reserved for it: its pods tolerate the
    reservation's taint (their release adds the toleration)."""
    toleration = reservation_toleration(token)
    return replace(gang, pods=tuple(replace(p, tolerations=(*p.tolerations, toleration)) for p in gang.pods))


def reservation_toleration(token: str) -> Toleration:
    return Toleration(RESERVED_TAINT, "Equal", token, "NoSchedule")


def member_complete_time(view: GangView) -> float:
    """When the gang had its minMember-th member (the latest creation among the first
    minMember pods): from then on it waited only for quorum."""
    created = sorted(timestamp(p["metadata"].get("creationTimestamp")) for p in view.pods)
    if not created:
        return clock.time()
    return created[min(len(created), max(1, view.min_member or 1)) - 1]
