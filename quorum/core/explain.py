"""Why a gang does not fit, in numbers a person can act on; how resources are written."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from quorum.core.index import ShapeEntry
from quorum.core.model import Gang, Node, Pod, Resources

GiB = 1024**3 * 1000  # milli-bytes


def explain(
    gang: Gang,
    needed: int,
    pods: Sequence[Pod],
    placement: Sequence[tuple[Pod, Node]],
    entries: Mapping[tuple[object, ...], ShapeEntry],
    node_count: int,
) -> str:
    """Why the gang does not fit, in numbers a person can act on (from the index's totals): the
    first shape (in the order of `pods`) of which some pods were not placed."""
    placed = Counter(p.shape for p, _ in placement)
    counts = Counter(p.shape for p in pods)
    pod = next((p for p in pods if placed[p.shape] < counts[p.shape]), None)
    entry = entries.get(pod.shape) if pod is not None else None
    if pod is None or entry is None:  # every pod placed, yet too few (or a shape not indexed)
        return f"needs {needed} pods placed together; only {len(placement)} of the gang's pods fit together"
    same = counts[pod.shape]
    parts = [f"needs {needed} pods placed together; {same} pods × {describe(pod.requests)}"]
    note = f"{len(entry.eligible)} of {node_count} nodes eligible"
    if entry.refusals:
        by_count = sorted(entry.refusals.items(), key=lambda item: (-item[1], item[0]))
        note += " (" + ", ".join(f"{n} {r}" for r, n in by_count) + ")"
    parts.append(note)
    with_room, per_node = entry.with_room, entry.most_on_one
    verb = "has" if with_room == 1 else "have"
    parts.append(f"{with_room} {verb} room for one" + (f" (up to {per_node} each)" if per_node > 1 else ""))
    if with_room == 0 and (bigger := bigger_than_any_node(pod, entry.eligible.values())):
        parts.append(bigger)
    if entry.total < same:
        parts.append(f"{entry.total} such pods fit in all: short by {same - entry.total}")
    else:
        parts.append(f"only {len(placement)} of the gang's pods fit together")
    return "; ".join(parts)


def bigger_than_any_node(pod: Pod, nodes: Iterable[Node]) -> str:
    """What of one pod no node of `nodes` could hold even empty (its allocatable), or ""."""
    largest: dict[str, int] = {}
    for node in nodes:
        for k, v in node.allocatable.items():
            largest[k] = max(largest.get(k, 0), v)
    over = [
        (k, v, largest.get(k, 0)) for k, v in pod.requests.items() if v > largest.get(k, 0) and k != "pods"
    ]
    if not largest or not over:
        return ""
    said = ", ".join(f"{amount(k, v)} {k} (the largest has {amount(k, most)})" for k, v, most in over)
    return f"one pod asks more than any of them can hold even empty: {said}"


def amount(resource: str, milli_units: int) -> str:
    """A resource amount as a person writes it: "8", "250m", "64Gi" (any size of integer)."""
    try:
        if resource == "memory" or resource.endswith("storage"):
            return f"{milli_units / GiB:g}Gi"
        value = milli_units / 1000
    except OverflowError:  # beyond a float: the integer, in units
        return f"{milli_units // (GiB if resource == 'memory' or resource.endswith('storage') else 1000)}"
    return f"{value:g}" if abs(value) >= 1 or value == 0 else f"{milli_units}m"


def describe(requests: Resources) -> str:
    """ "8 nvidia.com/gpu, 16 cpu, 64Gi memory" (the pod count is left out)."""
    order = sorted((k for k in requests if k != "pods"), key=lambda k: (k in ("cpu", "memory"), k))
    return ", ".join(f"{amount(k, requests[k])} {k}" for k in order if requests[k] > 0) or "no resources"
