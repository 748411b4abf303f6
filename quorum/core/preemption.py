"""Whole-gang preemption: which running work a held gang may take the room of, and which work
it takes (docs/preemption.md).

A pure function of a snapshot: the nodes, the room free on each after the planning pass, the
work running there and the PodDisruptionBudgets. Work is taken whole: a gang with all its bound
pods (a Kubernetes 1.36 PodGroup with `disruptionMode: Pod` pod by pod), a pod that is in no gang
alone.

Which work a gang may take: work of lower priority; work of equal priority when that work is
labelled interruptable and the preemptor is not (so two such gangs never take turns preempting
each other); never work annotated `quorum.dev/preemptible: "false"` (the platform's), pods of a
system-critical priority (above the highest a PriorityClass of users may have), DaemonSet or
static pods, or pods already terminating.

PodDisruptionBudgets are kept where they can be, as kube-scheduler's preemption keeps them: work
a budget would let go whole comes before any work it would not. A budget never vetoes a
preemption: priority is the platform's order, a budget is the tenant's own, and a budget that
allowed nothing would make its work immune whatever its priority.

Which of it: the candidates are put in one order of preference — work whose budgets let it go
first, then interruptable, then the lowest priority, then the youngest (least work lost), then
the fewest pods — and the set taken
is the least in that order among the sets that free enough (the *colex* order: a set that avoids
the least preferred candidate of another beats it, whatever else it takes). It is found exactly:
the shortest prefix of the order that lets the gang fit (a binary search; fitting only gets
easier as more is freed), then each candidate but the last is dropped again, the least
preferred first, if the gang still fits without it. Each check plans the gang, alone, over the
nodes it may use with the chosen work's room freed (the planner's own placement, topology
included). The checks are bounded (`max_checks`); when they run out while dropping, the set
found so far is taken (it frees enough, and is minimal in the part already checked).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from quorum.core.explain import amount
from quorum.core.fit import why_not
from quorum.core.model import Gang, Node, Pod, Resources, add, subtract
from quorum.core.planner import Planner, PlannerSettings, Release
from quorum.core.topology import noun

INTERRUPTABLE_LABEL = "qos.coreweave.cloud/interruptable"
PREEMPTIBLE_ANNOTATION = "quorum.dev/preemptible"
# Kubernetes' HighestUserDefinablePriority: a PriorityClass above it is a system one
# (system-cluster-critical, system-node-critical), and its pods are never a preemption's victims.
HIGHEST_USER_PRIORITY = 1_000_000_000


@dataclass(frozen=True, slots=True)
class RunningPod:
    """A bound pod as preemption needs it."""

    uid: str
    namespace: str
    name: str
    node: str
    requests: Resources
    priority: int = 0
    gang: str | None = None  # the quorum gang it belongs to (label quorum.dev/gang)
    started: float = 0.0  # when it started (epoch seconds)
    interruptable: bool = False
    preemptible: bool = True  # False: annotated quorum.dev/preemptible: "false"
    stays: bool = False  # a DaemonSet's or static pod: evicted, it would come back on the node
    terminating: bool = False


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """What a gang's group object says about preempting the gang."""

    priority: int | None = None  # a 1.36 PodGroup's own priority (None: its pods' highest)
    disruption_mode: str | None = None  # 1.36 `disruptionMode`: Pod lets pods go one by one
    preemptible: bool = True


