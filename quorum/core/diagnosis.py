"""What `quorum explain` says about one gang, and the rows `quorum get` lists: composed from
plain data (the planner's models and answers, or what a Gang's status recorded), on one screen.

`render` keeps any diagnosis within `MAX_LINES` lines of at most `MAX_WIDTH` columns and
`MAX_LINE_BYTES` bytes: every line is cut to the width (wide characters count two), control
characters are shown as `?` (an Event's message is a tenant's text), a character keeps at most
`MAX_MARKS` combining marks (they take no column, so without a limit a line of 100 columns could
be of any length), and when the sections together are too long the longest ones lose their last
lines first, with a line that says how many were left out.
"""

from __future__ import annotations

import textwrap
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from quorum.core.explain import amount
from quorum.core.fit import FitSettings, first_refusal
from quorum.core.index import slots
from quorum.core.model import Node, Pod, Resources
from quorum.core.times import iso, timestamp
from quorum.core.topology import noun

MAX_LINES = 40
MAX_WIDTH = 100
MAX_MARKS = 2  # combining marks kept on one character (Vietnamese stacks two; more is decoration)
# Every character of a line takes a column and UTF-8 has at most 4 bytes a code point: a line is
# at most MAX_WIDTH characters, each with at most MAX_MARKS marks.
MAX_LINE_BYTES = 4 * (1 + MAX_MARKS) * MAX_WIDTH
MAX_EVENTS = 8
JSON = dict[str, Any]

# -- text that fits ---------------------------------------------------------------------------


