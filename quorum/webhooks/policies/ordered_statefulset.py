"""A StatefulSet gang with `podManagementPolicy: OrderedReady` (the default) cannot form once
it needs more than one pod: the controller creates pod 1 only when pod 0 is Ready, and quorum
holds pod 0 at its gate until the whole gang exists. Warn on the StatefulSet, where the person
who wrote it sees it, and say to use `Parallel`."""

from __future__ import annotations

from quorum.core.gangs import SIZED_BY_PODS, BadMinAvailable, parse_min_available
from quorum.webhooks.objects import dig, gang_of, pod_shape
from quorum.webhooks.review import AdmissionRequest, Decision
from quorum.webhooks.settings import WebhookSettings


def validate(request: AdmissionRequest, settings: WebhookSettings) -> Decision:
    if (
        request.kind != "StatefulSet"
        or request.operation not in ("CREATE", "UPDATE")
        or request.object is None
    ):
        return Decision()
    shape = pod_shape("StatefulSet", request.object)
    if shape is None:
        return Decision()
    marker = gang_of(shape, settings.quorum_scheduler_names)
    if marker is None:
        return Decision()
    policy = dig(request.object, "spec", "podManagementPolicy") or "OrderedReady"
    replicas = dig(request.object, "spec", "replicas")
    replicas = replicas if isinstance(replicas, int) else 1
    if policy != "OrderedReady" or replicas <= 1:
        return Decision()
    if marker.source in SIZED_BY_PODS and _size(marker.min_available) == 1:
        return Decision()  # a gang of one: each pod is its own gang
    return Decision(
        warnings=[
            f"StatefulSet {request.name or '(new)'} is gang {marker.gang_name} with podManagementPolicy "
            f"OrderedReady: the controller creates each pod only after the previous one is Ready, but "
            f"quorum holds every gang pod until the whole gang exists, so the gang never forms. Set "
            f"spec.podManagementPolicy: Parallel."
        ]
    )


def _size(min_available: str | None) -> int | None:
    try:
        return parse_min_available(min_available)
    except BadMinAvailable:
        return None  # its pods are refused at creation, with why (gang_gate)
