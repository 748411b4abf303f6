"""Which webhook (URL path) runs which policies, on which kinds, and what it answers when a
policy fails unexpectedly. Adding a policy = one module in `policies/` + one line here.

Failure modes (when a policy raises; the error is logged with the request uid and counted):
- `mutate-pods` ALLOWS without a patch: pod creation must not depend on a policy bug, and it
  matches the webhook's `failurePolicy: Ignore` (a CPU pod without the toleration still runs,
  on a GPU node, whose taint is only PreferNoSchedule; a gang pod without its gate is denied
  by the backstop ValidatingAdmissionPolicy, and its controller retries).
- the validating webhooks DENY: they guard label domains and are only called for objects
  carrying those labels (matchConditions), so denying is safe and visible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from quorum.webhooks.objects import LABELLED_KINDS, WORKLOAD_KINDS
from quorum.webhooks.policies import (
    cpu_toleration,
    gang_gate,
    interruptable,
    ordered_statefulset,
    quorum_labels,
    reserved_labels,
    sunk_daemonsets,
)
from quorum.webhooks.review import AdmissionRequest, Decision
from quorum.webhooks.settings import WebhookSettings

Policy = Callable[[AdmissionRequest, WebhookSettings], Decision]


class OnError(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True)
class Webhook:
    name: str
    path: str
    mutating: bool
    kinds: frozenset[str]
    policies: tuple[Policy, ...]
    on_error: OnError


WEBHOOKS: tuple[Webhook, ...] = (
    Webhook(
        "mutate-pods",
        "/mutate/pods",
        True,
        frozenset({"Pod"}),
        (cpu_toleration.mutate, gang_gate.mutate),
        OnError.ALLOW,
    ),
    # Pods' labels and quorum keys in one webhook: one matchConditions evaluation (one conversion
    # of the pod by the apiserver) per pod create and update, not one per policy.
    Webhook(
        "validate-pods",
        "/validate/pods",
        False,
        frozenset({"Pod"}),
        (reserved_labels.validate, quorum_labels.validate),
        OnError.DENY,
    ),
    Webhook(
        "validate-reserved-labels",
        "/validate/reserved-labels",
        False,
        LABELLED_KINDS | WORKLOAD_KINDS,
        (reserved_labels.validate,),
        OnError.DENY,
    ),
    Webhook(
        "validate-interruptable",
        "/validate/interruptable",
        False,
        frozenset({"Pod"}) | WORKLOAD_KINDS,
        (interruptable.validate,),
        OnError.DENY,
    ),
    Webhook(
        "validate-sunk-daemonsets",
        "/validate/sunk-daemonsets",
        False,
        frozenset({"DaemonSet"}),
        (sunk_daemonsets.validate,),
        OnError.ALLOW,  # it only warns: an error must not stop a DaemonSet
    ),
    Webhook(
        "validate-gangs",
        "/validate/gangs",
        False,
        frozenset({"Pod"}) | WORKLOAD_KINDS,
        (quorum_labels.validate, ordered_statefulset.validate),
        OnError.DENY,
    ),
)
