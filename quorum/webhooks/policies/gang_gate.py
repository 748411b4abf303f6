"""Gang admission, step 1: every gang pod is created held at quorum's scheduling gate.

On Pod CREATE (the table, scheduler-name rule and precedence of `quorum.core.gangs`; see
docs/architecture.md, "What a gang pod is"): a gang pod gets the gate
`quorum.dev/gang` and the label `quorum.dev/gang=<gang name>`; a pod that asks for one of the
coscheduler names (`cw-coscheduler`, `coscheduler`, `scheduler-plugins-scheduler` by default) is
rewritten to the default scheduler (the original kept in the
annotation `quorum.dev/requested-scheduler`), with or without a group. A gang pod that sets
`spec.nodeName` is denied: it would bypass every scheduler, and so the gang. So is a pod of a
label-only gang whose `min-available` label (or a Kueue pod group's pod whose
`kueue.x-k8s.io/pod-group-total-count` annotation) is missing or not a size from 1 to 100000
(`quorum.core.gangs.parse_min_available`): its gang could never form.

Under `placement: kube-scheduler` (docs/placement.md) a gang pod gets no gate: it is made to
name a Kubernetes PodGroup instead (`spec.schedulingGroup`, `quorum.core.gangs.delegated_pod_group`),
which holds it in kube-scheduler's queue until the PodGroup exists and minCount pods are there;
a gang pod of another dialect that already names a different scheduling group is denied (it
would be placed as that group, not as its gang)."""

from __future__ import annotations

from quorum.core.gangs import (
    SIZED_BY_PODS,
    BadMinAvailable,
    GangSource,
    Placer,
    delegated_pod_group,
    gang_markers,
    is_gated,
    is_quorum_scheduler,
    parse_min_available,
)
from quorum.webhooks.objects import annotations_of, dig, labels_of
from quorum.webhooks.patch import (
    AddSchedulingGate,
    Intent,
    SetAnnotation,
    SetLabel,
    SetSchedulerName,
    SetSchedulingGroup,
)
from quorum.webhooks.review import AdmissionRequest, Decision, shown
from quorum.webhooks.settings import WebhookSettings

GATE = "quorum.dev/gang"
GANG_LABEL = "quorum.dev/gang"
REQUESTED_SCHEDULER = "quorum.dev/requested-scheduler"


def mutate(request: AdmissionRequest, settings: WebhookSettings) -> Decision:
    if request.operation != "CREATE" or request.object is None:
        return Decision()
    spec = request.object.get("spec")
    if not isinstance(spec, dict):
        return Decision()
    scheduler = spec.get("schedulerName")
    if not isinstance(scheduler, str | None) or not is_quorum_scheduler(
        scheduler, settings.quorum_scheduler_names
    ):
        return Decision()  # another scheduler's pod, whatever its labels
    labels = labels_of(request.object)
    group = dig(spec, "schedulingGroup", "podGroupName")
    markers = gang_markers(
        labels,
        group if isinstance(group, str) else None,
        annotations_of(request.object),
        volcano=settings.volcano_dialect,
    )
    intents: list[Intent] = []
    warnings: list[str] = []
    requested = annotations_of(request.object).get(REQUESTED_SCHEDULER)
    if requested is not None and not (
        requested in settings.coscheduler_names and scheduler in (requested, settings.default_scheduler)
    ):
        return Decision(denied=forged([f"annotation {REQUESTED_SCHEDULER}={shown(requested)}"]))
    own = labels.get(GANG_LABEL)
    # A gated pod of no group labelled `wpg-...` is what a dropped spec.schedulingGroup leaves
    # (quorum_labels.py). The in-apiserver policies cannot tell it from one written so, so neither
    # way refuses it; it stays held at quorum's gate like any member of that gang.
    dropped_group = not markers and own is not None and own.startswith("wpg-") and is_gated(request.object)
    if own is not None and not dropped_group and (not markers or own != markers[0].gang_name):
        # Never overwrite (or strip) it: deny, so that the person who set it finds out.
        return Decision(denied=forged([f"label {GANG_LABEL}={shown(own)}"]))
    if scheduler in settings.coscheduler_names:
        intents += [
            SetSchedulerName(settings.default_scheduler),
            SetAnnotation(REQUESTED_SCHEDULER, scheduler),
        ]
    if markers:
        gang = markers[0]
        if spec.get("nodeName"):
            return Decision(
                denied=(
                    f"pod is a member of gang {gang.gang_name} ({gang.describe()}) but sets "
                    f"spec.nodeName={shown(spec['nodeName'])}: a pod with nodeName skips scheduling, so "
                    f"quorum cannot hold it until the whole gang fits. Remove spec.nodeName (to pin it, use "
                    f"a nodeSelector on kubernetes.io/hostname) or remove the group marker."
                )
            )
        if gang.source in SIZED_BY_PODS:
            try:
                parse_min_available(gang.min_available, gang.size_key)
            except BadMinAvailable as err:
                return Decision(
                    denied=f"pod is a member of {gang.describe()} (gang {gang.gang_name}), but {err}."
                )
        if len(markers) > 1:
            others = ", ".join(m.describe() for m in markers[1:])
            warnings.append(
                f"pod names several groups; it joins {gang.describe()} (gang {gang.gang_name}) "
                f"and ignores {others}"
            )
        if settings.placement is Placer.QUORUM:
            intents.append(AddSchedulingGate(GATE))
        elif gang.source is not GangSource.WORKLOAD_POD_GROUP:
            if isinstance(group, str) and group and group != delegated_pod_group(gang):
                return Decision(denied=named_elsewhere(gang.gang_name, gang.describe(), group))
            intents.append(SetSchedulingGroup(delegated_pod_group(gang)))
        intents.append(SetLabel(GANG_LABEL, gang.gang_name))
    return Decision(intents=intents, warnings=warnings)


def named_elsewhere(gang: str, group: str, pod_group: str) -> str:
    """The refusal of a pod whose gang kube-scheduler would not see as a gang (the same words in
    quorum-gang-pods, manifests/36-pod-policies.yaml)."""
    return (
        f"pod is a member of gang {gang} ({group}) but sets spec.schedulingGroup.podGroupName="
        f"{shown(pod_group)}: with placement kube-scheduler, quorum makes the pod name the Kubernetes "
        f"PodGroup {gang}, which kube-scheduler places as one gang. Remove spec.schedulingGroup, or "
        f"remove the other group marker."
    )


def forged(keys: list[str]) -> str:
    """The refusal of quorum.dev/* keys a pod sets itself, each `label K='V'` or `annotation K='V'`
    (the same words in quorum-gang-pods, manifests/36-pod-policies.yaml)."""
    return (
        f"pod sets {', '.join(keys)}: quorum.dev/* labels and annotations are quorum's (it sets "
        f"quorum.dev/gang to the gang that the pod's group marker names). "
        + ("Remove it." if len(keys) == 1 else "Remove them.")
    )
