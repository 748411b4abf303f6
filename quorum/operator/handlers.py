"""kopf runs the process; quorum does the watching. The handlers here are kopf's start-up and
clean-up only: they start quorum's own list+watch of every kind the loop reads (pods, nodes,
Gangs and each PodGroup API served; `quorum/k8s/watch.py`), the health and metrics server, the
event-loop lag monitor and the leader election that runs the scheduling loop.

Why not kopf's watches: the loop must not plan before every kind has been listed (a new leader
that planned before it saw the Gangs would not know the reservations recorded on them), and
kopf's event handlers give no signal that a resource's first listing is complete; quorum's own
watch sets one per kind. kopf writes nothing to any object (posting, progress and diff-base
storage are off).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.gangs import PLACED_BY_LABEL, PLACED_BY_SLURM, quorum_schedulers
from quorum.core.workloads import COMPOSITE_VERSIONS, POD_GROUP_VERSIONS, WAS_GROUP
from quorum.k8s import reads
from quorum.k8s.api import LiveApi
from quorum.k8s.client import api_client
from quorum.k8s.usage import BoundPods
from quorum.k8s.watch import Index, watch_objects
from quorum.operator import metrics
from quorum.operator.collector import COLLECTOR
from quorum.operator.gangs import (
    GROUP_APIS,
    GangPods,
    Store,
    store_composites,
    store_gangs,
    store_groups,
    store_namespaces,
    store_nodes,
    store_pdbs,
)
from quorum.operator.health import Health, monitor_event_loop_lag, serve
from quorum.operator.leader import LeaseSettings, lead
from quorum.operator.loop import GangLoop
from quorum.operator.settings import OperatorSettings, loop_settings

log = logging.getLogger("quorum.operator")


class NoDiffBase(kopf.DiffBaseStorage):
    """quorum has no change handlers, which would look at a diff: kopf need not build or keep
    a diff-base of anything."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class NoProgress(kopf.ProgressStorage):
    """Progress records are for kopf's change handlers (retries, multi-step handling); quorum has
    none, so there is nothing to record."""

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


TASKS: list[asyncio.Task[Any]] = []
RUNNERS: list[Any] = []
HEALTH_ADDRESS: list[str] = []  # set by main: host:port of /healthz, /readyz, /metrics


async def owned_group_apis(api: client.ApiClient) -> frozenset[str]:
    """The CRD-defined PodGroup API groups whose CRD is quorum's (labelled part-of: quorum)."""
    owned = set()
    for group, _version in GROUP_APIS.values():
        if group == WAS_GROUP:
            continue
        try:
            labels = await reads.crd_labels(api, f"podgroups.{group}")
        except ApiException as err:  # not knowing whose it is, write none of its status
            log.warning(
                "cannot read the CRD podgroups.%s (%s): quorum writes none of their status", group, err.status
            )
            continue
        if labels is not None and labels.get("app.kubernetes.io/part-of") == "quorum":
            owned.add(group)
        elif labels is not None:
            log.warning(
                "the CRD podgroups.%s is not quorum's (scheduler-plugins' own?): quorum reconciles its "
                "PodGroups but writes none of their status; see each gang's Gang object",
                group,
            )
    return frozenset(owned)


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.enabled = False  # no Events from kopf; quorum posts its own, per gang
    settings.scanning.disabled = True  # no resource handlers: nothing to discover (no CRD watch)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.persistence.progress_storage = NoProgress()
    config = OperatorSettings.from_env()
    health = Health(liveness_seconds=config.liveness_seconds)
    if HEALTH_ADDRESS:
        host, _sep, port = HEALTH_ADDRESS[0].rpartition(":")
        RUNNERS.append(await serve(host or "0.0.0.0", int(port), health))  # noqa: S104
    TASKS.append(asyncio.create_task(monitor_event_loop_lag(), name="event-loop-lag"))
    COLLECTOR.install()
    TASKS.append(asyncio.create_task(COLLECTOR.run(), name="garbage-collector"))
    api = await api_client(trace_configs=(metrics.api_trace_config(),))
    store = Store(
        owned_group_apis=await owned_group_apis(api),
        schedulers=quorum_schedulers(config.coscheduler_names),
        tenant_label=config.tenant_label,
    )
    bound = BoundPods()
    live = LiveApi(api)
    loop = GangLoop(
        live,
        store,
        bound,
        loop_settings(config),
        health,
    )
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    watches: list[tuple[str, Any, list[Index]]] = [
        ("pods", core.list_pod_for_all_namespaces, [GangPods(store), bound]),
        ("nodes", core.list_node, [store_nodes(store)]),
        (
            "gangs.quorum.dev",
            # Gangs Slurm places are quorum-sunk-scheduler's to write (docs/sunk.md), not ours.
            functools.partial(
                custom.list_cluster_custom_object,
                "quorum.dev",
                "v1alpha1",
                "gangs",
                label_selector=f"{PLACED_BY_LABEL}!={PLACED_BY_SLURM}",
            ),
            [store_gangs(store)],
        ),
        (
            "poddisruptionbudgets",
            client.PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces,
            [store_pdbs(store)],
        ),
        # DRA (resource.k8s.io/v1, docs/dra.md): devices, their classes, and claims.
        ("resourceslices", client.ResourceV1Api(api).list_resource_slice, [loop.devices.slices]),
        ("deviceclasses", client.ResourceV1Api(api).list_device_class, [loop.devices.classes]),
        (
            "resourceclaims",
            client.ResourceV1Api(api).list_resource_claim_for_all_namespaces,
            [loop.devices.claims],
        ),
    ]
    if config.tenant_label:  # the namespaces' tenant label (docs/lifecycle.md, "Between tenants")
        watches.append(("namespaces", core.list_namespace, [store_namespaces(store)]))
    for group, version in GROUP_APIS.values():
        if group == WAS_GROUP:
            continue
        listing = functools.partial(custom.list_cluster_custom_object, group, version, "podgroups")
        watches.append((f"podgroups.{group}", listing, [store_groups(store, group)]))
    # Kubernetes' own PodGroups and CompositePodGroups: at whichever version is served, found by
    # discovery at every (re)list, so an API turned on later or an upgrade is followed live.
    pod_groups = reads.ServedListing(
        api, WAS_GROUP, "podgroups", POD_GROUP_VERSIONS, served(store, "pod_group")
    )
    composites = reads.ServedListing(
        api, WAS_GROUP, "compositepodgroups", COMPOSITE_VERSIONS, served(store, "composite")
    )
    watches.append((f"podgroups.{WAS_GROUP}", pod_groups, [store_groups(store, WAS_GROUP)]))
    watches.append((f"compositepodgroups.{WAS_GROUP}", composites, [store_composites(store)]))
    for kind, listing, indexes in watches:
        synced = bound.synced if kind == "pods" else store.sync_event(kind)
        store.synced[kind] = synced
        health.set_synced(kind, False)
        # quorum's own Gangs are never "not installed": a 404 for them is an apiserver still
        # loading its CRDs, and planning without the reservations they record would overcommit.
        watching = watch_objects(
            listing, indexes, synced, loop.wake, kind, required=kind == "gangs.quorum.dev"
        )
        TASKS.append(asyncio.create_task(watching, name=kind))
        TASKS.append(asyncio.create_task(report_synced(health, kind, synced), name=f"{kind} synced"))
    lease = LeaseSettings.for_duration(config.namespace, config.lease_seconds)
    # The Lease has a client of its own: on the shared one (100 connections, 128 release patches
    # in flight and a watch per kind) a renewal waited for a connection behind the releases of
    # a 4,096-pod gang long enough to lose the Lease, ten times in one run at 5,000 nodes.
    lease_api = await api_client(trace_configs=(metrics.api_trace_config(),))
    TASKS.append(asyncio.create_task(campaign_when_synced(lease_api, loop, lease), name="leader-election"))


