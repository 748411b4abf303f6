"""One JSON patch from the mutation intents of every policy.

Policies never write JSON patch themselves: they say what they want (`AddToleration`,
`SetLabel`, ...). `build_patch` looks at the object once, creates each missing map or list once
(so two policies never both `add /metadata/labels`), drops intents the object already
satisfies, and so is idempotent: the patched object yields an empty patch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JSONObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class SetLabel:
    key: str
    value: str


@dataclass(frozen=True, slots=True)
class SetAnnotation:
    key: str
    value: str


@dataclass(frozen=True, slots=True)
class AddToleration:
    toleration: tuple[tuple[str, str], ...]  # sorted items, so intents are hashable

    @classmethod
    def of(cls, toleration: dict[str, str]) -> AddToleration:
        return cls(tuple(sorted(toleration.items())))


@dataclass(frozen=True, slots=True)
class AddSchedulingGate:
    name: str


@dataclass(frozen=True, slots=True)
class SetSchedulerName:
    name: str


@dataclass(frozen=True, slots=True)
class SetSchedulingGroup:
    """`spec.schedulingGroup.podGroupName`, where the pod names no scheduling group yet."""

    pod_group: str


Intent = SetLabel | SetAnnotation | AddToleration | AddSchedulingGate | SetSchedulerName | SetSchedulingGroup


def escape(key: str) -> str:
    """A map key as a JSON pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _map_ops(parent: JSONObject, path: str, field: str, wanted: dict[str, str]) -> list[JSONObject]:
    current = parent.get(field)
    if not isinstance(current, dict):
        return [{"op": "add", "path": f"{path}/{field}", "value": wanted}] if wanted else []
    ops: list[JSONObject] = []
    for key, value in wanted.items():
        if key not in current:
            ops.append({"op": "add", "path": f"{path}/{field}/{escape(key)}", "value": value})
        elif current[key] != value:
            ops.append({"op": "replace", "path": f"{path}/{field}/{escape(key)}", "value": value})
    return ops


def _list_ops(parent: JSONObject, path: str, field: str, wanted: list[Any]) -> list[JSONObject]:
    current = parent.get(field)
    if not isinstance(current, list):
        return [{"op": "add", "path": f"{path}/{field}", "value": wanted}] if wanted else []
    return [
        {"op": "add", "path": f"{path}/{field}/-", "value": item} for item in wanted if item not in current
    ]


def build_patch(obj: JSONObject, intents: list[Intent]) -> list[JSONObject]:
    """The JSON patch that applies every intent to `obj` (a Pod), and nothing else."""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    tolerations: list[dict[str, str]] = []
    gates: list[dict[str, str]] = []
    scheduler: str | None = None
    scheduling_group: str | None = None
    for intent in intents:
        match intent:
            case SetLabel(key, value):
                labels[key] = value
            case SetAnnotation(key, value):
                annotations[key] = value
            case AddToleration(items):
                toleration = dict(items)
                if toleration not in tolerations:
                    tolerations.append(toleration)
            case AddSchedulingGate(name):
                if {"name": name} not in gates:
                    gates.append({"name": name})
            case SetSchedulerName(name):
                scheduler = name
            case SetSchedulingGroup(pod_group):
                scheduling_group = pod_group
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    spec = obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    ops: list[JSONObject] = []
    if (labels or annotations) and not isinstance(obj.get("metadata"), dict):
        ops.append({"op": "add", "path": "/metadata", "value": {}})
    ops += _map_ops(metadata, "/metadata", "labels", labels)
    ops += _map_ops(metadata, "/metadata", "annotations", annotations)
    ops += _list_ops(spec, "/spec", "tolerations", tolerations)
    ops += _list_ops(spec, "/spec", "schedulingGates", gates)
    if scheduler is not None and spec.get("schedulerName") != scheduler:
        op = "replace" if "schedulerName" in spec else "add"
        ops.append({"op": op, "path": "/spec/schedulerName", "value": scheduler})
    if scheduling_group is not None and not spec.get("schedulingGroup"):
        group = {"podGroupName": scheduling_group}
        ops.append({"op": "add", "path": "/spec/schedulingGroup", "value": group})
    return ops


def apply_patch(obj: JSONObject, ops: list[JSONObject]) -> JSONObject:
    """A minimal RFC 6902 `add`/`replace` applier for the patches above (tests and tools)."""
    import copy

    result = copy.deepcopy(obj)
    for op in ops:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        target: Any = result
        for token in tokens[:-1]:
            target = target[int(token)] if isinstance(target, list) else target[token]
        last = tokens[-1]
        if isinstance(target, list):
            if last == "-":
                target.append(copy.deepcopy(op["value"]))
            else:
                target.insert(int(last), copy.deepcopy(op["value"]))
        elif op["op"] in ("add", "replace"):
            target[last] = copy.deepcopy(op["value"])
        else:
            raise ValueError(f"unsupported op {op['op']}")
    return result