def printable(text: str) -> str:
    """The text on one line, every control or format character (newlines, escape sequences of
    a terminal; a lone surrogate, which has no UTF-8) shown as `?`, and each character with at
    most `MAX_MARKS` combining marks (the others dropped; marks before any character too)."""
    out = []
    marks = MAX_MARKS  # none may come before the first character
    for c in text:
        if unicodedata.combining(c):
            if marks < MAX_MARKS:
                out.append(c)
                marks += 1
            continue
        out.append("?" if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") else c)
        marks = 0
    return "".join(out)


def columns(text: str) -> int:
    """The columns a terminal gives the text: wide and full-width characters two, combining
    characters none."""
    return sum(_width(c) for c in text)


def _width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def clip(text: str, width: int = MAX_WIDTH) -> str:
    """The text cut to `width` columns, ending in `…` where it was cut."""
    text = printable(text)
    if columns(text) <= width:
        return text
    out, used = [], 0
    for char in text:
        w = _width(char)
        if used + w > width - 1:
            break
        out.append(char)
        used += w
    return "".join(out) + "…"


def wrap(text: str, width: int = MAX_WIDTH, indent: str = "  ") -> list[str]:
    """The text wrapped to `width`, continuation lines indented."""
    lines = textwrap.wrap(
        printable(text), width=width, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False
    )
    return [clip(line, width) for line in lines] or [""]


def listing(head: str, items: Sequence[str], width: int = MAX_WIDTH) -> str:
    """`head` and as many of `items` as fit on one line, `…` when some did not."""
    line = head
    for i, item in enumerate(items):
        candidate = f"{line} {item}" if line == head else f"{line}, {item}"
        rest = ", …" if i < len(items) - 1 else ""
        if columns(printable(candidate + rest)) > width:
            return clip(line + (" …" if line == head else ", …"), width)
        line = candidate
    return clip(line, width)


def human_duration(seconds: float) -> str:
    """3m12s, 45s, 2h5m, 3d4h: as kubectl shows an age."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


# -- nodes --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """Whether one node can take one pod of the gang now, and if not, the first reason."""

    node: str
    reason: str | None  # None: it has room (for `room` such pods)
    room: int = 0
    resource: str | None = None  # for "Insufficient ...": the resource short
    free: int = 0
    needed: int = 0
    domain: str | None = None  # its value of the gang's topology key (None: no such label)


def node_verdicts(
    pod: Pod,
    nodes: Iterable[Node],
    free: Mapping[str, Resources],
    settings: FitSettings,
    topology_key: str | None = None,
) -> list[NodeVerdict]:
    """For each node, what `first_refusal` says of the pod with the node's free room (the
    planner's room after its pass), or how many such pods it has room for (`slots`)."""
    out = []
    for node in nodes:
        room = free.get(node.name, {})
        domain = node.labels.get(topology_key) if topology_key else None
        refusal = first_refusal(pod, node, room, settings)
        if refusal is None:
            out.append(NodeVerdict(node.name, None, slots(pod, room), domain=domain))
        else:
            out.append(
                NodeVerdict(
                    node.name, refusal.reason, 0, refusal.resource, refusal.free, refusal.needed, domain
                )
            )
    return out


def node_lines(verdicts: Sequence[NodeVerdict], width: int = MAX_WIDTH) -> list[str]:
    """Alike nodes together, one line a reason: the nodes with room first, then those short of a
    resource (the closest first), then the others, the commonest reason first."""
    groups: dict[str | None, list[NodeVerdict]] = {}
    for v in verdicts:
        groups.setdefault(v.reason, []).append(v)
    lines = []
    room = sorted(groups.pop(None, []), key=lambda v: (-v.room, v.node))
    if room:
        head = f"{plural(len(room), 'node')} with room ({plural(sum(v.room for v in room), 'pod')} in all):"
        lines.append(listing("  " + head, [f"{v.node} ({v.room})" for v in room], width))
    ordered = sorted(groups.items(), key=lambda g: (g[1][0].resource is None, -len(g[1]), str(g[0])))
    for reason, alike in ordered:
        resource = alike[0].resource
        if resource is not None:
            alike = sorted(alike, key=lambda v: (-v.free, v.node))
            count, needs = plural(len(alike), "node"), f"a pod needs {amount(resource, alike[0].needed)}"
            if len({v.free for v in alike}) == 1:  # all as far from it: their names
                head = f"  {count}: {reason} ({needs}, {amount(resource, alike[0].free)} free):"
                lines.append(listing(head, [v.node for v in alike], width))
            else:
                names = [f"{v.node} {amount(resource, v.free)} free" for v in alike]
                lines.append(listing(f"  {count}: {reason} ({needs}); closest:", names, width))
        else:
            names = sorted(v.node for v in alike)
            lines.append(listing(f"  {plural(len(alike), 'node')}: {reason}:", names, width))
    return lines


def domain_lines(verdicts: Sequence[NodeVerdict], key: str, width: int = MAX_WIDTH) -> list[str]:
    """One line a domain of the topology key, the roomiest first: the room its nodes have for the
    gang's pods, and the first reasons of the others."""
    domains: dict[str, list[NodeVerdict]] = {}
    unlabeled = 0
    for v in verdicts:
        if v.domain is None:
            unlabeled += 1
        else:
            domains.setdefault(v.domain, []).append(v)
    word = noun(key)
    ranked = sorted(domains.items(), key=lambda d: (-sum(v.room for v in d[1]), d[0]))
    lines = []
    for value, members in ranked:
        room = sum(v.room for v in members)
        with_room = sum(1 for v in members if v.room > 0)
        nodes = plural(len(members), "node")
        line = f"  {word} {value}: room for {plural(room, 'pod')} on {with_room} of {nodes}"
        reasons = Counter(v.reason for v in members if v.reason is not None)
        if reasons:
            line += "; " + ", ".join(
                f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda r: (-r[1], r[0]))
            )
        lines.append(clip(line, width))
    if unlabeled:
        lines.append(clip(f"  {plural(unlabeled, 'node')} without the label {key} (in no {word})", width))
    return lines


# -- the diagnosis ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventLine:
    age: float | None  # seconds since it last happened (None: unknown)
    type: str
    reason: str
    message: str
    count: int = 1
    on: str = "Gang"  # the kind it was posted on


