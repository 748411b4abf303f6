"""Plain-data builders for policy tests."""

from __future__ import annotations

import json
from typing import Any

from quorum.webhooks.review import AdmissionRequest, UserInfo

GROUPS = {
    "Pod": "",
    "Node": "",
    "Namespace": "",
    "Deployment": "apps",
    "ReplicaSet": "apps",
    "StatefulSet": "apps",
    "DaemonSet": "apps",
    "Job": "batch",
    "CronJob": "batch",
}


def request(
    kind: str,
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None = None,
    *,
    operation: str = "CREATE",
    user: str = "customer@example.com",
    groups: tuple[str, ...] = ("quorum:customers", "system:authenticated"),
    name: str = "x",
) -> AdmissionRequest:
    return AdmissionRequest(
        uid="uid-1",
        kind=kind,
        group=GROUPS.get(kind, ""),
        operation=operation,
        namespace="ns",
        name=name,
        user=UserInfo(user, groups),
        object=obj,
        old_object=old,
    )


def pod(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    spec.setdefault("containers", [{"name": "c", "image": "pause"}])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": labels or {}},
        "spec": spec,
    }


def gpu_container(n: str = "1", section: str = "limits", resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    return {"name": "g", "image": "cuda", "resources": {section: {resource: n}}}


def workload(kind: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    template = {
        "metadata": {"labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "pause"}], **spec.pop("pod", {})},
    }
    if kind == "CronJob":
        body: dict[str, Any] = {"jobTemplate": {"spec": {"template": template, **spec}}}
    else:
        body = {"template": template, **spec}
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "w"}, "spec": body}


def review_body(
    kind: str,
    obj: dict[str, Any] | None,
    uid: str = "uid-1",
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    user: str = "customer@example.com",
) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": GROUPS.get(kind, ""), "version": "v1", "kind": kind},
                "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
                "operation": operation,
                "namespace": "ns",
                "name": "x",
                "userInfo": {"username": user, "groups": ["system:authenticated"]},
                "object": obj,
                "oldObject": old,
            },
        }
    ).encode()
