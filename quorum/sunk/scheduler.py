"""The SUNK scheduler's reconciler: pods whose schedulerName is ours, and the Slurm jobs that
stand for them, kept in step in both directions (docs/sunk.md).

One pass (`reconcile`), every `poll_seconds` and whenever a pod changes:
1. list Slurm's jobs; the ones quorum submitted name their pod or gang in their comment;
2. a live job whose pods are all gone or finished is cancelled (pod deleted -> job cancelled);
3. an ended job's pods are deleted with an Event saying why (cancelled, preempted, time limit);
4. a pending pod (or a complete gang) with no live job is validated and submitted; a pod that
   fails validation, or asks for a partition, account, QOS or reservation its namespace may not
   use (`QUORUM_SUNK_NAMESPACES`), gets a Warning Event and is not tried again until it changes;
5. a job that runs and whose script has marked its comment `: started` has its pods bound to
   the nodes Slurm allocated (Binding API, which records the job on the pod), after they gain
   the lock toleration.
Everything is read again each pass, so a restarted scheduler reconciles what it finds: no
orphan job, no orphan pod. Slurm being down holds new work and touches nothing running.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import prometheus_client
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.gangs import (
    GROUP_APIS,
    PLACED_BY_LABEL,
    PLACED_BY_SLURM,
    SIZED_BY_PODS,
    SOURCE_KINDS,
    BadMinAvailable,
    GangMarker,
    GangSource,
    gang_markers,
    parse_min_available,
)
from quorum.core.times import timestamp
from quorum.core.workloads import POD_GROUP_VERSIONS
from quorum.k8s.convert import gang_record
from quorum.k8s.watch import watch_objects
from quorum.k8s.writes import now
from quorum.sunk import model
from quorum.sunk.api import SunkApi
from quorum.sunk.settings import SunkSettings
from quorum.sunk.slurm import Job, Slurm, SlurmError, SlurmUnavailable, drain_node, resume_node

log = logging.getLogger("quorum.sunk")
# How long a Binding whose answer was lost may still land (the apiserver's request timeout): a
# stop of its job does not answer "pods gone" before then unless the watch shows the pod bound.
BINDING_SETTLES = 60.0
PASSES = prometheus_client.Counter("quorum_sunk_passes_total", "Reconcile passes, by result", ["result"])
ACTIONS = prometheus_client.Counter(
    "quorum_sunk_actions_total",
    "What passes did: jobs submitted and cancelled, pods bound, deleted and refused (invalid)",
    ["action"],
)
BIND_LATENCY = prometheus_client.Histogram(
    "quorum_sunk_bind_latency_seconds",
    "Time from a pod's creation to its Binding to the nodes of its Slurm job (its wait in Slurm's "
    "queue included), in seconds",
    buckets=(0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0),
)
JSON = dict[str, Any]

OWNERLESS_PREFIXES = tuple(f"{source}-" for source in SOURCE_KINDS)  # gangs no group object owns


@dataclass(frozen=True)
class GangGroup:
    """What a gang's group says: its size (None if it cannot be read) and the object itself
    (None for a label-only gang), which owns the gang's Gang."""

    min_member: int | None
    group: JSON | None = None
    read_at: float = field(default_factory=time.monotonic)


GROUP_REFRESH_SECONDS = 10.0  # how often a waiting gang's PodGroup is read again


class ObjectIndex:
    """Objects of one core/v1 kind by uid (the watch keeps it current). A list's items carry no
    apiVersion and kind; they are filled in, as Events name the object by them."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.items: dict[str, JSON] = {}

    def upsert(self, obj: JSON) -> None:
        obj.setdefault("apiVersion", "v1")
        obj.setdefault("kind", self.kind)
        self.items[obj["metadata"]["uid"]] = obj

    def delete(self, obj: JSON) -> None:
        self.items.pop(obj["metadata"]["uid"], None)

    def replace_all(self, objs: list[JSON]) -> None:
        self.items = {}
        for obj in objs:
            self.upsert(obj)


def fingerprint(pod: JSON) -> str:
    """What validation looked at: a pod is tried again only when this changes."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    seen = [meta.get("annotations") or {}, spec.get("containers"), spec.get("initContainers"),
            spec.get("terminationGracePeriodSeconds")]  # fmt: skip
    return hashlib.sha256(orjson.dumps(seen, option=orjson.OPT_SORT_KEYS)).hexdigest()


