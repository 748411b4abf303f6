"""A pod's effective resource requests, as kube-scheduler counts them: one rule for the planner,
the operator's ledger, preemption and the SUNK scheduler (pure: plain pod dicts in)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quorum.core.model import add, resources

JSON = dict[str, Any]


def _max(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: max(a.get(k, 0), b.get(k, 0)) for k in a.keys() | b.keys()}


def _requests(container: Any) -> dict[str, int]:
    if not isinstance(container, dict):
        return {}
    res = container.get("resources") or {}
    # The apiserver defaults requests to limits; read limits too for objects not yet defaulted.
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return resources(merged)


def pod_requests(pod: JSON) -> dict[str, int]:
    """Effective requests as kube-scheduler counts them (milli-units): app containers and
    restartable init containers (sidecars) add up; each regular init container runs alone with
    the sidecars started before it, so the pod needs the larger of that and the steady state;
    plus overhead; plus one pod."""
    spec = pod.get("spec") or {}
    steady: dict[str, int] = {}
    for c in spec.get("containers") or []:
        steady = add(steady, _requests(c))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for c in spec.get("initContainers") or []:
        if isinstance(c, dict) and c.get("restartPolicy") == "Always":
            sidecars = add(sidecars, _requests(c))
        else:
            init_peak = _max(init_peak, add(sidecars, _requests(c)))
    total = add(_max(add(steady, sidecars), init_peak), resources(spec.get("overhead")))
    total["pods"] = 1000
    return total