@dataclass(frozen=True)
class Diagnosis:
    """Everything `quorum explain` says about one gang, as plain data."""

    namespace: str
    name: str
    view: str  # which view this is, and from what
    phase: str = "Pending"
    waited: float | None = None  # seconds not admitted (None: admitted, or unknown)
    members: int = 0
    min_member: int = 0
    released: int = 0
    bound: int = 0
    reason: str = ""  # why it waits, in a word (the Admitted condition's reason)
    message: str = ""  # why it waits, in the planner's or the record's words
    shortfall: tuple[tuple[str, int, int], ...] | None = None  # (resource, needed, free); None: not planned
    too_big: str = ""  # what of one pod no node it may use could hold, even empty
    pod: str = ""  # the pod the node lines are for ("8 nvidia.com/gpu, 1 cpu")
    nodes: tuple[NodeVerdict, ...] = ()
    topology_key: str | None = None
    nodes_note: str = ""  # why there are no node lines
    preemption: str = ""
    capacity_held: str = ""  # held for it
    held_against: tuple[str, ...] = ()  # others holding room it wants
    backoff: str = ""
    events: tuple[EventLine, ...] = ()  # oldest first
    notes: tuple[str, ...] = field(default_factory=tuple)
    planned: bool = True  # False: only the Gang's record was read (others' holds are not known)


@dataclass
class _Block:
    lines: list[str]
    shown: int = 0

    def __post_init__(self) -> None:
        self.shown = len(self.lines)

    def out(self, width: int) -> list[str]:
        if self.shown >= len(self.lines):
            return self.lines
        if self.shown <= 1:
            return [clip(self.lines[0] + f" … ({len(self.lines) - 1} more lines)", width)]
        hidden = len(self.lines) - self.shown + 1
        return [*self.lines[: self.shown - 1], f"  … {plural(hidden, 'more line')}"]


def fit(blocks: Sequence[Sequence[str]], height: int = MAX_LINES, width: int = MAX_WIDTH) -> list[str]:
    """The blocks (each at least one line) within `height` lines: while too long, the block with
    the most lines shown loses one (the last, marked), a block keeping its first line."""
    parts = [_Block([clip(line, width) for line in b] or [""]) for b in blocks][:height]
    total = sum(b.shown for b in parts)
    while total > height:
        longest = max(reversed(parts), key=lambda b: b.shown)
        if longest.shown <= 1:
            break
        longest.shown -= 1
        total -= 1
    return [line for b in parts for line in b.out(width)]


def render(d: Diagnosis, width: int = MAX_WIDTH, height: int = MAX_LINES) -> list[str]:
    """The diagnosis on one screen: at most `height` lines of at most `width` columns."""
    head = f"gang {d.namespace}/{d.name}: {d.phase}"
    if d.waited is not None:
        head += f", not admitted for {human_duration(d.waited)}"
    if d.reason:
        head += f" ({d.reason})"
    blocks: list[list[str]] = [
        wrap(head, width),
        wrap(f"view: {d.view}", width),
        wrap(
            f"members: {d.members} present, {d.min_member} needed (minMember); "
            f"{d.released} released, {d.bound} bound",
            width,
        ),
        wrap(f"why: {d.message or 'nothing recorded yet'}", width),
    ]
    if d.too_big:
        blocks.append(wrap(f"too big: {d.too_big}", width))
    elif d.shortfall is not None:
        if d.shortfall:
            parts = [
                f"{resource} needs {amount(resource, need)}, {amount(resource, have)} free "
                f"(short by {amount(resource, need - have)})"
                for resource, need, have in d.shortfall
            ]
            blocks.append(wrap("short in all, on the nodes it may use: " + "; ".join(parts), width))
        elif d.nodes:
            blocks.append(wrap("short in all: nothing; the free room is split over too many nodes", width))
    if d.nodes:
        if d.topology_key:
            title = f"by {noun(d.topology_key)} (node label {d.topology_key}), for one pod of {d.pod}:"
            blocks.append([clip(title, width), *domain_lines(d.nodes, d.topology_key, width)])
        else:
            title = f"nodes ({len(d.nodes)}), the first reason each cannot take one pod of {d.pod}:"
            blocks.append([clip(title, width), *node_lines(d.nodes, width)])
    elif d.nodes_note:
        blocks.append(wrap(f"nodes: {d.nodes_note}", width))
    if d.reason != "Released":  # what holds it (an admitted gang has nothing)
        blocks += waiting(d, width)
    shown = d.events[-MAX_EVENTS:]
    told = f"events ({len(shown)} of {len(d.events)}, newest last):" if d.events else "events: none"
    blocks.append([told, *(clip("  " + _event(e), width) for e in shown)])
    for note in d.notes:
        blocks.append(wrap(f"note: {note}", width))
    return fit(blocks, height, width)


