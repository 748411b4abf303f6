"""Which pods are gang members, of which group, and what their gang is called
(docs/architecture.md, "What a gang pod is").

| the pod carries                                              | gang name |
|--------------------------------------------------------------|-----------|
| label `pod-group.scheduling.sigs.k8s.io: <n>` (seeds 000/001)  | `pg-<n>`  |
| label `scheduling.x-k8s.io/pod-group: <n>` (scheduler-plugins) | `xpg-<n>` |
| labels `pod-group.scheduling.sigs.k8s.io/name` + `/min-available` | `lbl-<n>` |
| `spec.schedulingGroup.podGroupName: <n>` (Kubernetes WAS)       | `wpg-<n>` |
| annotation `scheduling.k8s.io/group-name: <n>` (Volcano's dialect) | `vpg-<n>` |
| label `kueue.x-k8s.io/pod-group-name: <n>` + annotation `/pod-group-total-count` (Kueue) | `kpg-<n>` |

A pod with several markers belongs to the first row's group. A Kueue group admitted pod by pod
(annotation `kueue.x-k8s.io/pod-group-fast-admission`) is not a gang. A pod whose schedulerName belongs
to another scheduler is not quorum's, whatever its labels: quorum's are the default scheduler
and the coscheduler names of its install (one setting: `coscheduler_names` of the webhooks and
of the operator, and the CEL of the rendered policies; docs/integrations.md).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# quorum's own marks, named once (quorum.k8s, quorum.operator and quorum.core.removal import
# them): the scheduling gate the webhook puts on every gang pod and only quorum's operator takes
# off, the label naming the pod's gang, and the taint a preemption in flight holds the nodes it
# freed with (`quorum.dev/reserved=<token>:NoSchedule`, docs/preemption.md).
GATE = "quorum.dev/gang"
# Kueue's scheduling gate, removed once the workload fits its ClusterQueue's quota: a gang whose
# pods carry it waits for quota, not room (docs/integrations.md, "Kueue for quota").
KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"
GANG_LABEL = "quorum.dev/gang"
RESERVED_TAINT = "quorum.dev/reserved"

SIGS_POD_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"
X_POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
LABEL_GANG_NAME = "pod-group.scheduling.sigs.k8s.io/name"
LABEL_GANG_MIN_AVAILABLE = "pod-group.scheduling.sigs.k8s.io/min-available"
# Volcano's group marker is an annotation (LeaderWorkerSet, Kubeflow Trainer, the MPI Operator
# and KubeRay write it in their Volcano modes), and its scheduler is called `volcano`.
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"
# Kueue's plain-pod groups: the group's name is a label, its size an annotation (the pods'
# count, which Kueue admits as one Workload).
KUEUE_POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_TOTAL_COUNT = "kueue.x-k8s.io/pod-group-total-count"
# Kueue admits a group with this annotation pod by pod (its StatefulSet integration sets it: the
# StatefulSet controller makes each pod after the last is Ready): not a gang, quorum leaves it.
KUEUE_FAST_ADMISSION = "kueue.x-k8s.io/pod-group-fast-admission"

# On a Gang that quorum-sunk-scheduler writes (a gang Slurm places; docs/sunk.md) this label
# says `slurm`, and quorum-operator leaves the object alone.
PLACED_BY_LABEL = "quorum.dev/placed-by"
PLACED_BY_SLURM = "slurm"

DEFAULT_SCHEDULER = "default-scheduler"
# The scheduler names quorum takes by default and rewrites to the default scheduler: CoreWeave's
# (seed 001), the label-only coscheduler's (Determined AI, seed 000), and scheduler-plugins' as
# KubeRay, Kubeflow Trainer and the MPI Operator write it. `volcano` is added where the platform
# turns Volcano's dialect on (chart value schedulers.volcano).
COSCHEDULER_NAMES = ("cw-coscheduler", "coscheduler", "scheduler-plugins-scheduler")
QUORUM_SCHEDULER_NAMES = ("", DEFAULT_SCHEDULER, *COSCHEDULER_NAMES)


class Placer(StrEnum):
    """Who places a gang's pods once the gang is whole (docs/placement.md)."""

    QUORUM = "quorum"
    """The default: every gang pod is created held at quorum's gate, and quorum's planner
    releases a gang once all of it fits."""
    KUBE_SCHEDULER = "kube-scheduler"
    """Delegated: every gang pod is created naming a Kubernetes PodGroup
    (`spec.schedulingGroup`), which quorum's operator makes for gangs of other dialects, and
    kube-scheduler's gang cycle places it (Kubernetes 1.37 and later, with Workload Aware
    Scheduling served). No gate and no second write per pod."""


