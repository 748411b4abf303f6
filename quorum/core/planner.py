"""The gang planner: which gangs can be released now, and onto which node each pod goes.

A pure function of a snapshot: nodes, what is used on each (bound pods plus reservations of
pods released but not yet bound), and the queue of gangs. Gangs are taken in order (priority,
then age); a gang is released only if at least minMember of its pods (counting members released
before) are placed node by node, and the capacity it takes is subtracted before the next gang
is planned. A gang that does not fit does not block the gangs behind it (backfill).

Placement is best fit: each pod goes to the eligible node with the least room left after it
(accelerators first, then CPU and memory), preferring nodes whose PreferNoSchedule taints it
tolerates, so that whole nodes stay free for large gangs. For pods that are all alike, this
greedy placement is optimal (a node's room for one shape does not depend on other nodes); for
mixed pods it may miss a packing, so a bounded search tries before the gang is held.

Bounded work. Greedy placement and the index's upkeep are linear and always run. The search
(an iterative depth-first search, no recursion) is bounded in node visits: each node it
examines, scores or checks counts one, sorting k nodes counts k. A gang's search may make
`gang_budget` visits, and the searches of one pass together `pass_budget` (a gang starts its
search only while some is left); a gang whose search runs out, or that is not searched because
the pass's budget went to gangs ahead of it, is held as BudgetExhausted, saying so. Before any
search, a mixed gang whose smallest pods need more of a resource than its eligible nodes have
free in all is held at once, with the numbers. A gang whose pods come in more than
`max_shapes_per_gang` shapes is held as TooManyShapes, its shapes not indexed. An error while
planning one gang holds that gang as PlanningFailed and the pass goes on; the next pass then
rebuilds the index from scratch.

Incremental. A `Planner` keeps its node index (`quorum.core.index`) between passes; a pass
told which nodes changed (usage or the node itself) brings only those up to date, plus the
nodes the previous pass committed to, and then plans the queue. A gang of alike pods that does
not fit is known from the index's running totals, without a scan, so held gangs cost little.
`plan_gangs` is one pass of a fresh planner.

Fairness. Backfill alone would let a stream of small gangs starve a large one: whenever a node
frees, a small gang behind it takes the node. So once a held gang has waited
`starvation_seconds`, the first such gang in queue order gets capacity *held* for it: the
eligible nodes closest to free (most room for its pods now, then most room when empty) until
they would take the whole gang. On those nodes, the gangs behind it see the room minus what the
starving gang will need there, so backfill only uses what it cannot (CPU beside its GPUs, say);
as the nodes drain, it fits and is released. A gang that could not fit even in an empty
cluster holds nothing. One starving gang at a time keeps the rest of the cluster working.

The guard cannot be captured by a gang that can never fit (it asks for every node whole while its
owner keeps one pod running forever, say): turns of `starvation_hold_seconds` go round the
tenants with starving gangs (`Gang.owner`), and round each tenant's gangs, so every gang that
waits behind it becomes starving and gets its tenant's turn (`Planner.turn`); a tenant whose held
room stops growing rests (`Planner.idle`). A platform may bound it further:
`starvation_rest_seconds` makes a gang rest after each turn, and `starvation_max_share` caps the
share of the nodes its pods may use that a gang holds (a gang that needs more holds nothing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from quorum.core.explain import amount, explain
from quorum.core.fit import FitSettings
from quorum.core.index import Key, NodeIndex, NodesOfShape, Shape, ShapeEntry, slots
from quorum.core.model import Composite, Gang, Node, Pod, Resources, add, fits, subtract
from quorum.core.topology import domains_of, explain_domains, least_waste_first
from quorum.core.workloads import MAX_COMPOSITE_DEPTH

_MANY = 1_000_000  # pods that fit where a pod asks for nothing (as `quorum.core.index.slots`)
MAX_COMPOSITE_DOMAINS = 32  # domains a composite with a topology key is tried in, per pass
# Domains all composites together are tried in, per pass: each try indexes the composite's pod
# shapes pinned to one domain (a sweep of every node), which no search budget counts.
MAX_COMPOSITE_DOMAINS_PER_PASS = 64


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    fit: FitSettings = field(default_factory=FitSettings)
    """Which nodes a pod may use at all (`quorum.core.fit`)."""

    accelerators: tuple[str, ...] = ("nvidia.com/gpu", "sunk.coreweave.com/accelerator")
    """Extended resources that best fit packs first (their sum, then CPU, then memory)."""

    gang_budget: int = 250_000
    """Node visits the search for one gang of mixed pods may make when greedy placement did not
    place it: each node examined, scored or checked counts one, sorting k nodes counts k. A visit
    costs about 0.6-1 µs of one core (measured on a 2-core machine), so a gang's search takes at
    most about 0.15-0.25 s. A gang whose search runs out is held as BudgetExhausted, saying what
    greedy placement achieved."""

    pass_budget: int = 600_000
    """Node visits the searches of one whole pass may make, over all gangs. A gang starts its search
    only while some is left, so a pass's searches make at most this plus one `gang_budget` visits:
    with the defaults, 850,000, under about 1 s with the rest of the pass. Greedy placement and the
    index's upkeep are not counted (they are linear and always run), so gangs of alike pods behind
    expensive mixed gangs are always planned; a mixed gang that greedy placement cannot place once
    this is spent is held as BudgetExhausted, not searched this pass."""

    max_shapes_per_gang: int = 64
    """Distinct pod shapes one gang may have (a shape: requests, tolerations, nodeSelector and
    required node affinity together); each costs a sweep of every node and memory in the index. A
    gang with more is held as TooManyShapes, its shapes not indexed."""

    starvation_seconds: float = 60.0
    """A gang held this long for lack of room gets capacity held for it (see the module's doc)."""

    starvation_hold_seconds: float = 300.0
    """How long a starving gang holds capacity in one turn."""

    starvation_rest_seconds: float = 0.0
    """How long a gang that had a turn then rests, held or not (0: no rest; its turns come round
    as long as it starves)."""

    starvation_max_share: float = 1.0
    """The largest share of the nodes its pods may use that one gang holds (1: all of them)."""

    starvation_idle_seconds: float = 1800.0
    """A tenant whose starving gangs have starved this long without the room held for them
    growing past the largest share of one gang's pods it has had free (over all its gangs and
    turns: they wait on something that does not end) holds nothing for as long, then holds again
    (0: no bound). A gang that spans a whole pool still gets through while some pod on its held
    nodes finishes at least this often."""

    def holds_now(self, held_since: float | None, now: float) -> bool:
        """Whether a gang held since `held_since` is in a turn of the starvation guard now."""
        if held_since is None or now - held_since < self.starvation_seconds:
            return False
        if self.starvation_rest_seconds <= 0:
            return True
        cycle = max(1e-9, self.starvation_hold_seconds + self.starvation_rest_seconds)
        return (now - held_since - self.starvation_seconds) % cycle < self.starvation_hold_seconds


@dataclass(frozen=True, slots=True)
class Release:
    gang: Gang
    placement: tuple[tuple[Pod, Node], ...]


@dataclass(frozen=True, slots=True)
class Hold:
    gang: Gang
    reason: str  # WaitingForMembers | Unschedulable | BudgetExhausted | TooManyShapes | PlanningFailed
    message: str
    held_nodes: tuple[str, ...] = ()  # capacity held for this starving gang
    held_message: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    releases: tuple[Release, ...]
    holds: tuple[Hold, ...]
    visits: int = 0  # node visits of search this pass (bounded by pass_budget + gang_budget)


def queue_order(gang: Gang) -> tuple[int, float, str, str]:
    return (-gang.priority, gang.created, gang.namespace, gang.name)


def plan_gangs(
    nodes: Sequence[Node],
    used: Mapping[str, Resources],
    queue: Sequence[Gang],
    settings: PlannerSettings | None = None,
    now: float = 0.0,
) -> Plan:
    """One planning pass from scratch."""
    return Planner(settings).plan({n.name: n for n in nodes}, used, queue, now)


@dataclass
class Budget:
    """Node visits of search: what one gang's search may still make, and what it made."""

    limit: int
    visits: int = 0
    placements: int = 0  # pods placed (tried) by the search
    exhausted: bool = False

    def spend(self, visits: int) -> bool:
        """Take `visits` if the budget has them; else mark it exhausted."""
        if self.visits + visits > self.limit:
            self.exhausted = True
            return False
        self.visits += visits
        return True


@dataclass
class Outcome:
    """What planning one gang came to: a placement, or a hold's reason and message."""

    placement: list[tuple[Pod, Node]] | None
    reason: str = ""
    message: str = ""
    keep: bool = True  # the hold may be reused while nothing it depends on changes


@dataclass
class PassState:
    """What one pass carries from gang to gang."""

    search_left: int  # node visits of search this pass may still make
    visits: int = 0
    # Each tenant's share of the pass's search (pass_budget over the tenants with gangs in the
    # queue), and what its gangs' searches made so far: a gang starts a search only while its
    # tenant has spent less than its share.
    tenant_share: int = 0
    tenant_spent: Counter[str] = field(default_factory=Counter)
    holding: bool = False  # capacity is held for one starving gang at a time
    may_hold: frozenset[tuple[str, str]] = frozenset()  # the starving gangs whose turn it may be
    explained: dict[tuple[object, ...], str] = field(default_factory=dict)  # alike held alike
    touched: set[Shape] = field(default_factory=set)
    undo: list[tuple[str, dict[str, int]]] = field(default_factory=list)  # (node, free before a commit)
    composite_domains_left: int = MAX_COMPOSITE_DOMAINS_PER_PASS

    def why_no_search(self, gang: Gang, settings: PlannerSettings) -> str | None:
        """Why the gang's search may not start this pass (None: it may)."""
        if self.search_left <= 0:
            return (
                f"{NOT_SEARCHED}: the pass's search budget ({settings.pass_budget} node visits) went "
                "to gangs ahead of it; it goes first among its priority next pass"
            )
        if self.tenant_spent[gang.owner] >= self.tenant_share:
            return (
                f"{NOT_SEARCHED}: its tenant's share of the pass's search budget ({self.tenant_share} "
                f"of {settings.pass_budget} node visits) went to its gangs ahead of it; it goes first "
                "among its priority next pass"
            )
        return None

    def spent(self, gang: Gang, visits: int) -> None:
        self.search_left -= visits
        self.visits += visits
        self.tenant_spent[gang.owner] += visits


NOT_SEARCHED = "not searched this pass"


IDLE_GAP_SECONDS = 60.0  # the most one pass adds to a tenant's idle clock (time not holding is not idle)


@dataclass(slots=True)
class TenantGuard:
    """What the starvation guard keeps of one tenant with starving gangs (`Planner.turn`,
    `Planner.idle`). Forgotten only once it has not starved for `starvation_idle_seconds` (or a
    turn, if more) and is not resting: gangs deleted and made again, or small gangs of it
    admitted, start nothing afresh. Its idle clock starts afresh when the gang whose held room
    made its latest progress is admitted (`Planner.admitted`): the guard did its work."""

    seen: float  # the last pass it had starving gangs
    last_turn: int = -1  # the number of its last turn among all tenants' (-1: none)
    turns: int = 0  # turns it had
    best: float = -1.0  # the largest share of one of its gangs' pods the room held for it had free
    best_gang: tuple[str, str] | None = None  # the gang whose held room had it
    idle: float = 0.0  # seconds spent holding since `best` was reached
    held_at: float | None = None  # the last pass it held (or would have but for its rest)
    rest_until: float = 0.0  # its gangs hold nothing until then


class Planner:
    def __init__(self, settings: PlannerSettings | None = None) -> None:
        self.settings = settings or PlannerSettings()
        self.index = NodeIndex(self.settings.fit, self.settings.accelerators)
        self.committed: set[str] = set()  # nodes whose room the last pass took (to restore)
        self.synced = False  # False: the next pass rebuilds the index from scratch
        # Gangs held for lack of room last pass, with the versions of their shapes then.
        self.held: dict[tuple[str, str], tuple[Gang, tuple[int, ...], Hold]] = {}
        # The last pass: each gang's place in queue order, and the room the starvation guard
        # held (taken out of `index.free`) for a starving gang, node by node (see `room_for`).
        self.order: dict[tuple[str, str], int] = {}
        self.held_room: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
        # Gangs the last pass had no search for, and for how many passes in a row: the longest
        # unsearched goes first among its priority (the input of this pass, for a re-plan).
        self.unsearched: dict[tuple[str, str], int] = {}
        self.pass_unsearched: dict[tuple[str, str], int] = {}
        # Per tenant with starving gangs, its turns, progress and rest; whose turn the current
        # slot of `starvation_hold_seconds` is.
        self.guards: dict[str, TenantGuard] = {}
        self.turn_of: tuple[int, str] | None = None
        self.turns_given = 0

    def plan(
        self,
        nodes: Mapping[str, Node],
        used: Mapping[str, Resources],
        queue: Sequence[Gang],
        now: float = 0.0,
        changed: Collection[str] | None = None,
        composites: Mapping[tuple[str, str], Composite] | None = None,
        replan: bool = False,
    ) -> Plan:
        """Plan the queue. `changed`: the names of the nodes whose usage or object changed since
        the previous pass (None: compare everything). `composites`: the CompositePodGroups the
        queue's gangs name; a composite's gangs are planned together, where its first is.
        `replan`: the same pass planned again (fewer gangs): in the same order, and what it
        leaves unsearched is not counted again."""
        self.sync(nodes, used, changed)
        if not replan:
            self.pass_unsearched = self.unsearched
        ordered = sorted(queue, key=self.plan_order)
        tenants = len({gang.owner for gang in queue})
        for owner in {gang.owner for gang in queue if self.may_starve(gang, now)}:
            self.guards.setdefault(owner, TenantGuard(seen=now)).seen = now
        state = PassState(
            self.settings.pass_budget,
            may_hold=self.turn(ordered, now, replan),
            tenant_share=max(1, self.settings.pass_budget // max(1, tenants)),
        )
        releases: list[Release] = []
        holds: list[Hold] = []
        held: dict[tuple[str, str], tuple[Gang, tuple[int, ...], Hold]] = {}
        not_searched: set[tuple[str, str]] = set()
        self.order = {gang.key: i for i, gang in enumerate(ordered)}
        self.held_room = {}
        family = CompositeFamily.of(ordered, composites or {})
        planned: set[tuple[str, str]] = set()
        for gang in ordered:
            unit = [gang]
            root = family.root_of(gang)
            if root is not None:
                if root in planned:
                    continue
                planned.add(root)
                unit = family.gangs_under(root)
            try:
                if root is None:  # no composite, or one not known: each gang on its own
                    decided: list[Release | Hold | None] = [self.plan_gang(g, now, state, held) for g in unit]
                else:
                    decided = self.plan_composite(family, root, now, state, held, {})[0]
            except Exception as err:  # one gang's failure must not stop the others
                # The index may be half-updated: the next pass rebuilds it from scratch.
                self.synced = False
                message = f"planning failed: {type(err).__name__}: {err}"
                decided = [Hold(g, "PlanningFailed", message) for g in unit]
            for one in decided:
                if isinstance(one, Release):
                    releases.append(one)
                elif one is not None:
                    holds.append(one)
                    if one.reason == "BudgetExhausted" and one.message.startswith(NOT_SEARCHED):
                        not_searched.add(one.gang.key)
        self.index.keep_only(state.touched)  # shapes no gang asked for this pass are forgotten
        if not replan:  # passes in a row each gang was not searched
            self.unsearched = {k: self.pass_unsearched.get(k, 0) + 1 for k in not_searched}
        self.forget_guards(now)
        self.held = held
        return Plan(tuple(releases), tuple(holds), state.visits)

    def plan_gang(
        self,
        gang: Gang,
        now: float,
        state: PassState,
        held: dict[tuple[str, str], tuple[Gang, tuple[int, ...], Hold]],
    ) -> Release | Hold | None:
        """Release or hold one gang, committing the room a release takes; None: neither (no pods
        waiting, or admitted already and its pods beyond minMember do not fit)."""
        index, settings = self.index, self.settings
        needed = max(0, gang.min_member - gang.released)
        if gang.released + len(gang.pods) < gang.min_member:
            message = f"{gang.members} of {gang.min_member} members exist (minMember {gang.min_member})"
            return Hold(gang, "WaitingForMembers", message)
        if not gang.pods:
            return None
        if len(gang.shapes) > settings.max_shapes_per_gang:
            return Hold(gang, "TooManyShapes", too_many_shapes(gang, settings.max_shapes_per_gang))
        # The guard holds capacity for one gang; a composite's gangs are placed together or
        # not at all, so none of them holds any (its room could not be given back whole).
        starving = gang.key in state.may_hold and gang.composite is None
        entries = {pod.shape: index.shape(pod) for pod in gang.shapes}
        state.touched.update(entries)
        versions = _versions(entries)
        before = self.held.get(gang.key)
        # Reused while nothing it could use changed; never a hold that held nodes (a guard's turn).
        if (
            before is not None
            and not before[2].held_nodes
            and not starving
            and before[1] == versions
            and before[0] == gang
        ):
            held[gang.key] = before
            return before[2]  # nothing it could use changed: held for the same reason
        outcome = _place(gang, needed, index, settings, entries, state)
        if outcome.placement is None:
            hold = Hold(gang, outcome.reason, outcome.message)
            if starving and not state.holding:
                hold = self.hold_capacity(hold, needed, now)
                state.holding = bool(hold.held_nodes)
            if outcome.keep:
                held[gang.key] = (gang, versions, hold)
            return hold
        if not outcome.placement:
            return None  # admitted already; the pods beyond minMember wait for room
        taken: dict[str, dict[str, int]] = {}
        for pod, node in outcome.placement:
            so_far = taken.get(node.name)
            taken[node.name] = _take(index.free[node.name] if so_far is None else so_far, pod.requests)
        self.committed.update(taken)  # before the index changes: restored next pass if it fails
        for name, room in taken.items():
            state.undo.append((name, index.free[name]))
            index.set_free(name, room)
        return Release(gang, tuple(outcome.placement))

    def plan_composite(
        self,
        family: CompositeFamily,
        key: tuple[str, str],
        now: float,
        state: PassState,
        held: dict[tuple[str, str], tuple[Gang, tuple[int, ...], Hold]],
        pins: Mapping[str, str],
    ) -> tuple[list[Release | Hold | None], bool]:
        """A CompositePodGroup's gangs and child composites, all-or-nothing at its level:
        released only if, with the children admitted already, at least minGroupCount of its
        children are placed together (a gang whole, a child composite by its own rule; the room
        of one taken before the next is placed); otherwise the room is given back and every gang
        under it waits. With a topology key: all of it in one domain, the domains tried in order
        until one takes enough (at most `MAX_COMPOSITE_DOMAINS`); `pins` are the domains the
        composites above it were pinned to. Also says whether its children were placed."""
        composite = family.composites[key]
        topology = composite.topology_key
        if topology is None or topology in pins:  # none, or the one a composite above it chose
            decided = self._try_composite(family, key, now, state, held, pins)
            if decided is not None:
                return decided, True
            return self._composite_holds(family, key, None), False
        values = sorted(
            {
                n.labels[topology]
                for n in self.index.nodes.values()
                if topology in n.labels and all(n.labels.get(k) == v for k, v in pins.items())
            }
        )
        if composite.admitted_domains:  # where its admitted gangs run (none fits if they are split)
            values = [v for v in values if {v} == set(composite.admitted_domains)]
        for value in values[:MAX_COMPOSITE_DOMAINS]:
            if state.composite_domains_left <= 0:
                message = (
                    f"CompositePodGroup {composite.name} was not tried this pass: the pass's "
                    f"{MAX_COMPOSITE_DOMAINS_PER_PASS} tries of a domain went to composites ahead of it"
                )
                return [Hold(g, "WaitingForGroups", message) for g in family.gangs_under(key)], False
            state.composite_domains_left -= 1
            decided = self._try_composite(family, key, now, state, {}, {**pins, topology: value})
            if decided is not None:
                return decided, True
        return self._composite_holds(family, key, (topology, len(values))), False

    def _try_composite(
        self,
        family: CompositeFamily,
        key: tuple[str, str],
        now: float,
        state: PassState,
        held: dict[tuple[str, str], tuple[Gang, tuple[int, ...], Hold]],
        pins: Mapping[str, str],
    ) -> list[Release | Hold | None] | None:
        """The decisions under the composite if enough children were placed; None (their room
        given back) if not."""
        composite = family.composites[key]
        mark = len(state.undo)
        decided: list[Release | Hold | None] = []
        placed = composite.admitted
        for child in family.children[key]:
            if isinstance(child, Gang):
                one = self.plan_gang(_pinned(child, pins), now, state, held)
                decided.append(one)
                # A gang admitted already is counted in `admitted`, whatever of its spare pods goes now.
                placed += isinstance(one, Release) and child.released < child.min_member
            else:
                below, ok = self.plan_composite(family, child, now, state, held, pins)
                decided += below
                sub = family.composites[child]
                placed += ok and sub.admitted < sub.min_group_count  # else counted in `admitted`
        if placed >= composite.min_group_count:
            return decided
        for name, room in reversed(state.undo[mark:]):
            self.index.set_free(name, room)
        del state.undo[mark:]
        return None

    def _composite_holds(
        self, family: CompositeFamily, key: tuple[str, str], domains: tuple[str, int] | None
    ) -> list[Release | Hold | None]:
        composite = family.composites[key]
        where = ""
        if domains is not None:
            topology, count = domains
            where = f" in one {topology.rsplit('/', 1)[-1]} (node label {topology}; {count} tried)"
        what = "gangs" if all(isinstance(c, Gang) for c in family.children[key]) else "groups"
        message = (
            f"CompositePodGroup {composite.name} needs {composite.min_group_count} of its {what} placed "
            f"together{where} ({composite.admitted} admitted already); fewer fit now, so none of them is "
            f"released"
        )
        return [Hold(g, "WaitingForGroups", message) for g in family.gangs_under(key)]

    def plan_order(self, gang: Gang) -> tuple[object, ...]:
        """Queue order, except that a gang not searched in the last passes goes first within its
        priority, the longest unsearched first: a search budget spent on others one pass is its
        own the next."""
        return (-gang.priority, -self.pass_unsearched.get(gang.key, 0), *queue_order(gang)[1:])

    def may_starve(self, gang: Gang, now: float) -> bool:
        """Whether the gang is starving and the guard may hold for it: a gang of a composite
        never holds (its gangs are placed together or not at all)."""
        return gang.composite is None and self.settings.holds_now(gang.held_since, now)

    def turn(self, ordered: Sequence[Gang], now: float, replan: bool = False) -> frozenset[tuple[str, str]]:
        """The starving gangs that may hold capacity this pass. Turns of
        `starvation_hold_seconds` go round the tenants with starving gangs, the one whose last
        turn is the oldest first (one with none yet before any that had one; ties in queue
        order): with T tenants starving, a tenant's gang that begins to starve waits at most T - 1
        turns, however many gangs the others have. Within a tenant, turns go round its starving
        gangs in queue order. A resting tenant (`idle`) is passed over. The gang whose turn it is
        holds first; when it cannot (it needs more than its share, say), the gangs after it in
        the pass's order (`ordered`) may. A re-plan of the pass charges no one a turn."""
        starving = [g for g in ordered if self.may_starve(g, now)]
        by_tenant: dict[str, list[Gang]] = {}
        for gang in starving:
            by_tenant.setdefault(gang.owner, []).append(gang)
        guards = {t: self.guards.setdefault(t, TenantGuard(seen=now)) for t in by_tenant}
        awake = [t for t in by_tenant if guards[t].rest_until <= now]
        if not awake:  # no turn is spent; each gang's hold says how long its tenant rests
            return frozenset(g.key for g in starving)
        slot = int(now // max(1.0, self.settings.starvation_hold_seconds))
        owner = self.turn_of[1] if self.turn_of is not None and self.turn_of[0] == slot else None
        if owner not in awake:
            owner = min(awake, key=lambda t: guards[t].last_turn)  # ties (none yet): queue order
            if not replan:
                guards[owner].last_turn = self.turns_given
                self.turns_given += 1
                guards[owner].turns += 1
                self.turn_of = (slot, owner)
        own = by_tenant[owner]
        chosen = own[(guards[owner].turns - 1) % len(own)]
        return frozenset(g.key for g in starving[starving.index(chosen) :])

    def sync(
        self, nodes: Mapping[str, Node], used: Mapping[str, Resources], changed: Collection[str] | None
    ) -> None:
        """Bring the index to the pass's starting point: every node's room is its allocatable
        minus what is used on it. Not synced (the first pass, or after a failure): from scratch."""
        if not self.synced:
            self.index = NodeIndex(self.settings.fit, self.settings.accelerators)
            self.held = {}  # their versions were of the old index's shapes
        index = self.index
        try:
            if changed is None or not self.synced:
                for name in [n for n in index.nodes if n not in nodes]:
                    index.remove_node(name)
                names: Collection[str] = nodes.keys()
            else:
                names = set(changed) | self.committed
            self.committed = set()
            for name in names:
                node = nodes.get(name)
                if node is None:
                    index.remove_node(name)
                    continue
                room = _take(node.allocatable, used.get(name, {}))  # negative usage frees nothing
                if index.nodes.get(name) is not node:
                    index.set_node(node, room)
                elif index.free[name] != room:
                    index.set_free(name, room)
        except Exception:
            self.synced = False
            raise
        self.synced = True

    def room_for(self, key: tuple[str, str]) -> dict[str, dict[str, int]]:
        """Each node's room after the last pass as the gang `key` may count on it (what
        preemption decides with): the room the starvation guard held for it, or for a gang after
        it in queue order, is free to it. A hold keeps room from the gangs behind the starving
        one, never from the starving gang itself nor from the gangs planned before the hold."""
        free = dict(self.index.free)
        mine = self.order.get(key, len(self.order))
        for holder, rooms in self.held_room.items():
            if self.order.get(holder, -1) >= mine:
                for name, room in rooms.items():
                    if name in free:
                        free[name] = add(free[name], room)
        return free

    def hold_capacity(self, hold: Hold, needed: int, now: float) -> Hold:
        """Hold the nodes closest to free for a starving gang (see the module's doc): most room
        for its pods now (in fractions of a pod), then most room when empty. The gang's biggest
        pod stands for all of them when its pods differ."""
        gang, index = hold.gang, self.index
        pod = biggest_pod(gang, self.settings)
        by_domain: dict[str | None, list[tuple[float, int, str, int]]] = {}
        for node in index.shape(pod).eligible.values():
            empty = slots(pod, node.allocatable)
            domain = node.labels.get(gang.topology_key) if gang.topology_key else None
            if empty > 0 and (domain is not None or not gang.topology_key):
                candidate = (-_share(pod, index.free[node.name]), -empty, node.name, empty)
                by_domain.setdefault(domain, []).append(candidate)
        # With a topology constraint, the domain that could take the gang and is closest to free.
        possible = [(domain, c) for domain, c in by_domain.items() if sum(x[3] for x in c) >= needed]
        if not possible:
            return hold  # could not fit even in an empty cluster: holding would only waste
        _, candidates = min(possible, key=lambda dc: (sum(x[0] for x in dc[1]), str(dc[0])))
        candidates.sort()
        chosen: list[tuple[str, int]] = []  # (node, pods of the gang it takes)
        left = needed
        for _, _, name, empty in candidates:
            if left <= 0:
                break
            chosen.append((name, min(empty, left)))
            left -= chosen[-1][1]
        eligible = sum(len(c) for c in by_domain.values())
        if len(chosen) > self.settings.starvation_max_share * eligible:
            return hold  # more than its share of the nodes it may use: it holds none
        free_now = sum(min(take, slots(pod, index.free[name])) for name, take in chosen)
        if (idle := self.idle(gang, free_now, needed, now)) is not None:
            return replace(hold, message=f"{hold.message}; {idle}")
        held: list[str] = []
        for name, take in chosen:
            held.append(name)
            self.committed.add(name)
            room = {k: v * take for k, v in pod.requests.items() if v > 0}
            self.held_room.setdefault(gang.key, {})[name] = room
            index.set_free(name, subtract(index.free[name], room))
        waited = now - (gang.held_since or now)
        message = (
            f"holding {len(held)} nodes for this gang after {waited:.0f}s held (starvation guard): room "
            f"for {free_now} of its {needed} pods is free there now, the rest as running pods finish; "
            "gangs behind it use only what it cannot"  # the nodes unnamed: its tenant cannot read them
        )
        return Hold(gang, hold.reason, hold.message, tuple(held), message)

    def idle(self, gang: Gang, free_now: int, needed: int, now: float) -> str | None:
        """Why a starving gang holds nothing now, though its turn, or None. A tenant progresses
        when the room held for one of its gangs has a larger share of that gang's pods free than
        any of its holds had: room regained after others' turns, or held for another of its
        gangs, is not progress. After `starvation_idle_seconds` spent holding without progress,
        its gangs all hold nothing for as long; then its clock starts anew."""
        limit = self.settings.starvation_idle_seconds
        if limit <= 0:
            return None
        guard = self.guards.setdefault(gang.owner, TenantGuard(seen=now))
        if guard.rest_until > now:
            guard.held_at = None
            left = guard.rest_until - now
            return (
                f"the starvation guard holds nothing for its tenant's gangs ({gang.owner}) for {left:.0f}s "
                f"more: the room held for them did not grow for {limit:.0f}s"
            )
        if guard.held_at is not None:  # a re-plan of the same pass adds nothing
            guard.idle += min(max(0.0, now - guard.held_at), IDLE_GAP_SECONDS)
        guard.held_at = now
        share = free_now / max(1, needed)
        if share > guard.best:
            guard.best, guard.best_gang, guard.idle = share, gang.key, 0.0
            return None
        if guard.idle <= limit:
            return None
        guard.rest_until, guard.best, guard.best_gang, guard.idle = now + limit, -1.0, None, 0.0
        return (
            f"the starvation guard holds nothing for its tenant's gangs ({gang.owner}) for {limit:.0f}s: "
            f"the room held for them did not grow for {limit:.0f}s (room for {free_now} of this gang's "
            f"{needed} pods)"
        )

    def resting_tenants(self, now: float) -> list[str]:
        """The tenants whose starving gangs hold nothing now (`idle`)."""
        return [owner for owner, guard in self.guards.items() if guard.rest_until > now]

    def admitted(self, releases: Sequence[Release]) -> None:
        """The pass's releases, once final (a pass may plan again without some of them, for
        devices): a tenant whose gang that made its latest progress is admitted starts its idle
        clock afresh; its turns and any rest stay."""
        released = {release.gang.key for release in releases}
        for guard in self.guards.values():
            if guard.best_gang in released:
                guard.best, guard.best_gang, guard.idle, guard.held_at = -1.0, None, 0.0, None

    def forget_guards(self, now: float) -> None:
        """A tenant that has not starved for a while, and is not resting, is forgotten."""
        keep_for = max(self.settings.starvation_idle_seconds, self.settings.starvation_hold_seconds)
        for owner, guard in list(self.guards.items()):
            if now - guard.seen > keep_for and guard.rest_until <= now:
                del self.guards[owner]


def biggest_pod(gang: Gang, settings: PlannerSettings) -> Pod:
    """The gang's biggest pod (accelerators, then CPU, then memory): the one that stands for all
    of them where one pod must (capacity held for a starving gang; `quorum explain`'s nodes)."""
    return max(gang.pods, key=lambda p: _size(p, settings))


def too_many_shapes(gang: Gang, limit: int) -> str:
    return (
        f"the gang's pods come in {len(gang.shapes)} distinct shapes, more than the {limit} a gang may "
        "have (max_shapes_per_gang); pods are of one shape when their resource requests, tolerations, "
        "nodeSelector and required node affinity are all the same: make the pods of each role alike "
        "in these"
    )


def _place(
    gang: Gang,
    needed: int,
    index: NodeIndex,
    settings: PlannerSettings,
    entries: Mapping[Shape, ShapeEntry],
    state: PassState,
) -> Outcome:
    free = index.free
    if gang.min_resources:
        usable = {name for entry in entries.values() for name in entry.eligible}
        available: dict[str, int] = {}
        for name in usable:
            for k, v in free[name].items():
                available[k] = available.get(k, 0) + max(0, v)
        short = {k: v for k, v in gang.min_resources.items() if available.get(k, 0) < v}
        if short:
            return Outcome(
                None,
                "Unschedulable",
                "minResources not free: "
                + "; ".join(
                    f"needs {amount(k, v)} {k}, eligible nodes have {amount(k, available.get(k, 0))}"
                    for k, v in sorted(short.items())
                ),
            )
    if len(entries) == 1 and not gang.topology_key:
        (entry,) = entries.values()
        if entry.total < needed:  # known from the totals: no scan, and the reason is shared
            why = (entry.pod.shape, entry.stats_version, needed, len(gang.pods), len(index.nodes))
            if why not in state.explained:
                state.explained[why] = explain(gang, needed, gang.pods, [], entries, len(index.nodes))
            return Outcome(None, "Unschedulable", state.explained[why])
    pods = _in_order(gang, settings)
    least: dict[str, int] = {}
    if len(entries) > 1:  # a necessary condition, before any search: enough free in all
        least = _least_needs(pods, needed)
        eligible = {name for entry in entries.values() for name in entry.eligible}
        shortfall = _shortfall(least, eligible, free, settings)
        if shortfall:
            return Outcome(None, "Unschedulable", _explain_shortfall(shortfall, needed))
    if gang.topology_key:
        return _place_in_one_domain(gang, needed, pods, least, entries, free, settings, state)
    placement = _greedy(pods, entries, free)
    if len(placement) >= needed:
        return Outcome(placement)
    if len(entries) > 1:
        if (why_not := state.why_no_search(gang, settings)) is not None:
            return Outcome(
                None,
                "BudgetExhausted",
                f"{why_not}; greedy placement fit {len(placement)} of the needed {needed}",
                keep=False,
            )
        budget = Budget(settings.gang_budget)
        try:
            found = _search(pods, needed, entries, free, budget, settings.accelerators)
        finally:
            state.spent(gang, budget.visits)
        if found is not None:
            return Outcome(found)
        if budget.exhausted:
            return Outcome(
                None,
                "BudgetExhausted",
                _exhausted(budget) + explain(gang, needed, pods, placement, entries, len(index.nodes)),
            )
    return Outcome(None, "Unschedulable", explain(gang, needed, pods, placement, entries, len(index.nodes)))


def _place_in_one_domain(
    gang: Gang,
    needed: int,
    pods: Sequence[Pod],
    least: Mapping[str, int],
    entries: Mapping[Shape, ShapeEntry],
    free: Mapping[str, dict[str, int]],
    settings: PlannerSettings,
    state: PassState,
) -> Outcome:
    """All of the gang in one domain of `key`: the fitting domain with the least free capacity.
    Mixed gangs: a domain without enough free in all is skipped; the search shares one budget
    over the domains."""
    key = gang.topology_key or ""
    biggest = pods[0].shape
    domains, unlabeled = domains_of(entries, key)
    why_not = state.why_no_search(gang, settings)
    budget = Budget(settings.gang_budget) if why_not is None else None
    skipped = False  # a domain greedy could not fill was not searched: the pass's budget is spent
    try:
        for domain in least_waste_first(domains, biggest):
            if len(entries) == 1 and domain.capacity(biggest) < needed:
                continue  # known from the totals
            mixed = len(entries) > 1
            if mixed and _shortfall(least, _names(domain.shapes), free, settings):
                continue  # not enough free there in all
            placement = _greedy(pods, domain.shapes, free)
            if len(placement) >= needed:
                return Outcome(placement)
            if not mixed:
                continue
            if budget is None:
                skipped = True
            elif not budget.exhausted:
                found = _search(pods, needed, domain.shapes, free, budget, settings.accelerators)
                if found is not None:
                    return Outcome(found)
    finally:
        if budget is not None:
            state.spent(gang, budget.visits)
    why = explain_domains(key, needed, domains, biggest, unlabeled)
    if skipped:
        return Outcome(None, "BudgetExhausted", f"{why_not}; {why}", keep=False)
    if budget is not None and budget.exhausted:
        return Outcome(None, "BudgetExhausted", _exhausted(budget) + why)
    return Outcome(None, "Unschedulable", why)


def _exhausted(budget: Budget) -> str:
    return (
        f"search budget exhausted after {budget.placements} placements tried ({budget.visits} node visits); "
    )


def _names(shapes: Mapping[Shape, NodesOfShape]) -> set[str]:
    return {name for view in shapes.values() for name in view.eligible}


def _in_order(gang: Gang, settings: PlannerSettings) -> list[Pod]:
    """The gang's pods biggest first (accelerators, CPU, memory), the pods of one shape together,
    in their order."""
    if len(gang.shapes) <= 1:
        return list(gang.pods)
    first = {pod.shape: i for i, pod in reversed(list(enumerate(gang.shapes)))}
    return sorted(gang.pods, key=lambda p: (_size(p, settings), -first[p.shape]), reverse=True)


def _least_needs(pods: Sequence[Pod], needed: int) -> dict[str, int]:
    """Per resource, what the `needed` pods asking least of it ask together: any `needed` of the
    gang's pods ask at least that much."""
    counts = Counter(pod.shape for pod in pods)
    shapes = {pod.shape: pod for pod in pods}
    names = {k for pod in shapes.values() for k, v in pod.requests.items() if v > 0}
    least: dict[str, int] = {}
    for k in names:
        asks = sorted((max(0, pod.requests.get(k, 0)), counts[shape]) for shape, pod in shapes.items())
        left, sum_ = needed, 0
        for value, count in asks:
            if left <= 0:
                break
            sum_ += value * min(count, left)
            left -= count
        if sum_ > 0:
            least[k] = sum_
    return least


def _shortfall(
    least: Mapping[str, int],
    names: Iterable[str],
    free: Mapping[str, Mapping[str, int]],
    settings: PlannerSettings,
) -> list[tuple[str, int, int]]:
    """The resources the nodes `names` have less of, free in all, than `least`: (resource, needed,
    free), accelerators first."""
    if not least:
        return []
    have = dict.fromkeys(least, 0)
    for name in names:
        room = free[name]
        for k in have:
            v = room.get(k, 0)
            if v > 0:
                have[k] += v
    short = [(k, need, have[k]) for k, need in least.items() if need > have[k]]
    return sorted(short, key=lambda s: (s[0] not in settings.accelerators, s[0] in ("cpu", "memory"), s[0]))


def resource_shortfall(
    gang: Gang, eligible: Iterable[str], free: Mapping[str, Mapping[str, int]], settings: PlannerSettings
) -> list[tuple[str, int, int]]:
    """The check made before a mixed gang is searched, for any gang: per resource, what the pods
    still to place ask in all (the least any `needed` of them ask) against what the `eligible`
    nodes have free in all, where that is less: (resource, needed, free), accelerators first."""
    needed = max(0, gang.min_member - gang.released)
    return _shortfall(_least_needs(gang.pods, needed), eligible, free, settings)


def _explain_shortfall(shortfall: Sequence[tuple[str, int, int]], needed: int) -> str:
    parts = []
    for i, (k, need, have) in enumerate(shortfall):
        pods = f" for {needed} pods" if i == 0 else ""
        parts.append(
            f"needs {amount(k, need)} {k} in all{pods}; eligible nodes have {amount(k, have)} free: "
            f"short by {amount(k, need - have)}"
        )
    return "; ".join(parts)


def _versions(entries: Mapping[Shape, ShapeEntry]) -> tuple[int, ...]:
    """What a held gang's outcome depends on: for alike pods, the shape's room per node (with a
    topology constraint too: a domain's totals are its nodes'); for mixed pods, the room of
    every eligible node of each shape."""
    if len(entries) == 1:
        (entry,) = entries.values()
        return (entry.stats_version,)
    return tuple(v for e in entries.values() for v in (e.stats_version, e.room_version))


def _size(pod: Pod, settings: PlannerSettings) -> tuple[int, ...]:
    r = pod.requests
    return (sum(r.get(a, 0) for a in settings.accelerators), r.get("cpu", 0), r.get("memory", 0))


def _share(pod: Pod, room: Mapping[str, int]) -> float:
    """How many such pods the room takes, as a fraction: 0.5 is half of one pod's needs free."""
    shares = []
    for k, v in pod.requests.items():
        if v > 0:
            have = max(0, room.get(k, 0))
            shares.append(have / v if have < v * 1_000_000_000 else 1e9)
    return min(shares) if shares else 1e9


def _take(room: Mapping[str, int], requests: Mapping[str, int]) -> dict[str, int]:
    """The room left after a pod: its positive requests taken (a negative one frees nothing)."""
    out = dict(room)
    for k, v in requests.items():
        if v > 0:
            out[k] = out.get(k, 0) - v
    return out


def _greedy(
    pods: Sequence[Pod], entries: Mapping[Shape, NodesOfShape], free: Mapping[str, dict[str, int]]
) -> list[tuple[Pod, Node]]:
    """Best fit, a shape at a time: walk the shape's nodes in best-fit order and fill each in
    turn. For pods that are alike this is exactly placing each pod on the tightest node that
    takes it (a node only gets tighter as it fills). Linear in the nodes walked and the pods."""
    room: dict[str, dict[str, int]] = {}  # what this gang would take, over the committed `free`
    placement: list[tuple[Pod, Node]] = []
    by_shape: dict[Shape, list[Pod]] = {}
    for pod in pods:  # pods come biggest first; shapes keep that order
        by_shape.setdefault(pod.shape, []).append(pod)
    for shape, waiting in by_shape.items():
        i, count = 0, len(waiting)
        nodes = entries.get(shape)  # None: no node of this domain may take such pods
        for _, node in nodes.ordered if nodes is not None else ():
            current = room.get(node.name)
            if current is None:
                current = free[node.name]
            while i < count and fits(waiting[i].requests, current):
                current = _take(current, waiting[i].requests)
                placement.append((waiting[i], node))
                i += 1
            room[node.name] = current
            if i >= count:
                break
    return placement


class _Frame:
    """One pod's step of the search: the nodes to try it on, and where it is now."""

    __slots__ = ("candidates", "i", "left_out", "node", "pos", "rank", "saved", "tried")

    def __init__(self, i: int, candidates: list[tuple[Key, int, Node]], left_out: bool = False) -> None:
        self.i = i
        self.candidates = candidates  # (best-fit key now, rank in the shape's order, node)
        self.pos = 0
        self.tried: dict[tuple[object, ...], int] = {}  # equivalent nodes tried: lowest rank
        self.node: Node | None = None  # where the pod is now (None: left out, or not yet)
        self.rank = 0
        self.saved: dict[str, int] | None = None  # the node's room before the pod
        self.left_out = left_out  # True: leaving it out is not worth trying (or was tried)


def _search(
    pods: Sequence[Pod],
    needed: int,
    entries: Mapping[Shape, NodesOfShape],
    free: Mapping[str, dict[str, int]],
    budget: Budget,
    accelerators: tuple[str, ...],
) -> list[tuple[Pod, Node]] | None:
    """Depth-first search for `needed` of the pods placed together, with an explicit stack (no
    recursion), bounded by `budget` (node visits); None if there is no such placement or the
    budget ran out (`budget.exhausted`). `pods` come biggest first, the pods of one shape together.

    Each pod in turn goes on each node with room for it, tightest first, or is left out. Only the
    nodes of the shape's best-fit order (those with room for one when the search starts) can take
    it. Pods of one shape are interchangeable, so they take nodes in that order (a pod never goes
    before the node of the pod of its shape before it), and when one is left out so are the rest
    of its shape. Of nodes with the same room and the same eligibility for the gang's shapes, only
    the first in that order is tried. A step whose nodes cannot take enough of its shape for the
    gang to reach `needed` (even with every pod after its shape) is not tried at all."""
    if needed <= 0:
        return []
    count = len(pods)
    block_end = [0] * count  # where the pods of each pod's shape end
    end = count
    for i in range(count - 1, -1, -1):
        if i + 1 < count and pods[i + 1].shape != pods[i].shape:
            end = i + 1
        block_end[i] = end
    shapes = list(entries)
    room: dict[str, dict[str, int]] = {}  # the gang's pods placed so far, over `free`
    signatures: dict[str, tuple[bool, ...]] = {}  # eligibility for each of the gang's shapes
    states: dict[str, tuple[dict[str, int], tuple[object, ...]]] = {}  # (room, its key), cached
    chosen: list[tuple[Pod, Node]] = []
    stack: list[_Frame] = []
    needs_cache: dict[Shape, tuple[tuple[tuple[str, int], ...], int, int, int]] = {}

    def needs_of(pod: Pod) -> tuple[tuple[tuple[str, int], ...], int, int, int]:
        """The pod's positive requests, and its accelerators, CPU and memory (as in the index)."""
        cached = needs_cache.get(pod.shape)
        if cached is None:
            r = pod.requests
            needs = tuple((k, v) for k, v in r.items() if v > 0)
            accel = sum(r.get(a, 0) for a in accelerators)
            cached = needs_cache[pod.shape] = (needs, accel, r.get("cpu", 0), r.get("memory", 0))
        return cached

    def open_frame(i: int) -> _Frame | None:
        """The step for pod i; None when the budget cannot pay for it."""
        pod = pods[i]
        before = stack[-1] if stack else None
        start = (
            before.rank
            if before is not None and before.node is not None and pods[before.i].shape == pod.shape
            else 0
        )
        nodes = entries.get(pod.shape)  # None: no node of this domain may take such pods
        ordered = nodes.ordered if nodes is not None else []
        slots_of = nodes.room if nodes is not None else {}
        if not budget.spend(max(1, len(ordered) - start)):
            return None
        needs, accel, cpu, memory = needs_of(pod)
        candidates: list[tuple[Key, int, Node]] = []
        capacity, most = 0, block_end[i] - i  # how many of this shape's pods the nodes take
        for rank in range(start, len(ordered)):
            key, node = ordered[rank]
            current = room.get(node.name)
            if current is None:  # untouched: as in the index, with room for one
                candidates.append((key, rank, node))
                capacity += slots_of.get(node.name, 1)
                continue
            fit = _MANY  # the gang took some of it: how many fit now, and scored again
            for k, v in needs:
                have = current.get(k, 0) // v
                if have < fit:
                    fit = have
                    if fit <= 0:
                        break
            if fit > 0:
                tightness = sum(current.get(a, 0) for a in accelerators) - accel
                score = (
                    key[0],
                    tightness,
                    current.get("cpu", 0) - cpu,
                    current.get("memory", 0) - memory,
                    key[4],
                )
                candidates.append((score, rank, node))
                capacity += fit
        if min(capacity, most) + (count - block_end[i]) < needed - len(chosen):
            return _Frame(i, [], left_out=True)  # not enough room for the gang down this path
        candidates.sort()
        return _Frame(i, candidates)

    def state_of(name: str, current: dict[str, int]) -> tuple[object, ...]:
        cached = states.get(name)
        if cached is not None and cached[0] is current:
            return cached[1]
        signature = signatures.get(name)
        if signature is None:
            signature = signatures[name] = tuple(name in entries[s].eligible for s in shapes)
        state = (tuple(sorted(current.items())), signature)
        states[name] = (current, state)
        return state

    def advance(frame: _Frame) -> bool:
        """Put the frame's pod on its next node, or leave it out; False when all are tried."""
        pod = pods[frame.i]
        candidates = frame.candidates
        while frame.pos < len(candidates):
            if not budget.spend(1):
                return False
            _, rank, node = candidates[frame.pos]
            frame.pos += 1
            current = room.get(node.name)
            if current is None:
                current = free[node.name]
            state = state_of(node.name, current)
            seen = frame.tried.get(state)
            if seen is not None and seen <= rank:
                continue  # an equivalent node, no later in the order, was tried for this pod
            frame.tried[state] = rank if seen is None else min(seen, rank)
            frame.saved = room.get(node.name)
            room[node.name] = _take(current, pod.requests)
            frame.node, frame.rank = node, rank
            chosen.append((pod, node))
            budget.placements += 1
            return True
        if not frame.left_out:
            frame.left_out = True
            frame.node = None
            return True
        return False

    def undo(frame: _Frame) -> None:
        if frame.node is not None:
            chosen.pop()
            if frame.saved is None:
                del room[frame.node.name]
            else:
                room[frame.node.name] = frame.saved
            frame.node, frame.saved = None, None

    def after(frame: _Frame) -> int:
        """The next pod to place: the next one, or past its shape when it is left out."""
        return frame.i + 1 if frame.node is not None else block_end[frame.i]

    i = 0
    while True:
        if len(chosen) >= needed:
            return list(chosen)
        descended = False
        if i < count and len(chosen) + (count - i) >= needed:
            frame = open_frame(i)
            if frame is None:
                return None  # budget.exhausted
            stack.append(frame)
            if advance(frame):
                i, descended = after(frame), True
            else:
                stack.pop()
        while not descended:  # backtrack: the deepest step with something left to try
            if not stack or budget.exhausted:
                return None
            frame = stack[-1]
            undo(frame)
            if advance(frame):
                i, descended = after(frame), True
            else:
                stack.pop()


@dataclass
class CompositeFamily:
    """The queue's gangs under their CompositePodGroups: each composite's children (gangs and
    child composites, in queue order of their first gang) and the composite at the top of each
    gang's chain. A chain with a composite not known, a loop, or more than
    `MAX_COMPOSITE_DEPTH` levels is planned only up to there (the operator holds such gangs)."""

    composites: Mapping[tuple[str, str], Composite]
    children: dict[tuple[str, str], list[Gang | tuple[str, str]]] = field(default_factory=dict)
    roots: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # composite -> top

    @classmethod
    def of(cls, ordered: Sequence[Gang], composites: Mapping[tuple[str, str], Composite]) -> CompositeFamily:
        family = cls(composites)
        for gang in ordered:
            if gang.composite is None or (gang.namespace, gang.composite) not in composites:
                continue
            key = (gang.namespace, gang.composite)
            family.children.setdefault(key, []).append(gang)
            chain = [key]
            while key not in family.roots and len(chain) < MAX_COMPOSITE_DEPTH:
                parent = composites[key].parent
                up = (key[0], parent) if parent is not None else None
                if up is None or up not in composites or up in chain:
                    break
                if key not in family.children.setdefault(up, []):
                    family.children[up].append(key)
                key = up
                chain.append(key)
            top = family.roots.get(key, key)
            for each in chain:
                family.roots[each] = top
        return family

    def root_of(self, gang: Gang) -> tuple[str, str] | None:
        return self.roots.get((gang.namespace, gang.composite)) if gang.composite is not None else None

    def gangs_under(self, key: tuple[str, str]) -> list[Gang]:
        found: list[Gang] = []
        for child in self.children.get(key, []):
            found += [child] if isinstance(child, Gang) else self.gangs_under(child)
        return found


def _pinned(gang: Gang, pins: Mapping[str, str]) -> Gang:
    """The gang with its pods confined to the domains its composites were pinned to."""
    if not pins:
        return gang
    return replace(gang, pods=tuple(replace(p, node_selector={**p.node_selector, **pins}) for p in gang.pods))