NOT_SERVED_SECONDS = 30.0  # discovery says "not served" for this long before it holds


def served(
    store: Store, kind: str, clock: Callable[[], float] = time.monotonic
) -> Callable[[str | None], None]:
    """Keep `store.<kind>_version` as discovery finds it, and say when it changes. "Not served"
    holds only once every answer for `NOT_SERVED_SECONDS` has said so: pods naming a Kubernetes
    PodGroup are then released without gang admission, which odd answers (an apiserver of an HA
    control plane mid-upgrade, say) must not cause."""
    since: float | None = None  # the first of the answers in a row that said "not served"

    def found(version: str | None) -> None:
        nonlocal since
        if version is not None:
            since = None
        elif since is None or clock() - since < NOT_SERVED_SECONDS:
            since = clock() if since is None else since
            return
        attribute = f"{kind}_version"
        before = getattr(store, attribute)
        setattr(store, attribute, version)
        if version == before:
            return
        if kind == "pod_group" and version is None:
            log.warning(
                "scheduling.k8s.io serves no PodGroup version quorum reads (%s): Kubernetes PodGroups are "
                "not watched, and pods that name one (spec.schedulingGroup) are released without gang "
                "admission, with a warning Event",
                ", ".join(POD_GROUP_VERSIONS),
            )
        else:
            log.info("scheduling.k8s.io %s: now read at %s (was %s)", kind, version, before)

    return found


async def campaign_when_synced(api: client.ApiClient, loop: GangLoop, lease: LeaseSettings) -> None:
    """Campaign for the Lease only once every watched kind has been listed: a replica that
    cannot list (a slow apiserver, a broken conversion webhook) leaves the Lease to one that
    can, instead of holding it while it cannot act."""
    for kind, synced in loop.store.synced.items():
        if not synced.is_set():
            log.info("waiting for the first listing of %s before campaigning for the Lease", kind)
            await synced.wait()
    # What exists now (modules, kopf, the first listings) lives as long as the process: out of
    # the garbage collector's way (quorum.operator.collector). No gc.collect() first: a full
    # collection here would itself be the pause this avoids.
    COLLECTOR.freeze()
    await lead(api, loop.run, lease)


async def report_synced(health: Health, kind: str, synced: asyncio.Event) -> None:
    await synced.wait()
    health.set_synced(kind, True)


@kopf.on.cleanup()
async def stop(**_: Any) -> None:
    for task in TASKS:
        task.cancel()
    await asyncio.gather(*TASKS, return_exceptions=True)
    for runner in RUNNERS:
        await runner.cleanup()