def delegated_pod_group(marker: GangMarker) -> str:
    """The Kubernetes PodGroup a gang pod names under `Placer.KUBE_SCHEDULER`: its own for a
    Workload Aware Scheduling gang, else one named as the gang, which quorum's operator makes."""
    return marker.group if marker.source is GangSource.WORKLOAD_POD_GROUP else marker.gang_name


def volcano_dialect(schedulers: Collection[str]) -> bool:
    """Whether the install takes Volcano's dialect: `volcano` is one of its scheduler names. Only
    then does the group annotation mark a gang pod (a cluster that never turned it on gates no
    pod for a Volcano PodGroup it may not even serve)."""
    return VOLCANO_SCHEDULER in schedulers


def quorum_schedulers(coschedulers: Collection[str], default: str = DEFAULT_SCHEDULER) -> tuple[str, ...]:
    """Every schedulerName a pod quorum takes may carry: none, the default scheduler's, or one
    of the coscheduler names."""
    return ("", default, *coschedulers)


_MAX_NAME = 63
_HASH_LEN = 8


class GangSource(StrEnum):
    """Where a gang is described; the value is the gang name's prefix."""

    SIGS_POD_GROUP = "pg"
    X_POD_GROUP = "xpg"
    LABELS = "lbl"
    WORKLOAD_POD_GROUP = "wpg"
    VOLCANO_POD_GROUP = "vpg"
    KUEUE_POD_GROUP = "kpg"


# Gangs without a group object: their size is on their pods (a label, or Kueue's annotation),
# and their Gang record's spec.source names them by this kind.
SOURCE_KINDS = {GangSource.LABELS: "Labels", GangSource.KUEUE_POD_GROUP: "KueuePodGroup"}
SIZED_BY_PODS = tuple(SOURCE_KINDS)


def size_on_pod(source: GangSource, labels: Mapping[str, str], annotations: Mapping[str, str]) -> str | None:
    """What a pod of a gang sized by its pods (`SIZED_BY_PODS`) says the gang's size is."""
    if source is GangSource.KUEUE_POD_GROUP:
        return annotations.get(KUEUE_POD_GROUP_TOTAL_COUNT)
    return labels.get(LABEL_GANG_MIN_AVAILABLE)


# The API (group, version) of each PodGroup kind a gang can name; label-only gangs have none.
# Kubernetes' own PodGroup is read at whichever version the cluster serves (quorum.core.workloads);
# the version here is the one quorum prefers.
GROUP_APIS: dict[GangSource, tuple[str, str]] = {
    GangSource.SIGS_POD_GROUP: ("scheduling.sigs.k8s.io", "v1alpha1"),
    GangSource.X_POD_GROUP: ("scheduling.x-k8s.io", "v1alpha1"),
    GangSource.WORKLOAD_POD_GROUP: ("scheduling.k8s.io", "v1beta1"),
    GangSource.VOLCANO_POD_GROUP: ("scheduling.volcano.sh", "v1beta1"),
}


@dataclass(frozen=True, slots=True)
class GangMarker:
    source: GangSource
    group: str  # the group's name as the user wrote it
    min_available: str | None = None  # label-only and Kueue gangs carry their size on their pods

    @property
    def gang_name(self) -> str:
        return gang_name(self.source, self.group)

    def describe(self) -> str:
        """How a person would name the group: "PodGroup pg1 (scheduling.sigs.k8s.io)"."""
        return {
            GangSource.SIGS_POD_GROUP: f"PodGroup {self.group} (scheduling.sigs.k8s.io)",
            GangSource.X_POD_GROUP: f"PodGroup {self.group} (scheduling.x-k8s.io)",
            GangSource.LABELS: f"label group {self.group}",
            GangSource.WORKLOAD_POD_GROUP: f"PodGroup {self.group} (scheduling.k8s.io)",
            GangSource.VOLCANO_POD_GROUP: f"PodGroup {self.group} (scheduling.volcano.sh)",
            GangSource.KUEUE_POD_GROUP: f"Kueue pod group {self.group}",
        }[self.source]

    @property
    def size_key(self) -> str:
        """Where a gang sized by its pods writes its size (`SIZED_BY_PODS`): "label K"."""
        if self.source is GangSource.KUEUE_POD_GROUP:
            return f"annotation {KUEUE_POD_GROUP_TOTAL_COUNT}"
        return f"label {LABEL_GANG_MIN_AVAILABLE}"


