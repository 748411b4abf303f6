"""Reading the parts of API objects that policies look at: labels of a Pod, Node or
Namespace, and the pod template of a workload."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from quorum.core.gangs import GangMarker, gang_marker

JSONObject = dict[str, Any]

# kind -> path of its pod template
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
WORKLOAD_KINDS = frozenset(TEMPLATE_PATHS)
LABELLED_KINDS = frozenset({"Pod", "Node", "Namespace"})


def dig(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


@dataclass(frozen=True, slots=True)
class PodShape:
    """The labels and spec of a pod, or of a workload's pod template; `where` names the place
    in the object for messages ("metadata.labels", "spec.template.metadata.labels")."""

    labels: dict[str, str]
    spec: JSONObject
    where: str
    annotations: dict[str, str]  # Volcano's group marker is an annotation


def string_map(value: Any) -> dict[str, str]:
    """A labels or annotations map as the apiserver sends it: string values only. Anything else
    (never from the apiserver) is left out, so no policy compares, formats or hashes a value of
    another type — a list 1,000 levels deep stops `repr` and `==` with a RecursionError."""
    if not isinstance(value, dict):
        return {}
    if all(type(v) is str for v in value.values()):
        return value
    return {k: v for k, v in value.items() if type(v) is str}


def labels_of(obj: JSONObject | None) -> dict[str, str]:
    return string_map(dig(obj, "metadata", "labels"))


def annotations_of(obj: JSONObject | None) -> dict[str, str]:
    return string_map(dig(obj, "metadata", "annotations"))


def pod_shape(kind: str, obj: JSONObject | None) -> PodShape | None:
    """The pod (or pod template) of an object: a Pod itself, or a workload's template."""
    if obj is None:
        return None
    if kind == "Pod":
        spec = obj.get("spec")
        return PodShape(
            labels_of(obj), spec if isinstance(spec, dict) else {}, "metadata.labels", annotations_of(obj)
        )
    path = TEMPLATE_PATHS.get(kind)
    if path is None:
        return None
    template = dig(obj, *path)
    if not isinstance(template, dict):
        return None
    spec = template.get("spec")
    return PodShape(
        labels_of(template),
        spec if isinstance(spec, dict) else {},
        ".".join(path) + ".metadata.labels",
        annotations_of(template),
    )


def has_controller(obj: JSONObject) -> bool:
    owners = dig(obj, "metadata", "ownerReferences")
    return isinstance(owners, list) and any(isinstance(o, dict) and o.get("controller") for o in owners)


def gang_of(shape: PodShape, quorum_schedulers: Collection[str]) -> GangMarker | None:
    """The gang the pod (or the pods of a template) belongs to, per the table in `quorum.core.gangs`."""
    group = dig(shape.spec, "schedulingGroup", "podGroupName")
    return gang_marker(
        shape.labels,
        group if isinstance(group, str) else None,
        shape.spec.get("schedulerName"),
        quorum_schedulers,
        shape.annotations,
    )