def waiting(d: Diagnosis, width: int) -> list[list[str]]:
    """Preemption, capacity held for it and against it, backoff: what a waiting gang's turn
    depends on."""
    blocks = []
    for label, text in (
        ("preemption", d.preemption),
        ("capacity held for it", d.capacity_held or "none"),
        ("backoff", d.backoff or "none: the next attempt is quorum-operator's next pass (on any change)"),
    ):
        if text:
            blocks.append(wrap(f"{label}: {text}", width))
    if d.held_against:
        blocks.append(["held against it:", *(clip("  " + h, width) for h in d.held_against)])
    elif d.planned:
        blocks.append(["held against it: nothing (no other gang holds or reserves a node it may use)"])
    else:
        blocks.append(["held against it: not known in this view (other gangs' records are not read)"])
    return blocks


def _event(e: EventLine) -> str:
    age = human_duration(e.age) if e.age is not None else "?"
    count = f" (x{e.count})" if e.count > 1 else ""
    on = f" [{e.on}]" if e.on != "Gang" else ""
    return f"{age:>6} {e.type:<7} {e.reason}{count}{on}: {e.message}"


def event_lines(events: Iterable[JSON], now: float) -> tuple[EventLine, ...]:
    """Core v1 Events (as the API lists them), oldest first."""
    out = []
    for e in events:
        when = timestamp(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp"))
        kind = str((e.get("involvedObject") or {}).get("kind") or "")
        count = e.get("count")
        out.append(
            (
                when,
                EventLine(
                    now - when if when else None,
                    str(e.get("type") or ""),
                    str(e.get("reason") or ""),
                    str(e.get("message") or ""),
                    count if isinstance(count, int) and count > 0 else 1,
                    kind or "Gang",
                ),
            )
        )
    return tuple(line for _, line in sorted(out, key=lambda item: item[0]))


# -- what a Gang's status recorded --------------------------------------------------------------


def condition(gang: JSON, kind: str) -> JSON:
    """One condition of a Gang's status ({} if it has none of the type)."""
    for c in ((gang.get("status") or {}).get("conditions")) or []:
        if isinstance(c, dict) and c.get("type") == kind:
            return c
    return {}


def counter(gang: JSON, name: str) -> int:
    value = (gang.get("status") or {}).get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def not_admitted_for(gang: JSON, now: float) -> float | None:
    """Seconds since the gang was last admitted or made (None: it is admitted)."""
    admitted = condition(gang, "Admitted")
    if admitted.get("status") == "True":
        return None
    since = timestamp(admitted.get("lastTransitionTime")) or timestamp(
        (gang.get("metadata") or {}).get("creationTimestamp")
    )
    return max(0.0, now - since) if since else None


def recorded_at(gang: JSON) -> float:
    """When quorum last wrote the Gang's status: its newest status entry in managedFields, else
    its newest condition transition (0: never)."""
    times = [
        timestamp(f.get("time"))
        for f in (gang.get("metadata") or {}).get("managedFields") or []
        if isinstance(f, dict) and f.get("subresource") == "status"
    ]
    if not any(times):
        times = [
            timestamp(c.get("lastTransitionTime")) for c in (gang.get("status") or {}).get("conditions") or []
        ]
    return max((t for t in times if t), default=0.0)


def recorded_view(gang: JSON, now: float, why_not_planned: str, writer: str = "quorum-operator") -> str:
    """The view line of what quorum-operator recorded (`why_not_planned`: why it is not planned
    afresh, e.g. what the caller may not read)."""
    at = recorded_at(gang)
    when = f"{iso(at)} ({human_duration(now - at)} ago)" if at else "a time not recorded"
    return f"as recorded by {writer} at {when} ({why_not_planned})"


NO_PREEMPTION = "; no preemption"  # how the operator appends why preemption could not help


def from_status(gang: JSON, now: float, view: str) -> Diagnosis:
    """What a Gang's status says: recorded by quorum-operator, or composed as its next pass
    would write it. Why preemption could not help, which the operator appends to the message of
    a gang held for lack of room, is told apart from why it waits."""
    meta = gang.get("metadata") or {}
    spec = gang.get("spec") or {}
    status = gang.get("status") or {}
    admitted = condition(gang, "Admitted")
    held = condition(gang, "CapacityHeld")
    backoff = condition(gang, "Backoff")
    preempting = condition(gang, "Preempting")
    message = str(admitted.get("message") or "")
    why, cut, preemption = message.partition(NO_PREEMPTION)
    if preempting.get("status") == "True":
        preemption = f"in flight: {preempting.get('message') or ''}"
    elif cut:
        preemption = f"none{preemption}"
    min_member = spec.get("minMember")
    key = spec.get("topologyKey")
    return Diagnosis(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        view=view,
        phase=str(status.get("phase") or "Pending"),
        waited=not_admitted_for(gang, now),
        members=counter(gang, "members"),
        min_member=min_member if isinstance(min_member, int) and not isinstance(min_member, bool) else 0,
        released=counter(gang, "released"),
        bound=counter(gang, "bound"),
        reason=str(admitted.get("reason") or ""),
        message=why,
        topology_key=key if isinstance(key, str) and key else None,
        preemption=preemption,
        capacity_held=str(held.get("message") or "") if held.get("status") == "True" else "",
        backoff=str(backoff.get("message") or "") if backoff.get("status") == "True" else "",
    )


def recorded(gang: JSON, now: float, why_not_planned: str, writer: str = "quorum-operator") -> Diagnosis:
    """What quorum-operator recorded on the Gang, for one who cannot plan it afresh."""
    view = recorded_view(gang, now, why_not_planned, writer)
    diagnosis = replace(from_status(gang, now, view), planned=False)
    if condition(gang, "Unschedulable").get("status") == "True":
        note = (
            "the counts in `why` are the operator's at its last pass (per node needs nodes and pods to read)"
        )
        return replace(diagnosis, nodes_note=note)
    return diagnosis


# -- `quorum get` -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GangRow:
    namespace: str
    name: str
    phase: str
    size: str  # members/minMember
    placed: str  # released/bound ("-": none recorded)
    wait: str  # how long not admitted ("-": admitted)
    reason: str  # the Admitted condition's reason


def gang_row(gang: JSON, now: float) -> GangRow:
    meta = gang.get("metadata") or {}
    status = gang.get("status") or {}
    min_member = (gang.get("spec") or {}).get("minMember")
    members = status.get("members")
    size = (
        f"{members if isinstance(members, int) else '?'}/{min_member if isinstance(min_member, int) else '?'}"
    )
    placed = "-"
    if "released" in status or "bound" in status:
        placed = f"{counter(gang, 'released')}/{counter(gang, 'bound')}"
    waited = not_admitted_for(gang, now)
    return GangRow(
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        str(status.get("phase") or "Pending"),
        size,
        placed,
        human_duration(waited) if waited is not None else "-",
        str(condition(gang, "Admitted").get("reason") or "-"),
    )


def table(rows: Sequence[GangRow], all_namespaces: bool) -> list[str]:
    """kubectl-style columns (each as wide as its widest cell, three spaces apart)."""
    header = ["NAME", "PHASE", "SIZE", "RELEASED/BOUND", "WAIT", "REASON"]
    cells = [[r.name, r.phase, r.size, r.placed, r.wait, r.reason] for r in rows]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
        for cell, row in zip(cells, rows, strict=True):
            cell.insert(0, row.namespace)
    cells = [[printable(c) for c in row] for row in cells]
    widths = [max(columns(c) for c in col) for col in zip(header, *cells, strict=True)]
    return [
        "   ".join(c + " " * (w - columns(c)) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *cells]
    ]
