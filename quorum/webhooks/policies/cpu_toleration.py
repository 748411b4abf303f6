"""CKS: every pod that requests no accelerator gets the `is_cpu_compute` toleration (seed 002),
so that CPU-only pods may use the CPU nodes (tainted `is_cpu_compute:NoSchedule`)."""

from __future__ import annotations

import functools
from typing import Any

from quorum.core.quantity import QuantityError, parse_quantity
from quorum.webhooks.objects import JSONObject
from quorum.webhooks.patch import AddToleration
from quorum.webhooks.review import AdmissionRequest, Decision
from quorum.webhooks.settings import Toleration, WebhookSettings


def _nonzero(amount: Any) -> bool:
    if not isinstance(amount, str | int | float):
        return True  # not a quantity (its error message would repr a list 1,000 deep): as below
    try:
        return parse_quantity(amount) > 0
    except (QuantityError, TypeError):
        return True  # unreadable: the apiserver will refuse it anyway; do not add a toleration


def _asks_for(resources: Any, names: tuple[str, ...]) -> bool:
    if not isinstance(resources, dict):
        return False
    for section in ("requests", "limits"):
        amounts = resources.get(section)
        if isinstance(amounts, dict):
            for name in names:
                if name in amounts and _nonzero(amounts[name]):
                    return True
    return False


def requests_accelerator(spec: JSONObject, settings: WebhookSettings) -> bool:
    """Does any container, init container or the pod itself ask for an accelerator?"""
    names = settings.accelerator_resources
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        for container in containers if isinstance(containers, list) else ():
            if isinstance(container, dict) and _asks_for(container.get("resources"), names):
                return True
    if _asks_for(spec.get("resources"), names):  # pod-level resources
        return True
    return bool(settings.resource_claims_are_accelerated and spec.get("resourceClaims"))


def tolerates(existing: Any, wanted: dict[str, str]) -> bool:
    """Does an existing toleration already cover `wanted` (an `Exists` toleration)?"""
    if not isinstance(existing, dict):
        return False
    key = existing.get("key")
    operator = existing.get("operator") or "Equal"
    effect = existing.get("effect")
    if key in (None, "") and operator == "Exists":
        return not effect or effect == wanted.get("effect")  # tolerates every taint
    if key != wanted["key"] or operator != "Exists":
        return False
    return not effect or effect == wanted.get("effect")


@functools.lru_cache(maxsize=8)
def _toleration(toleration: Toleration) -> tuple[dict[str, str], AddToleration]:
    as_dict = toleration.as_dict()  # computed once per settings, not per review
    return as_dict, AddToleration.of(as_dict)


def mutate(request: AdmissionRequest, settings: WebhookSettings) -> Decision:
    if request.operation != "CREATE" or request.object is None:
        return Decision()
    spec = request.object.get("spec")
    if not isinstance(spec, dict) or requests_accelerator(spec, settings):
        return Decision()
    wanted, intent = _toleration(settings.cpu_toleration)
    tolerations = spec.get("tolerations")
    if isinstance(tolerations, list) and any(tolerates(t, wanted) for t in tolerations):
        return Decision()
    return Decision(intents=[intent])
