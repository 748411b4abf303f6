"""CKS: `qos.coreweave.cloud/interruptable` says a pod may be evicted at any time (node
upgrades, failed health checks). Its value must be "true" or "false". Setting it to "true"
where eviction hurts — on gang members (distributed training restarts from its last
checkpoint), on StatefulSets (often single-instance databases) and on parallel Jobs — gets a
warning on the workload object, where the person who wrote it sees it (a warning on a pod that
a controller creates reaches the controller, not the person). Settings can make it a denial.

Judged only where a value is new: an update that sets or changes it, or the creation of an
object no controller made (a ReplicaSet, a Job or a pod a controller creates carries its
template's value, judged when the template was written)."""

from __future__ import annotations

from quorum.webhooks.objects import PodShape, dig, gang_of, has_controller, pod_shape
from quorum.webhooks.review import AdmissionRequest, Decision
from quorum.webhooks.settings import InterruptableOnGang, WebhookSettings

ALLOWED = ("true", "false")


def _parallelism(kind: str, obj: dict[str, object]) -> int:
    path = ("spec", "parallelism") if kind == "Job" else ("spec", "jobTemplate", "spec", "parallelism")
    value = dig(obj, *path)
    return value if isinstance(value, int) else 1


def _gang(shape: PodShape, settings: WebhookSettings) -> str | None:
    marker = gang_of(shape, settings.quorum_scheduler_names)
    return marker.group if marker else None


def why_eviction_hurts(request: AdmissionRequest, shape: PodShape, settings: WebhookSettings) -> str | None:
    obj = request.object or {}
    kind = request.kind
    if (group := _gang(shape, settings)) is not None:
        return (
            f"its pods are members of gang {group!r}: evicting one member of a distributed "
            f"training job stops all of it, and it restarts from its last checkpoint"
        )
    if kind == "StatefulSet":
        return (
            "it is a StatefulSet: single-instance databases and other stateful services "
            "lose availability, or data, when their pod is evicted"
        )
    if kind in ("Job", "CronJob") and (n := _parallelism(kind, obj)) > 1:
        return (
            f"it runs {n} pods in parallel: if they work together (distributed training), "
            f"evicting one stops all of them until the last checkpoint"
        )
    return None


def validate(request: AdmissionRequest, settings: WebhookSettings) -> Decision:
    if request.operation not in ("CREATE", "UPDATE") or request.object is None:
        return Decision()
    if request.operation == "CREATE" and has_controller(request.object):
        return Decision()  # judged on its controller's template
    shape = pod_shape(request.kind, request.object)
    if shape is None:
        return Decision()
    key = settings.interruptable_label
    value = shape.labels.get(key)
    if value is None:
        return Decision()
    old_shape = pod_shape(request.kind, request.old_object)
    old_value = old_shape.labels.get(key) if old_shape else None
    if value == old_value:
        return Decision()  # unchanged: judged when it was set
    if value not in ALLOWED:
        return Decision(
            denied=(
                f'{shape.where}["{key}"] is {value!r}; it must be "true" (the pod may be evicted '
                f'at any time) or "false".'
            )
        )
    if value != "true":
        return Decision()
    reason = why_eviction_hurts(request, shape, settings)
    if reason is None:
        return Decision()
    text = (
        f"{key}=true on {request.kind} {request.name or '(new)'}: {reason}. Remove the "
        f'label or set it to "false" unless the workload tolerates eviction.'
    )
    if settings.interruptable_on_gang is InterruptableOnGang.DENY:
        return Decision(denied=text)
    return Decision(warnings=[text])
