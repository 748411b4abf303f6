"""kopf, used only for watching: `on.event` handlers that keep the Store current and wake the
scheduling loop, plus start-up and clean-up of quorum's own tasks. Pods and nodes are not among
them: they come through quorum's own watches (`quorum/k8s/watch.py` says why). No
on.create/update/delete, no timers or daemons, no posting: kopf writes nothing to any object
(DESIGN.md). The handlers are `async`: kopf would run plain functions in a thread pool, one hop
per event."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
from kubernetes_asyncio import client

from quorum.core.lifecycle import BackoffPolicy
from quorum.k8s import reads
from quorum.k8s.client import api_client
from quorum.k8s.usage import BoundPods
from quorum.k8s.watch import watch_objects
from quorum.operator.gangs import GangPods, Store, StoreNodes
from quorum.operator.leader import LeaseSettings, lead
from quorum.operator.loop import GangLoop, LoopSettings, planner_settings
from quorum.operator.settings import OperatorSettings

log = logging.getLogger("quorum.operator")


class NoDiffBase(kopf.DiffBaseStorage):
    """quorum has only `on.event` handlers, which never look at a diff: kopf need not build a
    diff-base of every object on every event (a deep copy of the whole pod), nor keep one."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class NoProgress(kopf.ProgressStorage):
    """Progress records are for kopf's change handlers (retries, multi-step handling); quorum has
    none, so there is nothing to record, and nothing to strip from every event (py-spy: a
    twentieth of the operator's CPU went to clearing records that do not exist)."""

    def fetch(self, *, key: kopf.HandlerId, body: kopf.Body) -> kopf.ProgressRecord | None:
        return None

    def store(
        self, *, key: kopf.HandlerId, record: kopf.ProgressRecord, body: kopf.Body, patch: kopf.Patch
    ) -> None:
        return None

    def purge(self, *, key: kopf.HandlerId, body: kopf.Body, patch: kopf.Patch) -> None:
        return None

    def touch(self, *, body: kopf.Body, patch: kopf.Patch, value: str | None) -> None:
        return None

    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        return essence


STORE = Store()
TASKS: list[asyncio.Task[None]] = []
LOOP: list[GangLoop] = []


def _wake() -> None:
    if LOOP:
        LOOP[0].wake()


def _apply(table: dict[Any, dict[str, Any]], key: Any, event: kopf.RawEvent) -> None:
    if event.get("type") == "DELETED":
        table.pop(key, None)
    else:
        table[key] = dict(event["object"])
    _wake()


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.enabled = False  # no Events from kopf; quorum posts its own, per gang
    settings.persistence.diffbase_storage = NoDiffBase()  # nothing to diff, nothing to store
    settings.persistence.progress_storage = NoProgress()
    settings.watching.server_timeout = 300
    config = OperatorSettings.from_env()
    api = await api_client()
    STORE.workload_api = await reads.serves(api, "scheduling.k8s.io", "v1alpha2")
    if not STORE.workload_api:
        log.warning(
            "scheduling.k8s.io/v1alpha2 is not served: Kubernetes 1.36 PodGroups are not watched, and pods "
            "that name one (spec.schedulingGroup) are released without gang admission, with a warning Event"
        )
    bound = BoundPods()
    loop = GangLoop(
        api,
        STORE,
        bound,
        LoopSettings(
            planner=planner_settings(config.org, config.starvation_seconds),
            resync_seconds=config.resync_seconds,
            release_concurrency=config.release_concurrency,
            gang_concurrency=config.gang_concurrency,
            forming_grace_seconds=config.forming_grace_seconds,
            status_interval_seconds=config.status_interval_seconds,
            crash_after=config.test_crash_after,
            backoff=BackoffPolicy(config.backoff_seconds, config.backoff_cap_seconds),
        ),
    )
    LOOP.append(loop)
    # Pods and nodes come through quorum's own watches, not kopf's (quorum/k8s/watch.py says why).
    core = client.CoreV1Api(api)
    pods = watch_objects(core.list_pod_for_all_namespaces, [GangPods(STORE), bound], bound.synced, loop.wake)
    nodes = watch_objects(core.list_node, [StoreNodes(STORE)], STORE.nodes_synced, loop.wake)
    TASKS.append(asyncio.create_task(pods, name="pods"))
    TASKS.append(asyncio.create_task(nodes, name="nodes"))
    lease = LeaseSettings.for_duration(config.namespace, config.lease_seconds)
    TASKS.append(asyncio.create_task(lead(api, loop.run, lease), name="leader-election"))


@kopf.on.cleanup()
async def stop(**_: Any) -> None:
    for task in TASKS:
        task.cancel()
    await asyncio.gather(*TASKS, return_exceptions=True)


@kopf.on.event("scheduling.sigs.k8s.io", "v1alpha1", "podgroups")
async def sigs_podgroup_event(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    _apply(STORE.groups, ("scheduling.sigs.k8s.io", namespace, name), event)


@kopf.on.event("scheduling.x-k8s.io", "v1alpha1", "podgroups")
async def x_podgroup_event(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    _apply(STORE.groups, ("scheduling.x-k8s.io", namespace, name), event)


@kopf.on.event("scheduling.k8s.io", "v1alpha2", "podgroups")
async def workload_podgroup_event(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    _apply(STORE.groups, ("scheduling.k8s.io", namespace, name), event)


@kopf.on.event("quorum.dev", "v1alpha1", "gangs")
async def gang_event(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    _apply(STORE.gangs, (namespace, name), event)