def gang_markers(
    labels: Mapping[str, str],
    scheduling_group: str | None,
    annotations: Mapping[str, str] | None = None,
    *,
    volcano: bool = False,
) -> list[GangMarker]:
    """Every group marker on a pod (or pod template), in the table's order of precedence.
    Volcano's annotation counts only where `volcano` (the install takes its dialect). A
    `spec.schedulingGroup` that names the first marker's gang is that gang's delegation to
    kube-scheduler (`delegated_pod_group`), not a group of its own."""
    found = []
    if value := labels.get(SIGS_POD_GROUP_LABEL):
        found.append(GangMarker(GangSource.SIGS_POD_GROUP, value))
    if value := labels.get(X_POD_GROUP_LABEL):
        found.append(GangMarker(GangSource.X_POD_GROUP, value))
    if value := labels.get(LABEL_GANG_NAME):
        found.append(GangMarker(GangSource.LABELS, value, labels.get(LABEL_GANG_MIN_AVAILABLE)))
    if scheduling_group:
        found.append(GangMarker(GangSource.WORKLOAD_POD_GROUP, scheduling_group))
    if volcano and annotations and (value := annotations.get(VOLCANO_GROUP_ANNOTATION)):
        found.append(GangMarker(GangSource.VOLCANO_POD_GROUP, value))
    if (value := labels.get(KUEUE_POD_GROUP_LABEL)) and KUEUE_FAST_ADMISSION not in (annotations or {}):
        count = (annotations or {}).get(KUEUE_POD_GROUP_TOTAL_COUNT)
        found.append(GangMarker(GangSource.KUEUE_POD_GROUP, value, count))
    if scheduling_group and len(found) > 1 and found[0].gang_name == scheduling_group:
        found = [m for m in found if m.source is not GangSource.WORKLOAD_POD_GROUP]
    return found


MAX_MIN_AVAILABLE = 100_000
"""The largest label-only gang: Kubernetes' own bound on the pods an Indexed Job runs at once
(its `parallelism`). Anything larger is a typo, and would never fit."""
_WHOLE_NUMBER = re.compile(r"[1-9][0-9]{0,5}")  # ASCII digits only (\d would take "٣")
_HOW_TO_WRITE = (
    f"it must be a whole number from 1 to {MAX_MIN_AVAILABLE} in plain digits, with no sign, "
    f'spaces, leading zeros, decimals or exponent: write "4" for a gang of four pods'
)


class BadMinAvailable(ValueError):
    """A label-only gang's min-available label (or a Kueue pod group's total-count annotation)
    is missing or not a size; the message says what is wrong and what to write instead."""


def parse_min_available(value: object, key: str = f"label {LABEL_GANG_MIN_AVAILABLE}") -> int:
    """The size of a gang sized by its pods, from `key` (a label-only gang's label
    `min-available`, or `GangMarker.size_key`): "1" to "100000". Anything else ("0", "-1",
    " 3", "+2", "04", "1.5", "1e9", "0x10", "٣", missing) raises BadMinAvailable."""
    if isinstance(value, str) and len(value) <= 6 and _WHOLE_NUMBER.fullmatch(value):
        number = int(value)
        if number <= MAX_MIN_AVAILABLE:
            return number
    if value is None:
        raise BadMinAvailable(f"{key} is missing (the gang takes its size from it); {_HOW_TO_WRITE}")
    if isinstance(value, str):
        found = repr(value) if len(value) <= 20 else f"{value[:20]!r}… ({len(value)} characters)"
    else:
        found = f"not a string but {type(value).__name__}"
    raise BadMinAvailable(f"{key} is {found}: {_HOW_TO_WRITE}")


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod (plain JSON) still carries quorum's scheduling gate."""
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def is_quorum_scheduler(scheduler_name: str | None, names: Collection[str] = QUORUM_SCHEDULER_NAMES) -> bool:
    return (scheduler_name or "") in names