def finished(pod: JSON) -> bool:
    """A pod that has run to its end: it needs no allocation, and is left for its owner."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class SunkScheduler:
    def __init__(self, settings: SunkSettings, api: SunkApi, slurm: Slurm) -> None:
        self.settings = settings
        self.api = api
        self.slurm = slurm
        self.pods = ObjectIndex("Pod")
        self.nodes = ObjectIndex("Node")
        self.pods_synced = asyncio.Event()
        self.nodes_synced = asyncio.Event()
        self.changed = asyncio.Event()
        self.invalid: dict[str, str] = {}  # pod uid -> fingerprint that failed validation
        self.gang_notes: dict[str, tuple[str, str]] = {}  # gang key -> why it is not submitted
        self.gang_groups: dict[str, GangGroup] = {}  # gang key -> its group, read when needed
        self.pod_group_version = POD_GROUP_VERSIONS[0]  # the WAS version a PodGroup was last read at
        self.gang_written: dict[str, JSON] = {}  # gang key -> the Gang status last written
        # pod uid -> the job this process bound it to: known before the watch shows the Binding
        self.bound_jobs: dict[str, int] = {}
        # pod uid -> (job, when its answer was lost, or None while it is awaited) of a Binding
        # sent: it may have bound the pod
        self.binding: dict[str, tuple[int, float | None]] = {}
        self.schedulers_of: dict[tuple[str, str], set[str]] = {}  # (ns, gang) -> schedulerNames
        self.schedulers_pass = -1
        self.node_locks: dict[str, asyncio.Lock] = {}
        self.passes = 0
        self.last_error: str | None = None

    # -- the loop --------------------------------------------------------------------------------

    async def run(self, watched: client.ApiClient) -> None:
        """Watch pods and nodes through `watched`, and reconcile until cancelled."""
        core = client.CoreV1Api(watched)
        tasks = [
            asyncio.create_task(
                watch_objects(
                    core.list_pod_for_all_namespaces, [self.pods], self.pods_synced, self.changed.set, "pods"
                )
            ),
            asyncio.create_task(
                watch_objects(core.list_node, [self.nodes], self.nodes_synced, self.changed.set, "nodes")
            ),
        ]
        try:
            await self.pods_synced.wait()
            await self.nodes_synced.wait()
            while True:
                self.changed.clear()
                try:
                    counts = await self.reconcile()
                    await self.sync_nodes()
                    self.last_error = None
                    PASSES.labels("ok").inc()
                    for action in ("submitted", "bound", "deleted", "cancelled", "invalid"):
                        ACTIONS.labels(action).inc(getattr(counts, action))
                except SlurmError as err:
                    self.last_error = str(err)
                    PASSES.labels("slurm_error").inc()
                    log.warning("pass skipped: %s", err)
                except Exception as err:  # one bad pass must not end the scheduler
                    self.last_error = f"{type(err).__name__}: {err}"
                    PASSES.labels("error").inc()
                    log.exception("pass failed")
                self.passes += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), self.settings.poll_seconds)
        finally:
            for task in tasks:
                task.cancel()

    def ours(self) -> list[JSON]:
        return [
            p for p in self.pods.items.values()
            if (p.get("spec") or {}).get("schedulerName") == self.settings.scheduler_name
        ]  # fmt: skip

    # -- one pass --------------------------------------------------------------------------------

    async def reconcile(self) -> model.Counts:
        counts = model.Counts()
        self.bound_jobs = {uid: job for uid, job in self.bound_jobs.items() if uid in self.pods.items}
        self.binding = {uid: b for uid, b in self.binding.items() if uid in self.pods.items}
        jobs = await self.slurm.jobs()
        by_key: dict[str, list[Job]] = {}
        for job in jobs:
            key = self.key_of_job(job)
            if key is not None:
                by_key.setdefault(key, []).append(job)
        members_of: dict[str, list[JSON]] = {}  # what the Gangs count: finished pods too
        pods_of: dict[str, list[JSON]] = {}  # the pods that still need their allocation
        for pod in self.ours():
            if pod["metadata"].get("deletionTimestamp"):
                continue
            key = self.key_of_pod(pod)
            members_of.setdefault(key, []).append(pod)
            if not finished(pod):
                pods_of.setdefault(key, []).append(pod)
        for key in [k for k in by_key if k not in pods_of]:
            if (now := model.key_now(key)) != key and now in pods_of:  # submitted by an earlier release
                by_key.setdefault(now, []).extend(by_key.pop(key))
        for key, components in by_key.items():
            live = [j for j in components if j.alive]
            mine = pods_of.get(key, [])
            if live and not mine:
                await self.slurm.cancel(live[0].group_id)
                counts.cancelled += 1
                log.info("job %s cancelled: its pods are gone or finished (%s)", live[0].group_id, key)
            elif not live and mine:
                counts.deleted += await self.delete_for_ended(components, mine)
        for key, mine in pods_of.items():
            live = [j for j in by_key.get(key, []) if j.alive]
            pending = [p for p in mine if not (p.get("spec") or {}).get("nodeName")]
            if not live and pending:
                ended = [j for j in by_key.get(key, []) if j.end_time]
                last = max(ended, key=lambda j: j.end_time or 0, default=None)
                fresh = [
                    p
                    for p in pending
                    if last is None or not model.goes_with_ended_job(p, last.group_id, last.end_time or 0)
                ]
                if fresh:
                    counts.submitted += await self.submit(key, fresh, counts)
            elif live and pending:
                counts.bound += await self.bind(key, live, mine)
        await self.write_gangs(members_of, by_key)
        return counts

    def key_of_job(self, job: Job) -> str | None:
        """The pod or gang a job stands for: named by its comment, and only in a job this scheduler
        submitted (its user, whom Slurm authenticates, is ours). Any Slurm user can write a comment."""
        return model.key_of_job(job.user_name, job.comment, self.settings.slurm_user)

    def key_of_pod(self, pod: JSON) -> str:
        marker = self.marker(pod)
        meta = pod["metadata"]
        if marker is None:
            return f"pod/{meta['namespace']}/{meta['name']}/{meta['uid']}"
        return f"gang/{meta['namespace']}/{marker.gang_name}"

    @staticmethod
    def marker(pod: JSON) -> GangMarker | None:
        spec = pod.get("spec") or {}
        group = (spec.get("schedulingGroup") or {}).get("podGroupName")
        markers = gang_markers(pod["metadata"].get("labels") or {}, group, pod["metadata"].get("annotations"))
        return markers[0] if markers else None

    async def event(self, obj: JSON, reason: str, message: str, warning: bool = False) -> None:
        await self.api.post_event(obj, reason, message, warning)

    # -- submit ----------------------------------------------------------------------------------

    async def submit(self, key: str, pending: list[JSON], counts: model.Counts) -> int:
        requests = []
        for pod in sorted(pending, key=lambda p: p["metadata"]["name"]):
            uid, seen = pod["metadata"]["uid"], fingerprint(pod)
            if self.invalid.get(uid) == seen:
                return 0
            try:
                request = model.validate(pod, self.settings.slurm_kill_wait_seconds)
            except model.InvalidPod as err:
                self.invalid[uid] = seen
                counts.invalid += 1
                await self.refuse(key, pod, "FailedValidation", f"not passed to Slurm: {err}")
                return 0
            allowance = model.allowance_of(request.namespace, self.settings.namespaces)
            if (refusal := model.allowance_refusal(request, allowance)) is not None:
                self.invalid[uid] = seen
                counts.invalid += 1
                await self.refuse(key, pod, "SlurmNotAllowed", f"not passed to Slurm: {refusal}")
                return 0
            requests.append(request)
        gang = None
        if key.startswith("gang/"):
            _, namespace, gang_name = key.split("/", 2)
            if others := self.other_schedulers(pending[0]):
                note = (
                    f"pods of gang {gang_name} name other schedulers ({others}): a gang is placed by one "
                    f"scheduler; give every pod of the group schedulerName {self.settings.scheduler_name}"
                )
                if self.gang_notes.get(key) != ("MixedSchedulers", note):
                    await self.refuse(key, pending[0], "MixedSchedulers", note)
                return 0
            group = self.gang_groups.get(key)
            if (
                group is None
                or group.min_member is None
                or len(requests) >= group.min_member
                or (time.monotonic() - group.read_at > GROUP_REFRESH_SECONDS)
            ):  # read again before a submission, and now and then while it waits
                group = await self.read_group(key, pending[0])
            need = group.min_member
            if need is None or len(requests) < need:
                note = f"waiting for the gang's members: {len(requests)} of {need or '?'} pods exist"
                if need is None:
                    note += " (its group is missing, or its size is not a whole number from 1 to 4096)"
                if self.gang_notes.get(key) != ("WaitingForMembers", note):
                    self.gang_notes[key] = ("WaitingForMembers", note)
                    await self.event(pending[0], "WaitingForGang", note)
                return 0
            gang = f"{namespace}/{gang_name}"
        try:
            placeholder = model.plan_placeholder(requests, gang)
        except model.InvalidPod as err:
            if self.gang_notes.get(key, ("", ""))[1] != f"not passed to Slurm: {err}":
                await self.refuse(key, pending[0], "FailedValidation", f"not passed to Slurm: {err}")
            return 0
        body = model.submission(
            placeholder,
            self.settings.hook_url,
            self.settings.stop_seconds,
            str(self.settings.slurm_hook_token_path),
        )
        try:
            job_id = await self.slurm.submit(body)
        except SlurmUnavailable:
            raise  # not an answer about this job: the pass is skipped and tried again
        except SlurmError as err:
            # Slurm refused the job itself (no such partition, too large for any node): the pod
            # hears it and is not submitted again until it changes.
            for pod in pending:
                self.invalid[pod["metadata"]["uid"]] = fingerprint(pod)
            await self.refuse(key, pending[0], "SlurmRejected", f"Slurm did not take the job: {err}")
            return 0
        self.gang_notes.pop(key, None)
        words = "pod" if gang is None else f"gang of {len(requests)} pods"
        for pod in pending:
            await self.event(
                pod, "SlurmJobSubmitted", f"placeholder Slurm job {job_id} submitted for this {words}"
            )
        log.info("submitted job %s for %s", job_id, key)
        return 1

    async def refuse(self, key: str, pod: JSON, reason: str, message: str) -> None:
        """A Warning Event on the pod; a gang's Gang says it too."""
        if key.startswith("gang/"):
            self.gang_notes[key] = (reason, message)
        await self.event(pod, reason, message, warning=True)

    def other_schedulers(self, pod: JSON) -> str:
        """The other schedulers that pods of this pod's gang name, if any (from an index of
        every gang's schedulers, made once per pass)."""
        if self.schedulers_pass != self.passes:
            self.schedulers_pass, self.schedulers_of = self.passes, {}
            for other in self.pods.items.values():
                marker = self.marker(other)
                if marker is not None and not other["metadata"].get("deletionTimestamp"):
                    gang = (other["metadata"]["namespace"], marker.gang_name)
                    name = (other.get("spec") or {}).get("schedulerName") or "default-scheduler"
                    self.schedulers_of.setdefault(gang, set()).add(name)
        marker = self.marker(pod)
        if marker is None:
            return ""
        names = self.schedulers_of.get((pod["metadata"]["namespace"], marker.gang_name), set())
        return ", ".join(sorted(names - {self.settings.scheduler_name}))

    async def read_group(self, key: str, pod: JSON) -> GangGroup:
        """The gang's size and group: its label, or its PodGroup of any of the three APIs."""
        marker = self.marker(pod)
        if marker is None:
            return GangGroup(1)
        if marker.source in SIZED_BY_PODS:
            try:
                return GangGroup(parse_min_available(marker.min_available, marker.size_key))
            except BadMinAvailable:
                return GangGroup(None)  # the webhook refuses such pods; they wait here
        group, version = GROUP_APIS[marker.source]
        versions = [version]
        if marker.source is GangSource.WORKLOAD_POD_GROUP:  # whichever the cluster serves, last found first
            versions = sorted(POD_GROUP_VERSIONS, key=lambda v: v != self.pod_group_version)
        obj = None
        for version in versions:
            obj = await self.api.read_group(group, version, pod["metadata"]["namespace"], marker.group)
            if obj is not None:
                if marker.source is GangSource.WORKLOAD_POD_GROUP:
                    self.pod_group_version = version
                break
        if obj is None:
            return GangGroup(None)
        read = GangGroup(model.group_min_member(obj, group == "scheduling.k8s.io"), obj)
        self.gang_groups[key] = read
        return read

    # -- the Gang objects of gangs Slurm places ------------------------------------------------

    async def write_gangs(self, pods_of: dict[str, list[JSON]], by_key: dict[str, list[Job]]) -> None:
        """Each gang's Gang, written when its status changes (docs/sunk.md, "Gangs"). A gang
        whose pods are gone has its final status written once; a label-only one's Gang is then
        deleted (nothing else owns it)."""
        stamp = now()
        for key in sorted(set(pods_of) | set(self.gang_written)):
            if not key.startswith("gang/"):
                continue
            mine = pods_of.get(key, [])
            try:
                await self.write_gang(key, mine, [j for j in by_key.get(key, []) if j.alive], stamp)
            except ApiException as err:  # this gang's write only; the next pass tries again
                self.gang_written.pop(key, None)
                log.warning("writing the Gang of %s failed: %s", key, err.reason)

    async def write_gang(self, key: str, mine: list[JSON], live: list[Job], stamp: str) -> None:
        _, namespace, name = key.split("/", 2)
        group = self.gang_groups.get(key)
        if mine and group is None:
            group = await self.read_group(key, mine[0])
        gone = not mine and not live
        if gone and name.startswith(OWNERLESS_PREFIXES):  # nothing else owns a label or Kueue gang's Gang
            await self.api.delete_gang(namespace, name)
            self.forget_gang(key)
            return
        min_member = (group.min_member if group else None) or 1
        job = None
        if live:
            first = min(live, key=lambda j: j.het_job_offset)
            job = model.SlurmJobFacts(
                first.group_id,
                first.job_state,
                first.state_reason,
                first.partition,
                ",".join(j.nodes for j in live if j.nodes) or None,
                any(model.started(j.comment) for j in live),
            )
        phases = [(p.get("status") or {}).get("phase") for p in mine]
        active = [p for p in mine if not finished(p)]
        counts = {
            "members": len(active),
            "bound": sum(1 for p in active if (p.get("spec") or {}).get("nodeName")),
            "running": phases.count("Running"),
            "succeeded": phases.count("Succeeded"),
            "failed": phases.count("Failed"),
        }
        facts = model.SlurmGangFacts(min_member, counts, job, None if live else self.gang_notes.get(key))
        previous = self.gang_written.get(key)
        status = model.slurm_gang_status(facts, previous, stamp)
        if previous is None:
            gang = await self.ensure_gang(namespace, name, min_member, group)
            if gang is None:
                return
            previous = gang.get("status")
            status = model.slurm_gang_status(facts, previous, stamp)
        if status != previous and await self.api.patch_gang_status(namespace, name, status):
            self.gang_written[key] = status
        if gone:  # its last status is written (the PodGroup keeps the Gang): nothing more to do
            self.forget_gang(key)

    def forget_gang(self, key: str) -> None:
        self.gang_written.pop(key, None)
        self.gang_groups.pop(key, None)
        self.gang_notes.pop(key, None)

    async def ensure_gang(
        self, namespace: str, name: str, min_member: int, group: GangGroup | None
    ) -> JSON | None:
        """The gang's Gang, made if need be (the same record as quorum-operator's gangs); None if
        one of quorum-operator's has its name."""
        source = next((s for s in SOURCE_KINDS if name.startswith(f"{s}-")), GangSource.LABELS)
        spec, owner = gang_record(
            group.group if group else None, name.removeprefix(f"{source}-"), min_member, SOURCE_KINDS[source]
        )
        gang = await self.api.create_gang(namespace, name, spec, owner)
        if (gang["metadata"].get("labels") or {}).get(PLACED_BY_LABEL) != PLACED_BY_SLURM:
            log.warning("Gang %s/%s is quorum-operator's; not writing it", namespace, name)
            return None
        return gang

    # -- bind ------------------------------------------------------------------------------------

    async def bind(self, key: str, live: list[Job], mine: list[JSON]) -> int:
        if not all(j.job_state == "RUNNING" for j in live) or not any(model.started(j.comment) for j in live):
            return 0
        requests = []
        by_uid = {p["metadata"]["uid"]: p for p in mine}
        for pod in sorted(mine, key=lambda p: p["metadata"]["name"]):
            try:
                requests.append(model.validate(pod, self.settings.slurm_kill_wait_seconds))
            except model.InvalidPod:
                return 0
        gang = key.split("/", 1)[1] if key.startswith("gang/") else None
        placeholder = model.plan_placeholder(requests, gang)
        components = sorted(live, key=lambda j: j.het_job_offset)
        if len(components) != len(placeholder.components):
            # A member of one shape is gone (its replacement comes): wait for it. A job is
            # cancelled only once all its pods are gone (reconcile), never under pods that are there.
            log.info("job %s has %d components for %d shapes now; waiting for the gang's members",
                     live[0].group_id, len(components), len(placeholder.components))  # fmt: skip
            return 0
        where: dict[str, str] = {}
        for component, job in zip(placeholder.components, components, strict=True):
            got = model.assign(component, job.shares())
            if got is None:
                log.warning("job %s: its allocation %s does not hold its pods", job.job_id, job.shares())
                return 0
            where.update(got)
        bound = 0
        job = live[0]
        for uid, node in where.items():
            pod = by_uid[uid]
            if (pod.get("spec") or {}).get("nodeName"):
                continue
            if not await self.api.add_toleration(pod, model.LOCK_TOLERATION):
                continue
            # Until its answer comes a stop of the job must not take the pod for unbound, nor for
            # a while if the answer is lost (`unsure`).
            self.binding[uid] = (job.group_id, None)
            try:
                bound_now = await self.api.bind_pod(pod, node, job.group_id)
            except BaseException:
                self.binding[uid] = (job.group_id, time.monotonic())
                raise
            del self.binding[uid]
            if not bound_now:
                continue  # refused (gone, or bound already): not by us
            self.bound_jobs[uid] = job.group_id
            bound += 1
            created = timestamp(pod["metadata"].get("creationTimestamp"))
            if created:
                BIND_LATENCY.observe(max(0.0, time.time() - created))
            await self.event(
                pod, "Scheduled", f"bound to {node} by Slurm job {job.group_id} (partition {job.partition})"
            )
        return bound

    # -- jobs that ended -------------------------------------------------------------------------

    async def delete_for_ended(self, components: list[Job], mine: list[JSON]) -> int:
        job = max(components, key=lambda j: j.end_time or 0)
        end = model.ended(job.group_id, job.job_state, job.state_reason, bool(job.preempt_time))
        ended_at = job.end_time or time.time()  # 0 while Slurm has not recorded the end yet
        deleted = 0
        for pod in mine:
            if not model.goes_with_ended_job(pod, job.group_id, ended_at):
                continue  # made after the job ended (the next submission's), or another job's
            await self.event(pod, end.reason, end.message, warning=True)
            if await self.api.delete_pod(pod):
                deleted += 1
        return deleted

    async def stop_job(self, job_id: int) -> model.StopRefusal | bool:
        """The placeholder script was told to stop: delete the pods this scheduler bound to the
        job and wait until they are gone (True), or until `stop_seconds` passed (False). Refused
        (and nothing deleted) unless Slurm knows the job as one of quorum's and is ending it."""
        jobs = await self.slurm.job(job_id)
        refused = model.stop_refusal(job_id, jobs, self.settings.slurm_user)
        if refused is not None:
            return refused
        key = next(k for k in map(self.key_of_job, jobs) if k)
        job = next((j for j in jobs if j.job_id == job_id), jobs[0])
        end = model.ended(job.group_id, job.job_state, job.state_reason, bool(job.preempt_time))
        others = {j.group_id for j in await self.live_jobs(key) if j.group_id != job.group_id}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.stop_seconds
        asked: set[str] = set()
        while True:
            of_key = [p for p in self.ours() if self.key_of_pod(p) == key and not finished(p)]
            mine = [p for p in of_key if self.bound_to(p, job.group_id, others)]
            if not mine and not any(self.unsure(p, job.group_id) for p in of_key):
                return True
            for pod in mine:
                uid = pod["metadata"]["uid"]
                if uid not in asked and not pod["metadata"].get("deletionTimestamp"):
                    asked.add(uid)
                    await self.event(pod, end.reason, end.message, warning=True)
                    await self.api.delete_pod(pod)
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.2)

    def unsure(self, pod: JSON, job_id: int) -> bool:
        """A Binding of the pod to the job was sent and its answer has not come, or was lost
        less than `BINDING_SETTLES` ago, and the watch has not shown the pod bound: it may be on
        the job's node."""
        sent = self.binding.get(pod["metadata"]["uid"])
        if sent is None or sent[0] != job_id or (pod.get("spec") or {}).get("nodeName"):
            return False
        lost_at = sent[1]
        return lost_at is None or time.monotonic() - lost_at < BINDING_SETTLES

    def bound_to(self, pod: JSON, job_id: int, others: set[int]) -> bool:
        """The pod is on the job's nodes as far as this scheduler can tell: bound, and not
        recorded for another live job (`others`); or bound by this process a moment ago, before
        the watch shows it."""
        return (
            model.on_jobs_nodes(pod, job_id, others) or self.bound_jobs.get(pod["metadata"]["uid"]) == job_id
        )

    async def live_jobs(self, key: str) -> list[Job]:
        return [j for j in await self.slurm.jobs() if j.alive and self.key_of_job(j) == key]

    # -- node locking ----------------------------------------------------------------------------

    def node_named(self, name: str) -> JSON | None:
        return next((n for n in self.nodes.items.values() if n["metadata"]["name"] == name), None)

    async def set_lock(self, name: str, state: str) -> bool:
        """Put a node in a lock state; retried on a node someone changed meanwhile."""
        node = self.node_named(name)
        for _ in range(10):
            if node is None:
                return False
            ops = model.lock_patch(node, state)
            if ops is None or await self.api.patch_node(node, ops):
                return True
            node = await self.api.read_node(name)
        return False

    def blocking_pods(self, node: str) -> list[JSON]:
        """Pods on `node` that do not tolerate the lock (the taint manager evicts them)."""
        return [
            p for p in self.pods.items.values()
            if (p.get("spec") or {}).get("nodeName") == node
            and not model.tolerates_lock(p)
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]  # fmt: skip

    async def not_the_jobs_node(self, job_id: int, node: str, ended: bool) -> str | None:
        """Why a prolog (or, `ended`, an epilog) call for this job and node is not one Slurm
        made: the job is unknown, was not given the node, or (epilog) still runs. None: it is."""
        jobs = await self.slurm.job(job_id)
        if not jobs:
            return f"Slurm knows no job {job_id}"
        if not any(node in model.expand_nodelist(j.nodes) for j in jobs):
            return f"job {job_id} was not given node {node}"
        if ended and any(j.job_state in ("RUNNING", "CONFIGURING", "SUSPENDED") for j in jobs):
            return f"job {job_id} still runs; its epilog comes after it ends"
        return None

    async def lock(self, job_id: int, node: str) -> tuple[bool, str]:
        """Prolog: taint the node, wait until every pod that does not tolerate it is gone."""
        jobs = await self.slurm.job(job_id)
        strict = any(self.key_of_job(j) for j in jobs)
        async with self.node_locks.setdefault(node, asyncio.Lock()):
            if self.node_named(node) is None:
                return True, f"{node} is not a Kubernetes node; nothing to lock"
            if not await self.set_lock(node, "pending"):
                return False, f"could not taint {node}"
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.settings.lock_timeout_seconds
            while blocking := self.blocking_pods(node):
                if loop.time() > deadline:
                    names = ", ".join(
                        f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in blocking[:5]
                    )
                    return (
                        False,
                        f"pods still on {node} after {self.settings.lock_timeout_seconds:.0f}s: {names}",
                    )
                await asyncio.sleep(0.2)
            await self.set_lock(node, "locked_strict" if strict else "locked")
        return True, f"{node} locked for job {job_id}"

    async def unlock(self, job_id: int, node: str) -> tuple[bool, str]:
        """Epilog: lift the lock unless another live job still runs on the node."""
        async with self.node_locks.setdefault(node, asyncio.Lock()):
            jobs = await self.slurm.jobs()
            group = next((j.group_id for j in jobs if j.job_id == job_id), job_id)
            others = [
                j for j in jobs
                if j.group_id != group and j.job_state in ("RUNNING", "CONFIGURING", "SUSPENDED")
                and node in model.expand_nodelist(j.nodes)
            ]  # fmt: skip
            if others:
                return True, f"{node} stays locked: job {others[0].job_id} runs there"
            if self.node_named(node) is None:
                return True, f"{node} is not a Kubernetes node"
            ok = await self.set_lock(node, "false")
        return ok, f"{node} unlocked after job {job_id}"

    # -- nodes: Kubernetes <-> Slurm -------------------------------------------------------------

    async def sync_nodes(self) -> None:
        slurm_nodes = {n.name: n for n in await self.slurm.nodes()}
        for node in list(self.nodes.items.values()):
            name = node["metadata"]["name"]
            found = slurm_nodes.get(name)
            if found is None:
                continue
            step = model.sync_node(node, found.state, found.state_flags, found.reason, now())
            try:
                await self.apply_node_sync(node, step)
            except ApiException as err:  # this node's writes only; the next pass tries again
                log.warning("keeping node %s in step with Slurm failed: %s", name, err.reason)

    async def apply_node_sync(self, node: JSON, step: model.NodeSync) -> None:
        name = node["metadata"]["name"]
        if step.condition is not None:
            await self.api.set_node_condition(name, step.condition)
        if step.drain:
            code, out = await drain_node(name, step.drain)
            log.info("drained %s in Slurm (%s): %s", name, step.drain, out if code else "ok")
        elif step.resume:
            code, out = await resume_node(name)
            log.info("resumed %s in Slurm: %s", name, out if code else "ok")
        elif step.annotate is not None:
            await self.annotate_drain(node, step.annotate)

    async def annotate_drain(self, node: JSON, reason: str) -> None:
        await self.api.patch_node(node, model.drain_annotation_patch(node, reason))
