"""AdmissionReview `admission.k8s.io/v1` in and out, by hand and fast.

Only the fields policies read are lifted into `AdmissionRequest`; `object` and `oldObject`
stay plain dicts (no model of a whole Pod on the hot path). Anything malformed raises
`BadReview` with a message fit to send back in an HTTP 400.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import orjson

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


def shown(value: object, limit: int = 60) -> str:
    """A value of the request for a message: strings quoted and cut at `limit` characters,
    anything else by its JSON type (a message never repeats a megabyte, or a deep list)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}… ({len(value)} characters)"
    if value is None or isinstance(value, bool | int | float):  # JSON numbers: at most 20 digits
        return repr(value)
    return "a list" if isinstance(value, list) else "an object"


def _text(request: JSONObject, key: str) -> str:
    """An optional string field ("" when absent)."""
    value = request.get(key)
    if value is None:
        return ""
    if type(value) is not str:
        raise BadReview(f"request.{key} must be a string")
    return value


def parse_review(body: bytes) -> AdmissionRequest:
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise BadReview(f"body is not valid JSON: {err}") from None
    if type(review) is not dict:
        raise BadReview(f"body must be a JSON object (an AdmissionReview), not {type(review).__name__}")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(
            f"expected apiVersion {API_VERSION} kind AdmissionReview, got "
            f"{shown(review.get('apiVersion'))} {shown(review.get('kind'))}"
        )
    request = review.get("request")
    if type(request) is not dict:
        raise BadReview("AdmissionReview has no request object")
    uid = request.get("uid")
    if type(uid) is not str or not uid:
        raise BadReview("request.uid must be a non-empty string")
    kind = request.get("kind")
    if type(kind) is not dict or type(kind.get("kind")) is not str or not kind["kind"]:
        raise BadReview("request.kind must be an object {group, version, kind}")
    group = kind.get("group") or ""
    if type(group) is not str:
        raise BadReview("request.kind.group must be a string")
    operation = request.get("operation")
    if type(operation) is not str or operation not in OPERATIONS:  # a list or map is unhashable
        raise BadReview(f"request.operation must be one of {sorted(OPERATIONS)}, got {shown(operation)}")
    user = request.get("userInfo") or {}
    if type(user) is not dict:
        raise BadReview("request.userInfo must be an object")
    groups = user.get("groups") or ()
    if type(groups) is not list and groups != ():
        raise BadReview("request.userInfo.groups must be a list of strings")
    for g in groups:
        if type(g) is not str:
            raise BadReview("request.userInfo.groups must be a list of strings")
    username = user.get("username") or ""
    if type(username) is not str:
        raise BadReview("request.userInfo.username must be a string")
    obj = request.get("object")
    if obj is not None and type(obj) is not dict:
        raise BadReview(f"request.object must be an object or null, not {type(obj).__name__}")
    old = request.get("oldObject")
    if old is not None and type(old) is not dict:
        raise BadReview(f"request.oldObject must be an object or null, not {type(old).__name__}")
    return AdmissionRequest(
        uid=uid,
        kind=kind["kind"],
        group=group,
        operation=operation,
        namespace=_text(request, "namespace"),
        name=_text(request, "name"),
        user=UserInfo(username, tuple(groups)),
        object=obj,
        old_object=old,
        sub_resource=_text(request, "subResource"),
        dry_run=request.get("dryRun") is True,
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
            "reason": "Forbidden" if decision.code == 403 else "InternalError",
        }
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    if decision.warnings:
        response["warnings"] = decision.warnings
    return orjson.dumps({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response})


def error_body(message: str) -> bytes:
    """The short JSON error of an HTTP 400."""
    return orjson.dumps({"error": message})
