"""`quorum.dev/*` labels and annotations are quorum's: they bind a pod to its gang. One is the
tenant's (`TENANT_ANNOTATIONS`): `quorum.dev/member-loss-policy`, the only place a label-only
gang can say what it gets when it loses members (docs/lifecycle.md); it may be set on a pod and
in a template like any annotation of the tenant's.

On Pod CREATE, a value other than the one quorum sets is denied (the label `quorum.dev/gang`
must name the pod's gang; `quorum.dev/requested-scheduler` must record a rewritten coscheduler
name); on UPDATE any change is denied except to quorum's operator identity; a workload template
that carries one is denied. Never stripped: stripping could orphan a pod from its ReplicaSet's
selector."""

from __future__ import annotations

from quorum.core.gangs import gang_markers, is_gated
from quorum.core.lifecycle import MEMBER_LOSS_ANNOTATION
from quorum.webhooks.objects import JSONObject, annotations_of, dig, labels_of, pod_shape, string_map
from quorum.webhooks.policies.gang_gate import GANG_LABEL, REQUESTED_SCHEDULER, forged
from quorum.webhooks.review import AdmissionRequest, Decision, shown
from quorum.webhooks.settings import WebhookSettings

PREFIX = "quorum.dev/"
# The quorum.dev/* keys a tenant may set (annotations; no label is a tenant's). The table in
# docs/webhooks.md, "Whose quorum.dev keys", lists every key and whose it is.
TENANT_ANNOTATIONS = frozenset({MEMBER_LOSS_ANNOTATION})


def _quorum_keys(obj: JSONObject | None, where: str) -> dict[str, object]:
    """The quorum.dev/* keys that are quorum's (the tenant's own left out), with their values."""
    values = string_map(dig(obj, "metadata", where))
    tenants = TENANT_ANNOTATIONS if where == "annotations" else frozenset()
    return {k: v for k, v in values.items() if k.startswith(PREFIX) and k not in tenants}


def _template_keys(obj: JSONObject | None, kind: str) -> dict[str, dict[str, object]]:
    """The template's quorum.dev/* labels and annotations, with their values."""
    template = dig(
        obj, *("spec", "jobTemplate", "spec", "template") if kind == "CronJob" else ("spec", "template")
    )
    return {where: _quorum_keys(template, where) for where in ("labels", "annotations")}


def _expected_on_create(obj: JSONObject, settings: WebhookSettings) -> dict[tuple[str, str], object]:
    """What quorum itself puts on a new pod, given the object after mutation."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    labels = labels_of(obj)
    group = dig(spec, "schedulingGroup", "podGroupName")
    markers = gang_markers(
        labels if isinstance(labels, dict) else {},
        group if isinstance(group, str) else None,
        annotations_of(obj),
        volcano=settings.volcano_dialect,
    )
    expected: dict[tuple[str, str], object] = {}
    if markers:
        expected[("labels", GANG_LABEL)] = markers[0].gang_name
    elif isinstance(labels, dict) and str(labels.get(GANG_LABEL, "")).startswith("wpg-") and is_gated(obj):
        # The mutating webhook saw spec.schedulingGroup, gated the pod, and the apiserver dropped
        # the field afterwards (its feature gate is off): the operator releases such pods; let
        # them be created. Ungated, the label is a tenant's claim on another gang: refused.
        expected[("labels", GANG_LABEL)] = labels[GANG_LABEL]
    requested = annotations_of(obj).get(REQUESTED_SCHEDULER)
    if requested in settings.coscheduler_names and spec.get("schedulerName") == settings.default_scheduler:
        expected[("annotations", REQUESTED_SCHEDULER)] = requested
    return expected


def validate(request: AdmissionRequest, settings: WebhookSettings) -> Decision:
    if request.operation not in ("CREATE", "UPDATE") or request.object is None:
        return Decision()
    if request.user.username in settings.operator_users:
        return Decision()
    obj = request.object
    if request.kind != "Pod":
        if pod_shape(request.kind, obj) is None:
            return Decision()
        found = _template_keys(obj, request.kind)
        before = _template_keys(request.old_object, request.kind)
        # Added or changed; unchanged ones were judged before, and removing one is the fix.
        keys = sorted(
            {k for where, keys in found.items() for k, v in keys.items() if before[where].get(k, v) != v}
            | {k for where, keys in found.items() for k in keys if k not in before[where]}
        )
        if not keys:
            return Decision()
        return Decision(
            denied=(
                f"{request.kind} {request.name or '(new)'}: the pod template carries {', '.join(keys)}; "
                f"quorum.dev/* labels and annotations are set by quorum on each pod (they bind it to "
                f"its gang). Remove them from the template; name the group with its own label "
                f"(e.g. pod-group.scheduling.sigs.k8s.io: <PodGroup>)."
            )
        )
    wrong: list[str] = []
    if request.operation == "CREATE":
        expected = _expected_on_create(obj, settings)
        for where in ("labels", "annotations"):
            for key, value in _quorum_keys(obj, where).items():
                if expected.get((where, key), object()) != value:
                    wrong.append(f"{where[:-1]} {key}={shown(value)}")
        return Decision(denied=forged(wrong)) if wrong else Decision()
    for where in ("labels", "annotations"):
        new, old = _quorum_keys(obj, where), _quorum_keys(request.old_object, where)
        for key in sorted(new.keys() | old.keys()):
            if new.get(key) != old.get(key):
                wrong.append(f"{where[:-1]} {key}")
    if wrong:
        return Decision(
            denied=(
                f"pod {request.name}: {', '.join(wrong)} may be changed only by quorum "
                f"({', '.join(settings.operator_users)}): it binds the pod to its gang."
            )
        )
    return Decision()
