"""SUNK nodes (seed 002): a DaemonSet that can run on nodes Slurm shares must tolerate the
taints those nodes carry — `sunk.coreweave.com/lock=true:NoExecute` (a Slurm job's prolog sets
it and evicts every pod that does not tolerate it), `is_cpu_compute`, `is_gpu` and
`node.coreweave.cloud/reserved`. On DaemonSet CREATE, and on an UPDATE that changes the
template's tolerations or node selection, a DaemonSet that lacks any of them gets a warning
naming the missing ones and the lines to add. It never denies: a DaemonSet meant for other
nodes is not wrong, and the warning reaches the person who applied it.

A DaemonSet cannot land on SUNK nodes only when its template rules them out by the node label
`settings.sunk_node_label` (SUNK nodes carry it as "true"): a nodeSelector with another value,
or a required node affinity every term of which excludes "true"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quorum.webhooks.objects import dig
from quorum.webhooks.review import AdmissionRequest, Decision, shown
from quorum.webhooks.settings import WebhookSettings

MAX_TOLERATIONS = 1000  # more than the apiserver would take in any real template


@dataclass(frozen=True)
class Taint:
    key: str
    value: str | None  # None: any value will do (a toleration with Equal must name one, though)
    effect: str | None  # None: the effect is not known; a toleration of any effect will do
    line: str  # the toleration to add, as YAML

    def tolerated_by(self, toleration: Any) -> bool:
        """Kubernetes' rule: an empty key with Exists tolerates every taint; else the key must
        match, the effect (when given) too, and the value unless the operator is Exists."""
        if not isinstance(toleration, dict):
            return False
        key, operator, effect = (
            toleration.get("key"),
            toleration.get("operator") or "Equal",
            toleration.get("effect"),
        )
        if effect not in (None, "") and self.effect is not None and effect != self.effect:
            return False
        if key in (None, ""):
            return operator == "Exists"
        if key != self.key:
            return False
        if operator == "Exists":
            return True
        value = toleration.get("value")
        return operator == "Equal" and isinstance(value, str) and value != "" and self.value in (None, value)


def sunk_taints(settings: WebhookSettings) -> tuple[Taint, ...]:
    reserved = settings.sunk_reserved_value
    reserved_line = (
        f'{{key: node.coreweave.cloud/reserved, operator: Equal, value: "{reserved}"}}'
        if reserved
        else "{key: node.coreweave.cloud/reserved, operator: Exists}"
    )
    return (
        Taint("sunk.coreweave.com/lock", "true", "NoExecute",
              '{key: sunk.coreweave.com/lock, operator: Equal, value: "true"}'),
        Taint("is_cpu_compute", None, "NoSchedule", "{key: is_cpu_compute, operator: Exists}"),
        Taint("is_gpu", None, "PreferNoSchedule", "{key: is_gpu, operator: Exists}"),
        Taint("node.coreweave.cloud/reserved", reserved, None, reserved_line),
    )  # fmt: skip


def _excludes_sunk_nodes(spec: dict[str, Any], label: str) -> bool:
    selector = spec.get("nodeSelector")
    if isinstance(selector, dict) and label in selector and selector[label] != "true":
        return True
    terms = dig(
        spec,
        "affinity",
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "nodeSelectorTerms",
    )
    if not isinstance(terms, list) or not terms:
        return False
    return all(_term_excludes(term, label) for term in terms[:MAX_TOLERATIONS])


def _term_excludes(term: Any, label: str) -> bool:
    expressions = term.get("matchExpressions") if isinstance(term, dict) else None
    for e in expressions if isinstance(expressions, list) else ():
        if not isinstance(e, dict) or e.get("key") != label:
            continue
        listed = e.get("values")
        values: list[Any] = listed if isinstance(listed, list) else []
        operator = e.get("operator")
        if operator == "DoesNotExist" or (operator == "NotIn" and "true" in values):
            return True
        if operator == "In" and "true" not in values:
            return True
    return False


def _placement(spec: Any) -> tuple[Any, Any, Any]:
    """What decides where its pods may go; absent fields as empty (as the matchCondition sees)."""
    if not isinstance(spec, dict):
        return ([], {}, {})
    return (spec.get("tolerations") or [], spec.get("nodeSelector") or {}, spec.get("affinity") or {})


def validate(request: AdmissionRequest, settings: WebhookSettings) -> Decision:
    if not settings.sunk_daemonset_warnings or request.kind != "DaemonSet" or request.object is None:
        return Decision()
    if request.operation not in ("CREATE", "UPDATE"):
        return Decision()
    spec = dig(request.object, "spec", "template", "spec")
    if not isinstance(spec, dict):
        return Decision()
    if request.operation == "UPDATE" and _placement(spec) == _placement(
        dig(request.old_object, "spec", "template", "spec")
    ):
        return Decision()  # its tolerations and node selection did not change: judged before
    if _excludes_sunk_nodes(spec, settings.sunk_node_label):
        return Decision()
    tolerations = spec.get("tolerations")
    tolerations = tolerations[:MAX_TOLERATIONS] if isinstance(tolerations, list) else []
    missing = [t for t in sunk_taints(settings) if not any(t.tolerated_by(x) for x in tolerations)]
    if not missing:
        return Decision()
    names = ", ".join(f"{t.key}={t.value}:{t.effect}" if t.value and t.effect else t.key for t in missing)
    keys = {t.key for t in missing}
    wrong = [
        x for x in tolerations if isinstance(x, dict) and isinstance(x.get("key"), str) and x["key"] in keys
    ]
    extra = ""
    if wrong:
        fields = [f for f in ("key", "operator", "value", "effect") if f in wrong[0]]
        found = ", ".join(f"{f}: {shown(wrong[0][f])}" for f in fields)
        extra = f" (found {{{found}}}, which does not match)"
    lines = " ".join(f"- {t.line}" for t in missing)
    return Decision(
        warnings=[
            f"DaemonSet {shown(request.name)} can run on SUNK (Slurm) nodes but does not tolerate "
            f"{names}{extra}: its pods would be kept off those nodes, or evicted whenever a Slurm job "
            f"locks one. Add to spec.template.spec.tolerations: {lines} (or keep it off SUNK nodes with "
            f"a required node affinity {{key: {settings.sunk_node_label}, operator: NotIn, values: "
            f'["true"]}}).'
        ]
    )