def gang_marker(
    labels: Mapping[str, str],
    scheduling_group: str | None,
    scheduler_name: str | None,
    quorum_schedulers: Collection[str] = QUORUM_SCHEDULER_NAMES,
    annotations: Mapping[str, str] | None = None,
) -> GangMarker | None:
    """The gang a pod belongs to, or None (no marker, or another scheduler's pod). Volcano's
    annotation counts only where the install takes its dialect (`volcano_dialect`)."""
    if not is_quorum_scheduler(scheduler_name, quorum_schedulers):
        return None
    markers = gang_markers(labels, scheduling_group, annotations, volcano=volcano_dialect(quorum_schedulers))
    return markers[0] if markers else None


_INVALID = re.compile(r"[^a-z0-9-]+")
_HASHED_TAIL = re.compile(rf"-[0-9a-f]{{{_HASH_LEN}}}$")  # how a name that was changed ends


def gang_name(source: GangSource, group: str) -> str:
    """`<prefix>-<group>`, made a valid label value and DNS-1123 label: lower-cased, runs of
    other characters replaced by '-', at most 63 characters. Where anything was changed or cut,
    a short hash of the original is appended. A name that already ends like that (`-` and 8 hex
    digits) gets a hash of its own too: `pg-a.b` becomes `pg-a-b-9b17870e`, and PodGroup
    `a-b-9b17870e` becomes `pg-a-b-9b17870e-<hash>`, never the same name. Two groups share a
    name only if the first 32 bits of their SHA-256 do (the operator holds such a gang and says
    why: quorum.operator.gangs)."""
    wanted, clean = _cleaned(source, group)
    if clean == wanted and len(clean) <= _MAX_NAME and not _HASHED_TAIL.search(clean):
        return clean
    return _hashed(wanted, clean)


def legacy_gang_name(source: GangSource, group: str) -> str | None:
    """The name earlier releases of quorum gave the group where it differs from `gang_name`'s
    (a group whose own name ends like a hashed one was kept as it was), else None. A gang made
    then keeps that name for as long as its Gang object lives (quorum.operator.gangs.GangAliases),
    so an upgrade splits no running gang (docs/operations.md, "Upgrading")."""
    wanted, clean = _cleaned(source, group)
    if clean == wanted and len(clean) <= _MAX_NAME and _HASHED_TAIL.search(clean):
        return clean
    return None


def name_now(name: str) -> str:
    """The gang name a group has today, given the one it may have had in an earlier release:
    a legacy name (`legacy_gang_name`) spells its group, so today's name follows from it; any
    other name is returned as it is."""
    if not may_be_legacy(name):
        return name
    for source in GangSource:
        group = name.removeprefix(f"{source.value}-")
        if group != name and legacy_gang_name(source, group) == name:
            return gang_name(source, group)
    return name


def _cleaned(source: GangSource, group: str) -> tuple[str, str]:
    """`<prefix>-<group>` as written, and made a valid label value (lower-cased, runs of other
    characters replaced by '-')."""
    wanted = f"{source.value}-{group}"
    return wanted, _INVALID.sub("-", wanted.lower()).strip("-")


def _hashed(wanted: str, clean: str) -> str:
    digest = hashlib.sha256(wanted.encode()).hexdigest()[:_HASH_LEN]
    stem = clean[: _MAX_NAME - _HASH_LEN - 1].rstrip("-")
    return f"{stem}-{digest}"


def may_be_legacy(name: str) -> bool:
    """Cheap first test: only a name ending like a hashed one can be a legacy name."""
    return _HASHED_TAIL.search(name) is not None


def queued_since(group_created: float | None, pods_created: Collection[float], min_member: int) -> float:
    """When a gang joined the queue, for its age in queue order: once it had both its group
    object and minMember pods — the minMember-th oldest of the pods it has now. Creation times
    are the apiserver's, so a tenant cannot make a gang older than it is: reusing an old group
    object, or keeping one old pod while the rest come later, does not move it ahead."""
    times = sorted(pods_created)
    need = max(1, min_member)
    pods_ready = times[need - 1] if len(times) >= need else (times[-1] if times else 0.0)
    return max(group_created or 0.0, pods_ready)