@dataclass(frozen=True, slots=True)
class Work:
    """What preemption takes at once: a gang (all its bound pods), or one pod."""

    kind: str  # "gang" | "pod"
    namespace: str
    name: str  # the gang's name, or the pod's
    pods: tuple[RunningPod, ...]
    priority: int
    started: float  # the latest start among its pods: when it was last whole
    interruptable: bool = False
    preemptible: bool = True
    gang: str | None = None  # for a pod taken alone out of a gang (disruptionMode Pod)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)

    def describe(self) -> str:
        what = (
            f"gang {self.namespace}/{self.name}"
            if self.kind == "gang"
            else f"pod {self.namespace}/{self.name}"
        )
        label = ", interruptable" if self.interruptable else ""
        return f"{what} (priority {self.priority}{label}, {_plural(len(self.pods), 'pod')})"

    def entry(self, reader: str) -> dict[str, object]:
        """The work in the preemptor's record (`status.preemption.victims`), which the tenant of
        namespace `reader` reads: its namespace and name only if it is of that namespace."""
        named = {"namespace": self.namespace, "name": self.name} if self.namespace == reader else {}
        return {"kind": self.kind, **named, "pods": len(self.pods), "priority": self.priority}


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget: the uids of the pods it selects, and how many may go now."""

    namespace: str
    name: str
    pods: frozenset[str]
    allowed: int  # status.disruptionsAllowed


@dataclass(frozen=True, slots=True)
class PastBudget:
    """A PodDisruptionBudget the victims together take more pods of than it allows."""

    namespace: str
    name: str
    allowed: int
    takes: int

    def __str__(self) -> str:
        allows = max(0, self.allowed)
        return f"PodDisruptionBudget {self.namespace}/{self.name} (allows {allows}, takes {self.takes})"


@dataclass(frozen=True, slots=True)
class PreemptionSettings:
    max_candidates: int = 512
    """Work items considered, the most preferred first: more are never looked at in one try."""
    max_checks: int = 64
    """Times one try plans the gang over its nodes (each costs about what planning the gang in a
    pass does); when they run out while dropping victims again, the set found so far is taken."""


@dataclass(frozen=True, slots=True)
class Preemption:
    """A preemption decided, and what each side is told of it.

    What is written into a namespace (the preemptor's Gang and Events; a victim's pods, Gang and
    Events) is read by that namespace's tenant, so it names only objects of that namespace: work
    and budgets of other namespaces are counted, not named, and nodes are counted (a tenant
    cannot read nodes; docs/threat-model.md, "What a tenant can read"). The platform's record
    (`reader` None: the operator's log, an Event in quorum's own namespace) names everything."""

    gang: Gang
    victims: tuple[Work, ...]
    placement: tuple[tuple[Pod, Node], ...]  # where the gang fits once the victims are gone
    need: str  # "32 nvidia.com/gpu in rack rack-002": what the gang needed, for every message
    checks: int = 0
    past_budgets: tuple[PastBudget, ...] = ()  # the budgets the victims together take more of than allowed

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({node.name for _, node in self.placement}))

    def summary(self, reader: str | None = None, named: int | None = 5) -> str:
        """What it takes and why, as the tenant of namespace `reader` may read it (the
        preemptor's `Preempting` condition and Event), or in full (None). `named`: at most this
        many victims are named (None: all)."""
        gangs = sum(1 for v in self.victims if v.kind == "gang")
        pods = len(self.victims) - gangs
        parts = [_plural(gangs, "gang")] if gangs else []
        parts += [_plural(pods, "pod")] if pods else []
        mine = [v for v in self.victims if reader is None or v.namespace == reader]
        shown = mine if named is None else mine[:named]
        told = [v.describe() for v in shown]
        if len(mine) > len(shown):
            told.append(f"and {len(mine) - len(shown)} more")
        others = [v for v in self.victims if reader is not None and v.namespace != reader]
        if others:
            told.append(_elsewhere(others))
        past = self.budgets_passed(reader)
        return f"needed {self.need}: preempting {' and '.join(parts)}: {'; '.join(told)}{past}"

    def budgets_passed(self, reader: str | None = None) -> str:
        """The budgets passed, as `; past PodDisruptionBudget ns/name (allows 0, takes 1)`: those
        of `reader`'s namespace named, the others counted (None: all named); "" for none."""
        mine = [str(b) for b in self.past_budgets if reader is None or b.namespace == reader]
        others = sum(1 for b in self.past_budgets if reader is not None and b.namespace != reader)
        if others:
            mine.append(f"{_plural(others, 'PodDisruptionBudget')} of other namespaces")
        return f"; past {'; '.join(mine)}" if mine else ""

    def reserved(self, reader: str | None = None) -> str:
        """The nodes reserved for the gang: counted for a tenant, named for the platform."""
        if reader is None:
            return f"reserved nodes {', '.join(self.nodes)}"
        return f"reserved {_plural(len(self.nodes), 'node')}"

    def announced(self, reader: str | None = None, named: int | None = 5) -> str:
        """The `Preempting` Event: on the preemptor's Gang for the tenant of `reader`, or the
        platform's record (None), which says whose preemption it is."""
        if reader is not None:
            return f"{self.summary(reader, named)}; {self.reserved(reader)}"
        whose = f"gang {self.gang.namespace}/{self.gang.name} (priority {self.gang.priority})"
        return f"{whose} {self.summary(None, named)}; {self.reserved(None)}"

    def preempted_by(self, reader: str) -> str | None:
        """The preemptor as a victim of namespace `reader` may know it (its Gang's
        `status.preempted.by`): namespace/name when it is of the same namespace, else None."""
        return f"{self.gang.namespace}/{self.gang.name}" if reader == self.gang.namespace else None

    def told(self, reader: str) -> str:
        """What a victim of namespace `reader` is told (its pods' DisruptionTarget condition, its
        Gang's `Preempted` condition and Event): the preemptor named only if it is of the same
        namespace, and the budgets of `reader` that were passed."""
        by = self.preempted_by(reader) or "a gang of another namespace"
        own = [str(b) for b in self.past_budgets if b.namespace == reader]
        past = f"; past {'; '.join(own)}" if own else ""
        return f"preempted by {by} (priority {self.gang.priority}): needed {self.need}{past}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


def _elsewhere(work: Sequence[Work]) -> str:
    """Work of other namespaces, counted: "3 pods of other namespaces (2 gangs whole, 1 pod
    alone; priority ≤ 100)"."""
    gangs = sum(1 for w in work if w.kind == "gang")
    alone = len(work) - gangs
    kinds = [f"{_plural(gangs, 'gang')} whole"] if gangs else []
    kinds += [f"{_plural(alone, 'pod')} alone"] if alone else []
    pods = sum(len(w.pods) for w in work)
    top = max(w.priority for w in work)
    return f"{_plural(pods, 'pod')} of other namespaces ({', '.join(kinds)}; priority ≤ {top})"


@dataclass(frozen=True, slots=True)
class NoPreemption:
    gang: Gang
    reason: str  # NothingToPreempt | WouldNotFit | Unproven | Fits (nothing is needed)
    message: str
    checks: int = 0


# Constraints quorum does not model that can keep a gang from binding however much room there is
# (a pod it must sit beside that does not exist, a port another pod holds). Volumes, topology
# spreads and pod anti-affinity (one pod per node), which ordinary training gangs carry, are not
# among them: such gangs keep preemption.
BLOCKING_UNMODELED = frozenset({"required pod affinity", "host ports"})


def unproven_fit(gang: Gang) -> str | None:
    """Why quorum cannot show that the gang would bind once room is made, or None. Its pods'
    hard constraints that quorum does not model could keep it pending on any room, and deleting
    others' work for nothing is the worst quorum can do; so such a gang preempts only once some
    of its members have been released and bound before (kube-scheduler placed them)."""
    blocking = sorted({c for pod in gang.pods for c in pod.unmodeled if c in BLOCKING_UNMODELED})
    if not blocking or gang.released > 0:
        return None
    return (
        f"its pods have {' and '.join(blocking)}, which quorum does not model: it cannot show the gang "
        "would bind once room is made, so it takes no one's work for it (it does once members of it "
        "have been placed before)"
    )


def may_take(preemptor_priority: int, preemptor_interruptable: bool, work: Work) -> bool:
    """Whether a gang of this priority may take `work` at all."""
    if not work.preemptible or work.priority > HIGHEST_USER_PRIORITY:
        return False
    if work.priority < preemptor_priority:
        return True
    return work.priority == preemptor_priority and work.interruptable and not preemptor_interruptable


def preference(work: Work) -> tuple[object, ...]:
    """The order in which work is taken: interruptable first, the lowest priority, the youngest
    (the least work lost), the fewest pods; then by name, so that the order is total."""
    return (not work.interruptable, work.priority, -work.started, len(work.pods), work.key)


def units(pods: Sequence[RunningPod], groups: Mapping[tuple[str, str], GroupFacts]) -> list[Work]:
    """The running work as preemption takes it: each gang whole (with `disruptionMode: Pod`,
    each of its pods alone), each pod in no gang alone. Pods that stay on their node when
    deleted (DaemonSets', static pods), pods of a system-critical priority and terminating pods
    are no one's to take; a gang with one such pod is not taken either."""
    by_gang: dict[tuple[str, str], list[RunningPod]] = {}
    out: list[Work] = []
    for pod in pods:
        if pod.gang is not None:
            by_gang.setdefault((pod.namespace, pod.gang), []).append(pod)
        elif _takeable(pod):
            out.append(_alone(pod, None, pod.priority, True))
    for (namespace, name), members in by_gang.items():
        facts = groups.get((namespace, name), GroupFacts())
        priority = facts.priority if facts.priority is not None else max(p.priority for p in members)
        if facts.disruption_mode == "Pod":
            out += [_alone(p, name, priority, facts.preemptible) for p in members if _takeable(p)]
            continue
        if not all(_takeable(p) for p in members):
            continue  # taking the rest would free room only while splitting it
        out.append(
            Work(
                "gang",
                namespace,
                name,
                tuple(sorted(members, key=lambda p: p.name)),
                priority,
                max(p.started for p in members),
                all(p.interruptable for p in members),
                facts.preemptible and all(p.preemptible for p in members),
            )
        )
    return out


def _takeable(pod: RunningPod) -> bool:
    return not pod.stays and not pod.terminating and pod.priority <= HIGHEST_USER_PRIORITY


def _alone(pod: RunningPod, gang: str | None, priority: int, preemptible: bool) -> Work:
    return Work(
        "pod",
        pod.namespace,
        pod.name,
        (pod,),
        priority,
        pod.started,
        pod.interruptable,
        preemptible and pod.preemptible,
        gang,
    )


def choose_victims(
    gang: Gang,
    nodes: Mapping[str, Node],
    free: Mapping[str, Resources],
    work: Sequence[Work],
    budgets: Sequence[DisruptionBudget] = (),
    *,
    interruptable: bool = False,
    planner: PlannerSettings | None = None,
    settings: PreemptionSettings | None = None,
) -> Preemption | NoPreemption:
    """The work `gang` takes to fit now (see the module's doc), or why it takes none. `free`:
    each node's room after the pass (allocatable minus bound pods, reservations and the pass's
    own releases); `interruptable`: the preemptor is labelled interruptable itself."""
    planner = planner or PlannerSettings()
    settings = settings or PreemptionSettings()
    gang = replace(gang, held_since=None)  # a check plans the gang alone: no capacity held
    eligible = {
        name: node
        for name, node in nodes.items()
        if name in free and any(why_not(pod, node, planner.fit) is None for pod in gang.shapes)
    }
    checker = _Checker(gang, eligible, free, planner)
    if checker.placement([]) is not None:
        return NoPreemption(gang, "Fits", "it fits without taking anything", checker.checks)
    if (unproven := unproven_fit(gang)) is not None:
        return NoPreemption(gang, "Unproven", unproven)
    lower = [w for w in work if may_take(gang.priority, interruptable, w)]
    useful = [w for w in lower if any(p.node in eligible for p in w.pods)]
    candidates = _within_budgets_first(sorted(useful, key=preference), budgets)
    candidates = candidates[: settings.max_candidates]
    if not candidates:
        return NoPreemption(
            gang,
            "NothingToPreempt",
            f"no running work on the {len(eligible)} nodes it may use is of lower priority than "
            f"{gang.priority} (or of equal priority and interruptable) and preemptible",
        )
    if checker.placement(candidates) is None:
        why = (
            f"it would not fit even with all {len(candidates)} lower-priority work items it may take gone "
            f"from the {len(eligible)} nodes it may use"
        )
        return NoPreemption(gang, "WouldNotFit", why, checker.checks)
    low, high = 1, len(candidates)  # the shortest prefix that fits: fitting is monotone in it
    while low < high:
        middle = (low + high) // 2
        if checker.placement(candidates[:middle]) is not None:
            high = middle
        else:
            low = middle + 1
    chosen = list(range(high))
    for i in reversed(range(high - 1)):  # the last of the prefix is needed: the one before did not fit
        if checker.checks >= settings.max_checks:
            break
        without = [j for j in chosen if j != i]
        if checker.placement([candidates[j] for j in without]) is not None:
            chosen = without
    victims = [candidates[j] for j in chosen]
    placement = checker.placement(victims)
    assert placement is not None  # a set that was checked to fit, or the whole prefix
    return Preemption(
        gang,
        tuple(victims),
        placement,
        _need(gang, placement),
        checker.checks,
        _budgets_broken(victims, budgets),
    )


@dataclass
class _Checker:
    """Plans the gang alone over its nodes with some work's room freed; counts the checks."""

    gang: Gang
    nodes: Mapping[str, Node]
    free: Mapping[str, Resources]
    settings: PlannerSettings
    checks: int = 0
    cache: dict[tuple[tuple[str, str, str], ...], tuple[tuple[Pod, Node], ...] | None] = field(
        default_factory=dict
    )

    def placement(self, victims: Sequence[Work]) -> tuple[tuple[Pod, Node], ...] | None:
        key = tuple(sorted(w.key for w in victims))
        if key in self.cache:
            return self.cache[key]
        self.checks += 1
        freed: dict[str, dict[str, int]] = {}
        for w in victims:
            for pod in w.pods:
                if pod.node in self.nodes:
                    freed[pod.node] = add(freed.get(pod.node, {}), pod.requests)
        used = {
            name: subtract(node.allocatable, add(self.free[name], freed.get(name, {})))
            for name, node in self.nodes.items()
        }
        plan = Planner(self.settings).plan(self.nodes, used, [self.gang])
        found = next((r for r in plan.releases if isinstance(r, Release)), None)
        result = found.placement if found is not None else None
        self.cache[key] = result
        return result


def _within_budgets_first(ordered: Sequence[Work], budgets: Sequence[DisruptionBudget]) -> list[Work]:
    """The work in the order of preference, but what the budgets let go *together with the work
    before it* first (kube-scheduler's filterPodsWithPDBViolation): every prefix of that part
    keeps every budget, so a set that keeps them all is found before one that passes one."""
    taken = [0] * len(budgets)  # pods of each budget the work kept so far takes
    within: list[Work] = []
    past: list[Work] = []
    for work in ordered:
        uids = {p.uid for p in work.pods}
        counts = [len(uids & b.pods) for b in budgets]
        if all(t + n <= b.allowed for t, n, b in zip(taken, counts, budgets, strict=True) if n):
            within.append(work)
            taken = [t + n for t, n in zip(taken, counts, strict=True)]
        else:
            past.append(work)
    return within + past


def _budgets_broken(victims: Sequence[Work], budgets: Sequence[DisruptionBudget]) -> tuple[PastBudget, ...]:
    """The budgets the victims together take more pods of than they allow."""
    uids = {p.uid for w in victims for p in w.pods}
    out = []
    for budget in budgets:
        taken = len(uids & budget.pods)
        if taken > budget.allowed:
            out.append(PastBudget(budget.namespace, budget.name, budget.allowed, taken))
    return tuple(out)


def _need(gang: Gang, placement: Sequence[tuple[Pod, Node]]) -> str:
    """What the gang needs, in the resource that matters most: "32 nvidia.com/gpu in rack
    rack-002" (its accelerators if it asks for any, else CPU)."""
    total: Counter[str] = Counter()
    for pod, _ in placement:
        total.update({k: v for k, v in pod.requests.items() if v > 0})
    resource = next(
        (k for k in total if k not in ("cpu", "memory", "pods", "ephemeral-storage")),
        "cpu" if total["cpu"] else "pods",
    )
    need = (
        f"{amount(resource, total[resource])} {resource}" if resource != "pods" else f"{len(placement)} pods"
    )
    if gang.topology_key and placement:
        domain = placement[0][1].labels.get(gang.topology_key)
        if domain is not None:
            need += f" in {noun(gang.topology_key)} {domain}"
    return need
