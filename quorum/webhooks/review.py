"""AdmissionReview `admission.k8s.io/v1` in and out, by hand and fast.

Only the fields policies read are lifted into `AdmissionRequest`; `object` and `oldObject`
stay plain dicts (no model of a whole Pod on the hot path). Anything malformed raises
`BadReview` with a message fit to send back in an HTTP 400.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

API_VERSION = "admission.k8s.io/v1"
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})

JSONObject = dict[str, Any]


class BadReview(ValueError):
    """The body is not an AdmissionReview we can answer; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class UserInfo:
    username: str
    groups: tuple[str, ...] = ()


@dataclass(slots=True)
class AdmissionRequest:
    uid: str
    kind: str  # request.kind.kind, e.g. "Pod"
    group: str
    operation: str
    namespace: str
    name: str
    user: UserInfo
    object: JSONObject | None
    old_object: JSONObject | None
    sub_resource: str = ""
    dry_run: bool = False


@dataclass(slots=True)
class Decision:
    """What policies answer: allowed unless `denied` holds a message; mutation intents (for the
    patch builder) and warnings for the client."""

    denied: str | None = None
    code: int = 403
    intents: list[Any] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return self.denied is None


def _str(value: Any, where: str, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise BadReview(f"{where} must be a non-empty string")
    return value


def _object(value: Any, where: str) -> JSONObject | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadReview(f"{where} must be an object or null, not {type(value).__name__}")
    return value


def parse_review(body: bytes) -> AdmissionRequest:
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadReview(f"body is not valid JSON: {err}") from None
    if not isinstance(review, dict):
        raise BadReview(f"body must be a JSON object (an AdmissionReview), not {type(review).__name__}")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(
            f"expected apiVersion {API_VERSION} kind AdmissionReview, got "
            f"{review.get('apiVersion')!r} {review.get('kind')!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("AdmissionReview has no request object")
    uid = _str(request.get("uid"), "request.uid")
    kind = request.get("kind")
    if not isinstance(kind, dict):
        raise BadReview("request.kind must be an object {group, version, kind}")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise BadReview(f"request.operation must be one of {sorted(OPERATIONS)}, got {operation!r}")
    user = request.get("userInfo") or {}
    if not isinstance(user, dict):
        raise BadReview("request.userInfo must be an object")
    groups = user.get("groups") or ()
    if not isinstance(groups, list | tuple) or not all(isinstance(g, str) for g in groups):
        raise BadReview("request.userInfo.groups must be a list of strings")
    return AdmissionRequest(
        uid=uid,
        kind=_str(kind.get("kind"), "request.kind.kind"),
        group=_str(kind.get("group"), "request.kind.group", required=False),
        operation=operation,
        namespace=_str(request.get("namespace"), "request.namespace", required=False),
        name=_str(request.get("name"), "request.name", required=False),
        user=UserInfo(_str(user.get("username"), "request.userInfo.username", required=False), tuple(groups)),
        object=_object(request.get("object"), "request.object"),
        old_object=_object(request.get("oldObject"), "request.oldObject"),
        sub_resource=_str(request.get("subResource"), "request.subResource", required=False),
        dry_run=bool(request.get("dryRun")),
    )


def response_body(
    uid: str,
    decision: Decision,
    patch: list[JSONObject] | None = None,
) -> bytes:
    """The AdmissionReview answer. `uid` is always the request's."""
    response: JSONObject = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "code": decision.code,
            "message": decision.denied,
            "reason": "Forbidden" if decision.code == 403 else "BadRequest",
        }
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if decision.warnings:
        response["warnings"] = decision.warnings
    return json.dumps(
        {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}, separators=(",", ":")
    ).encode()


def error_body(message: str) -> bytes:
    """The short JSON error of an HTTP 400."""
    return json.dumps({"error": message}).encode()
