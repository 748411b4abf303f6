"""Topology: a gang whose pods must all be in one domain of a node label (a rack, a block, a
zone) — Kubernetes 1.36's `schedulingConstraints.topology[].key`, or the annotation
`quorum.dev/topology-key` on the seeds' PodGroups.

The planner tries the domains in order of least waste: the domain with the smallest free
capacity (in pods of the gang's biggest shape) that still fits the gang, so that large domains
stay free for large gangs. When none fits, it says why per domain, in numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from quorum.core.index import Key, Shape, ShapeEntry
from quorum.core.model import Node


@dataclass
class DomainShape:
    """One shape's nodes within one domain: what the placement functions read of a ShapeEntry."""

    ordered: list[tuple[Key, Node]] = field(default_factory=list)  # with room, best fit first
    eligible: dict[str, Node] = field(default_factory=dict)
    room: dict[str, int] = field(default_factory=dict)  # slots per node with room
    total: int = 0  # such pods that fit in the domain
    with_room: int = 0


@dataclass
class Domain:
    value: str
    shapes: dict[Shape, DomainShape] = field(default_factory=dict)

    def capacity(self, shape: Shape) -> int:
        return self.shapes[shape].total if shape in self.shapes else 0

    @property
    def nodes(self) -> int:
        return len({name for s in self.shapes.values() for name in s.eligible})


def domains_of(entries: Mapping[Shape, ShapeEntry], key: str) -> tuple[list[Domain], int]:
    """The domains of `key` among the eligible nodes of the gang's shapes, and how many eligible
    nodes have no such label (they are in no domain). One sweep over each shape's nodes."""
    domains: dict[str, Domain] = {}
    unlabeled: set[str] = set()
    for shape, entry in entries.items():
        for name, node in entry.eligible.items():
            value = node.labels.get(key)
            if value is None:
                unlabeled.add(name)
                continue
            view = domains.setdefault(value, Domain(value)).shapes.setdefault(shape, DomainShape())
            view.eligible[name] = node
            slots = entry.room.get(name, 0)
            if slots > 0:
                view.room[name] = slots
            view.total += slots
            view.with_room += slots > 0
        for item in entry.ordered:  # keeps best-fit order within each domain
            value = item[1].labels.get(key)
            if value is not None:
                domains[value].shapes[shape].ordered.append(item)
    return list(domains.values()), len(unlabeled)


def least_waste_first(domains: list[Domain], shape: Shape) -> list[Domain]:
    """Domains in the order to try them: smallest free capacity for the gang first."""
    return sorted(domains, key=lambda d: (d.capacity(shape), d.value))


def noun(key: str) -> str:
    """`network.topology.kubernetes.io/rack` -> `rack`: how a person names the domain."""
    return key.rsplit("/", 1)[-1]


def explain_domains(key: str, needed: int, domains: list[Domain], shape: Shape, unlabeled: int) -> str:
    """Why no single domain fits, domain by domain, the roomiest first (at most 6 named)."""
    if not domains:
        return f"needs {needed} pods in one {noun(key)} (node label {key}); no eligible node has that label"
    ranked = sorted(domains, key=lambda d: (-d.capacity(shape), d.value))
    parts = []
    for domain in ranked[:6]:
        view = domain.shapes.get(shape, DomainShape())
        parts.append(
            f"{noun(key)} {domain.value}: {view.with_room} of {len(view.eligible)} nodes have room "
            f"({view.total} pods)"
        )
    if len(ranked) > 6:
        parts.append(f"{len(ranked) - 6} more {noun(key)}s with less room")
    message = f"needs {needed} pods in one {noun(key)} (node label {key}); none has room: " + "; ".join(parts)
    if unlabeled:
        message += f"; {unlabeled} eligible nodes have no {key} label"
    return message
