"""The scheduling loop: quorum's own asyncio task (not a kopf handler).

Each pass takes a snapshot (gang pods, nodes and groups from the kopf watches; usage from the
bound-pod watch; reservations of pods released but not yet bound), plans, releases what fits —
decision recorded on the Gang object first, then one conditional patch per pod — and writes the
status of every gang and its group when it changed. Events: one per gang when it is released,
and one when the reason it is held changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

from quorum.core.fit import FitSettings
from quorum.core.model import Node, add
from quorum.core.planner import Hold, PlannerSettings, Release, plan_gangs
from quorum.k8s import reads, writes
from quorum.k8s.convert import node_from_api, pod_from_api, pod_requests
from quorum.k8s.usage import BoundPods
from quorum.operator.gangs import (
    GROUP_APIS,
    GangView,
    Store,
    admitted_condition,
    assemble,
    is_gated,
    orphans,
    phase,
)

log = logging.getLogger("quorum.operator")


@dataclass(frozen=True)
class LoopSettings:
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    resync_seconds: float = 5.0  # a pass at least this often, even without events
    release_concurrency: int = 32  # pod patches in flight at once
    label_gang_retention_seconds: float = 300.0  # label-only Gang objects outlive their pods this long
    crash_after: int = 0  # tests only: SIGKILL this process after that many pod releases


def fit_settings(org: str | None) -> PlannerSettings:
    return PlannerSettings(fit=FitSettings(org=org))


class GangLoop:
    def __init__(self, api: client.ApiClient, store: Store, bound: BoundPods, settings: LoopSettings) -> None:
        self.api = api
        self.store = store
        self.bound = bound
        self.settings = settings
        self.dirty = asyncio.Event()
        self.reserved: dict[str, tuple[str, dict[str, int]]] = {}  # uid -> (node, requests)
        self.written: dict[tuple[str, str], dict[str, Any]] = {}  # last status written per gang
        self.reasons: dict[tuple[str, str], str] = {}  # last hold reason announced per gang
        self.told_waiting: set[str] = set()  # pods told which group they wait for
        self.last_seen: dict[tuple[str, str], float] = {}
        self.warned_unmodeled: set[tuple[str, str]] = set()
        self.statefulsets: dict[str, str | None] = {}  # uid -> podManagementPolicy
        self.transitions: dict[tuple[tuple[str, str], str], tuple[str, str]] = {}  # -> (status, time)
        self.semaphore = asyncio.Semaphore(settings.release_concurrency)
        self.patches = 0  # releases made by this process (for the test hook)

    def wake(self) -> None:
        self.dirty.set()

    async def run(self) -> None:
        """Act while this replica leads: resume from what the API shows, then plan on every change
        (and at least every `resync_seconds`)."""
        await self.bound.synced.wait()
        self.resume()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.dirty.wait(), self.settings.resync_seconds)
            self.dirty.clear()
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduling pass failed; next pass in %.0fs", self.settings.resync_seconds)

    def resume(self) -> None:
        """Start leading from the API's state, not from this replica's memory: statuses are
        written afresh, and pods released (by any leader) but not bound yet keep their nodes
        reserved — read from the decisions recorded on the Gang objects."""
        self.written.clear()
        self.reasons.clear()
        self.reserved.clear()
        for gang in self.store.gangs.values():
            for entry in ((gang.get("status") or {}).get("admission") or {}).get("placement") or []:
                pod = self.store.pods.get(entry.get("uid", ""))
                if pod is None or is_gated(pod) or entry["uid"] in self.bound.pods:
                    continue
                if (pod.get("spec") or {}).get("nodeName"):
                    continue
                self.reserved[entry["uid"]] = (entry["node"], pod_requests(pod))
        log.info(
            "leading: %d gangs known, %d released pods not bound yet kept reserved",
            len(self.store.gangs),
            len(self.reserved),
        )

    # -- one pass ------------------------------------------------------------------------

    def used(self) -> dict[str, dict[str, int]]:
        """Bound pods plus reservations. A reservation ends only when the bound-pod index shows
        that pod bound (or the pod is gone); otherwise the two watches race and over-commit."""
        for uid in [u for u in self.reserved if u in self.bound.pods or u not in self.store.pods]:
            del self.reserved[uid]
        used = {k: dict(v) for k, v in self.bound.used.items()}
        for node, requests in self.reserved.values():
            used[node] = add(used.get(node, {}), requests)
        return used

    async def release_orphans(self) -> None:
        for pod in orphans(self.store):
            uid = pod["metadata"]["uid"]
            if uid in self.told_waiting:
                continue
            self.told_waiting.add(uid)
            if await writes.release_pod(self.api, pod, None):
                await writes.post_event(
                    self.api,
                    {"apiVersion": "v1", "kind": "Pod", **pod},
                    "GroupDropped",
                    (
                        "the apiserver dropped spec.schedulingGroup (is the GenericWorkload feature gate "
                        "off?), so this pod's group can never be found: quorum released it without gang "
                        "admission"
                    ),
                    warning=True,
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
                if await writes.release_pod(self.api, pod, entry.get("hostname") or entry["node"]):
                    self.reserved[entry["uid"]] = (entry["node"], pod_requests(pod))
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

    async def step(self) -> None:
        await self.release_orphans()
        await self.continue_releases()
        used = self.used()
        views = assemble(self.store, frozenset(self.reserved))
        nodes = [node_from_api(n) for n in self.store.nodes.values()]
        plannable = {v.key: v for v in views if v.waiting is None and v.min_member is not None and v.gated}
        plan = plan_gangs(nodes, used, [v.to_core() for v in plannable.values()], self.settings.planner)
        released: Counter[tuple[str, str]] = Counter()
        for release in plan.releases:
            key = release.gang.key
            released[key] = await self.release(plannable[key], release)
        holds = {h.gang.key: await self.explain_hold(plannable[h.gang.key], h) for h in plan.holds}
        for view in views:
            self.last_seen[view.key] = time.monotonic()
            await self.write_status(view, holds.get(view.key), released[view.key])
        await self.forget_label_gangs({v.key for v in views})

    async def explain_hold(self, view: GangView, hold: Hold) -> Hold:
        """Add what the planner cannot see: a StatefulSet whose OrderedReady policy means the gang
        can never form (DESIGN.md: say it again in the Gang's status)."""
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

    async def warn_unmodeled(self, view: GangView, gang: dict[str, Any]) -> None:
        """DESIGN.md: a gang whose pods use hard constraints the planner does not model gets a
        warning that quorum cannot guarantee its placement (once per gang)."""
        if view.key in self.warned_unmodeled:
            return
        found = sorted({c for p in view.gated for c in pod_from_api(p).unmodeled})
        if not found:
            return
        self.warned_unmodeled.add(view.key)
        message = (
            f"pods of gang {view.name} use {', '.join(found)}, which quorum's plan does not model: "
            f"quorum cannot guarantee their placement (kube-scheduler may refuse a planned node)"
        )
        for obj in (gang, view.group):
            if obj is not None:
                await writes.post_event(self.api, obj, "UnmodeledConstraints", message, warning=True)

    async def ensure_gang(self, view: GangView) -> dict[str, Any]:
        existing = self.store.gangs.get(view.key)
        owner = None
        if view.group is not None:
            meta = view.group["metadata"]
            owner = {
                "apiVersion": view.group["apiVersion"],
                "kind": view.group["kind"],
                "name": meta["name"],
                "uid": meta["uid"],
                "blockOwnerDeletion": False,
                "controller": False,
            }
        if existing is not None:
            owners = existing["metadata"].get("ownerReferences") or []
            if owner is None or any(o.get("uid") == owner["uid"] for o in owners):
                return existing
            # The group was deleted and made again under the same name: a new gang.
            await writes.delete_gang(self.api, view.namespace, view.name)
        source: dict[str, Any] = {"kind": "Labels", "name": view.marker.group}
        if view.group is not None:
            source = {
                "apiVersion": view.group["apiVersion"],
                "kind": view.group["kind"],
                "name": view.group["metadata"]["name"],
                "uid": view.group["metadata"]["uid"],
            }
        spec = {
            "source": source,
            "minMember": view.min_member or 1,
            "scheduleTimeoutSeconds": view.schedule_timeout,
        }
        gang = await writes.create_gang(self.api, view.namespace, view.name, spec, owner)
        self.written.pop(view.key, None)  # a new object: its status is still to be written
        self.store.gangs[view.key] = gang
        return gang

    async def release(self, view: GangView, release: Release) -> int:
        gang = await self.ensure_gang(view)
        pods = {p["metadata"]["uid"]: p for p in view.gated}
        attempt = int(((gang.get("status") or {}).get("admission") or {}).get("attempt") or 0) + 1
        placement = [
            {"pod": pod.name, "uid": pod.uid, "node": node.name, "hostname": node.hostname}
            for pod, node in release.placement
        ]
        # The decision first: a restarted operator continues this plan instead of making another.
        await writes.patch_gang_status(
            self.api,
            view.namespace,
            view.name,
            {"admission": {"attempt": attempt, "time": writes.now(), "placement": placement}},
        )

        async def one(pod_uid: str, node: Node) -> bool:
            async with self.semaphore:
                ok = await writes.release_pod(self.api, pods[pod_uid], node.hostname)
                self.crash_hook(ok)
                return ok

        results = await asyncio.gather(*(one(p.uid, n) for p, n in release.placement))
        done = 0
        for (pod, node), ok in zip(release.placement, results, strict=True):
            if ok:
                self.reserved[pod.uid] = (node.name, dict(pod.requests))
                done += 1
        spread = Counter(n.name for (_, n), ok in zip(release.placement, results, strict=True) if ok)
        nodes = "node" if len(spread) == 1 else "nodes"
        message = (
            f"released {done} of {len(release.placement)} planned pods onto {len(spread)} {nodes}: "
            + ", ".join(f"{n} ×{c}" for n, c in sorted(spread.items()))
        )
        log.info("%s/%s: %s", view.namespace, view.name, message)
        for obj in (gang, view.group):
            if obj is not None:
                await writes.post_event(self.api, obj, "Released", message)
        self.reasons.pop(view.key, None)
        return done

    async def write_status(self, view: GangView, hold: Hold | None, released_now: int) -> None:
        counts = view.counts()
        counts["released"] += released_now  # released in this pass: not yet seen by the watch
        counts["gated"] -= released_now
        status, reason, message = admitted_condition(view, counts, hold, 0)
        gang_phase = phase(view, counts)
        if view.waiting:
            for pod in view.pods:
                if pod["metadata"]["uid"] not in self.told_waiting:
                    self.told_waiting.add(pod["metadata"]["uid"])
                    await writes.post_event(
                        self.api, {"apiVersion": "v1", "kind": "Pod", **pod}, "WaitingForGroup", view.waiting
                    )
        if view.group is None and view.waiting:
            return  # no Gang object until its group exists
        gang = await self.ensure_gang(view)
        await self.warn_unmodeled(view, gang)
        unschedulable = hold is not None and hold.reason == "Unschedulable"
        conditions = [
            {"type": "Admitted", "status": status, "reason": reason, "message": message},
            {
                "type": "Unschedulable",
                "status": "True" if unschedulable else "False",
                "reason": "Unschedulable" if unschedulable else reason,
                "message": hold.message if hold is not None and unschedulable else "",
            },
        ]
        wanted = {"phase": gang_phase, **counts, "conditions": conditions}
        if self.written.get(view.key) == wanted:
            return  # unchanged: no write
        self.written[view.key] = wanted
        stamp = writes.now()
        for c in conditions:  # a transition time changes only when the status does
            seen = self.transitions.get((view.key, c["type"]))
            if seen is None or seen[0] != c["status"]:
                self.transitions[(view.key, c["type"])] = (c["status"], stamp)
        timed = [{**c, "lastTransitionTime": self.transitions[(view.key, c["type"])][1]} for c in conditions]
        await writes.patch_gang_status(self.api, view.namespace, view.name, {**wanted, "conditions": timed})
        if (
            view.group is not None
            and view.marker.source in GROUP_APIS
            and view.group["apiVersion"].endswith("v1alpha1")
        ):
            api_group, version = GROUP_APIS[view.marker.source]
            group_status = {
                "phase": gang_phase,
                "scheduled": counts["bound"],
                "running": counts["running"],
                "succeeded": counts["succeeded"],
                "failed": counts["failed"],
                "observedGeneration": view.group["metadata"].get("generation"),
                "conditions": [{**c, "type": "Quorum" + c["type"]} for c in timed],
            }
            if counts["released"] and not (view.group.get("status") or {}).get("scheduleStartTime"):
                group_status["scheduleStartTime"] = stamp
            await writes.patch_status(
                self.api,
                api_group,
                version,
                "podgroups",
                view.namespace,
                view.group["metadata"]["name"],
                group_status,
            )
        if hold is not None and self.reasons.get(view.key) != hold.reason:
            self.reasons[view.key] = hold.reason
            warning = hold.reason == "Unschedulable"
            for obj in (gang, view.group):
                if obj is not None:
                    await writes.post_event(self.api, obj, hold.reason, hold.message, warning=warning)

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
                self.written.pop(key, None)
