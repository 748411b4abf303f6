"""Devices of Dynamic Resource Allocation (DRA) as the planner counts them: pure, plain data in.

A DRA cluster publishes its devices in ResourceSlices and pods ask for them through
ResourceClaims (or through an extended resource that a DeviceClass maps to DRA). The planner
counts resources per node and adds them up pod by pod, so devices are turned into such
resources here, exactly:

- A *kind* is what one request asks for: a DeviceClass and the request's own selectors. A node's
  free devices each match some kinds (CEL, `quorum.core.device_cel`, cached per device).
- Kinds that some device matches together overlap; overlapping kinds form a component. For each
  non-empty set T of kinds of one component, the node's capacity of the resource "T" is the
  number of its free devices that match a kind of T, and a pod asks of "T" the devices its
  requests of kinds in T ask. By Hall's theorem, pods fit a node's devices (each request its own
  devices, no device twice) exactly when every such resource fits: the planner's additive check
  is exact, without knowing devices. `assign` then picks the devices themselves.
- A request of mode All takes every device it matches on the node: a token of one per node
  whose matching devices are all free, where no other kind matches them.

What is not modelled (a request of `firstAvailable` alternatives, claim constraints, devices of
pools that span nodes, a shared claim that several pods wait on before it is allocated, ...)
holds the gang with what it is (`DeviceHold`), never releases it as if it fitted.
docs/dra.md is the user's page.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations

from quorum.core.device_cel import DeviceView, SelectorCache, SelectorError, Version
from quorum.core.model import Gang, Node, Pod, PodClaim, Requirement

AttributeValue = bool | int | str | Version
DeviceKey = tuple[str, str, str]  # (driver, pool, device)
# Node selector terms (ORed) of requirements (key, operator, values, is a matchField), ANDed.
NodeTerms = tuple[tuple[tuple[str, str, tuple[str, ...], bool], ...], ...]
# The devices chosen for a release: pod uid -> (claim entry, request) -> devices.
Assignment = dict[str, dict[tuple[str, str], tuple[DeviceKey, ...]]]

# Resources that are never an extended resource served by DRA.
NATIVE_RESOURCES = frozenset({"cpu", "memory", "pods", "ephemeral-storage"})
IMPLICIT_EXTENDED_PREFIX = "deviceclass.resource.kubernetes.io/"
HOSTNAME = "kubernetes.io/hostname"  # one node's domain (a claim shared by a gang's pods)
WAITING = "WaitingForClaims"  # the hold reason while a pod's claim or its class is not there yet
MAX_KINDS_PER_COMPONENT = 6  # 2^6 - 1 = 63 resources per node at most for one component
MATCHING_SECONDS = 0.25  # a pass's time for matching kinds of request it has not seen before
KIND_SECONDS = 5.0  # a kind of request whose devices take longer than this to match is given up
TOKEN = 1000  # devices are counted like other resources, in milli-units


@dataclass(frozen=True, slots=True)
class Device:
    driver: str
    pool: str
    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)  # qualified names
    capacity: Mapping[str, str] = field(default_factory=dict)  # qualified names -> quantities
    # What its selectors see, made once with the device (a slice's devices live until it changes).
    view: DeviceView = field(init=False, repr=False, compare=False)
    key: DeviceKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "view", DeviceView(self.driver, self.attributes, self.capacity))
        object.__setattr__(self, "key", (self.driver, self.pool, self.name))


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...] = ()
    extended_resource_name: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One request of a claim, as modelled: `count` devices (ExactCount) or every device it
    matches on the node (`all_devices`), of a class, that pass the selectors."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    count: int = 1
    all_devices: bool = False
    # `firstAvailable`: the alternatives in order (each named "<request>/<alternative>"); the
    # fields above are the first's. A gang's pods take the same one, tried in order pass by pass.
    alternatives: tuple[DeviceRequest, ...] = ()
    # A claim's `matchAttribute` constraint on this request: its devices share this attribute's
    # value (a qualified name: "gpu.example.com/pcieRoot"), with those of the other requests
    # the constraint names (`match_with`, request names; empty: this request alone).
    match_attribute: str | None = None
    match_with: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Claim:
    """A ResourceClaim as the planner needs it (or a template's claim not made yet)."""

    namespace: str
    name: str  # the ResourceClaim's name ("" for a template's claim not made yet)
    requests: tuple[DeviceRequest, ...] = ()
    unmodeled: tuple[str, ...] = ()  # what of its spec quorum does not model
    allocated: bool = False
    # Where an allocated claim's devices are: nodes matching one of these terms.
    allocated_nodes: NodeTerms = ()
    shared: bool = False  # a ResourceClaim named by pods, not made from a template for one pod
    owner_pod: str | None = None  # the pod it was made for (its controller), if one


@dataclass(frozen=True, slots=True)
class Kind:
    """What a request asks, whatever its count: a class and the request's own selectors."""

    device_class: str
    selectors: tuple[str, ...] = ()
    extended: str | None = None  # asked as this extended resource, which kube-scheduler allocates
    match_attribute: str | None = None  # a request's devices share this attribute's value
    group_count: int = 0  # with match_attribute: how many a request asks (in one group)
    # With match_attribute: every request of the constraint (class, selectors, count), this one
    # among them; their devices all share one value. One request alone: just this one.
    together: tuple[tuple[str, tuple[str, ...], int], ...] = ()

    def label(self) -> str:
        text = f"devices of class {self.device_class}"
        if self.extended is not None:
            text += f" for {self.extended}"
        if self.selectors:
            selector = " && ".join(self.selectors)
            text += f" matching {selector[:60]}{'...' if len(selector) > 60 else ''}"
        if self.match_attribute is not None:
            text += f", {self.group_count} sharing one {self.match_attribute}"
            if len(self.together) > 1:
                text += f" with {len(self.together) - 1} other request{'s' if len(self.together) > 2 else ''}"
        return text


@dataclass(frozen=True, slots=True)
class Ask:
    """What one pod's request asks on the node it goes to: `count` devices of `kind`, or all."""

    kind: Kind
    count: int
    all_devices: bool = False
    claim: str = ""  # the pod's claim entry name ("" for an extended resource)
    request: str = ""  # the claim's request name (or the extended resource)


@dataclass(frozen=True, slots=True)
class DeviceWorld:
    """What DRA objects say, per node: the devices (of pools local to one node) with the ones
    allocated taken out, the classes, the claims; read by `quorum.k8s.devices`."""

    devices: Mapping[str, tuple[Device, ...]] = field(default_factory=dict)  # node -> free devices
    # node -> every device of local pools (free or not): All needs all free, the mapping counts all
    all_devices: Mapping[str, tuple[Device, ...]] = field(default_factory=dict)
    classes: Mapping[str, DeviceClass] = field(default_factory=dict)
    claims: Mapping[tuple[str, str], Claim] = field(default_factory=dict)  # (ns, name)
    # Pools (driver/pool) whose devices serve several nodes: each such device is among the
    # devices of every node it serves; the planner may count it on each, it is chosen once.
    shared_pools: frozenset[str] = frozenset()

    def extended_class(self, resource: str) -> DeviceClass | None:
        """The DeviceClass that serves an extended resource on nodes without it in allocatable."""
        if resource.startswith(IMPLICIT_EXTENDED_PREFIX):
            return self.classes.get(resource.removeprefix(IMPLICIT_EXTENDED_PREFIX))
        named = sorted(c.name for c in self.classes.values() if c.extended_resource_name == resource)
        return self.classes[named[0]] if named else None

    @property
    def empty(self) -> bool:
        return not self.devices and not self.classes


def reaches(terms: NodeTerms, node: Node) -> bool:
    """Whether the node matches one of the terms (a node selector's)."""
    return any(
        all(Requirement(k, op, vals, fld).matches_node(node.name, node.labels) for k, op, vals, fld in term)
        for term in terms
    )


def is_device_resource(name: str) -> bool:
    """A resource `DeviceCounts` made (its devices are kept by their claims' allocation)."""
    return name.startswith(("devices of ", "all devices of "))


class DevicesNotModelled(Exception):
    """A pod's device demand quorum cannot count: the gang is held with this message, and this
    reason (`WaitingForClaims` while a claim is still to be made: the gang is forming)."""

    def __init__(self, message: str, reason: str = "DevicesNotModelled") -> None:
        super().__init__(message)
        self.reason = reason


def asks_of(
    claims: Sequence[PodClaim],
    extended: Mapping[str, int],
    namespace: str,
    world: DeviceWorld,
    sharers: Mapping[tuple[str, str], int],
    alternative: int = 0,
    counted_already: Collection[str] = (),
    spanning: Collection[tuple[str, str]] = (),
) -> tuple[tuple[Ask, ...], tuple[NodeTerms, ...]]:
    """What a pod asks of devices, and the node terms its allocated shared claims pin it to.
    `extended`: its requests of extended resources (milli-units), served by DRA on nodes without
    them; `sharers`: how many pods waiting to be planned name each shared claim; `alternative`:
    which of each `firstAvailable` request's alternatives (the last, for fewer);
    `counted_already`: shared claims another pod of its gang asks for it; `spanning`: shared
    claims pods of several gangs name. Raises
    DevicesNotModelled with what it cannot count."""
    asks: list[Ask] = []
    pins: list[NodeTerms] = []
    for entry in claims:
        if entry.claim is not None:
            claim = world.claims.get((namespace, entry.claim))
            if claim is None:
                raise DevicesNotModelled(f"ResourceClaim {entry.claim} does not exist yet", WAITING)
            if claim.owner_pod is not None:  # kube-scheduler refuses it too: not this pod's to use
                raise DevicesNotModelled(f"ResourceClaim {entry.claim} was made for another pod")
        elif entry.template is not None:
            if entry.made is None:
                raise DevicesNotModelled(f"the ResourceClaim of {entry.name} is not made yet", WAITING)
            claim = world.claims.get((namespace, entry.made))
            if claim is None:
                raise DevicesNotModelled(f"ResourceClaim {entry.made} is not seen yet", WAITING)
        else:
            continue  # neither: the apiserver refuses such a pod; nothing to count
        if claim.allocated:
            pins.append(claim.allocated_nodes)
            continue
        if claim.unmodeled:
            raise DevicesNotModelled(f"ResourceClaim {claim.name}: " + "; ".join(claim.unmodeled))
        if claim.shared and sharers.get((namespace, claim.name), 0) > 1:
            if (namespace, claim.name) in spanning:
                raise DevicesNotModelled(
                    f"ResourceClaim {claim.name} is shared by pods of several gangs and not allocated "
                    "yet: where the first goes, the others must follow, which quorum does not plan"
                )
            if claim.name in counted_already:
                continue  # its devices are asked once, by the gang's first pod that names it
        chosen = [
            r.alternatives[min(alternative, len(r.alternatives) - 1)] if r.alternatives else r
            for r in claim.requests
        ]
        for request in chosen:
            device_class = world.classes.get(request.device_class)
            if device_class is None:
                raise DevicesNotModelled(f"DeviceClass {request.device_class} does not exist", WAITING)
            together: tuple[tuple[str, tuple[str, ...], int], ...] = ()
            if request.match_attribute is not None:
                names = request.match_with or (request.name,)
                together = tuple((r.device_class, r.selectors, r.count) for r in chosen if r.name in names)
            kind = Kind(
                device_class.name,
                request.selectors,
                match_attribute=request.match_attribute,
                group_count=request.count if request.match_attribute else 0,
                together=together,
            )
            asks.append(Ask(kind, request.count, request.all_devices, entry.name, request.name))
    for resource, milli_units in sorted(extended.items()):
        if resource in NATIVE_RESOURCES or resource.startswith("hugepages-") or milli_units <= 0:
            continue
        device_class = world.extended_class(resource)
        if device_class is None:
            continue  # a device plugin's resource, counted in allocatable as ever
        count = -(-milli_units // 1000)
        asks.append(Ask(Kind(device_class.name, extended=resource), count, request=resource))
    return tuple(asks), tuple(pins)


@dataclass(frozen=True, slots=True)
class CountedNode:
    """A node as a pass counted its devices, and what it was counted from."""

    node: Node
    signature: tuple[object, ...]  # the pass's kinds and components
    devices: tuple[Device, ...]  # its free devices
    matches: Mapping[DeviceKey, frozenset[Kind]] | None  # the matcher's, the same object while valid
    counted: Node
    taken: dict[str, int]
    native: frozenset[Kind]


class DeviceMatcher:
    """Which devices each kind matches, kept across passes (selectors are evaluated once per
    kind and device, through `SelectorCache`) while the devices and classes stay the same
    objects (`DeviceWorld` keeps them so until a ResourceSlice or DeviceClass changes)."""

    def __init__(
        self,
        cache: SelectorCache | None = None,
        kind_seconds: float = KIND_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache or SelectorCache()
        self.kind_seconds = kind_seconds  # a kind whose matching takes longer in all is given up
        self.clock = clock  # what the budgets are measured by (tests give one that stands still)
        self.seen: tuple[object, object] | None = None  # (all_devices, classes) the caches are of
        self.per_kind: dict[Kind, dict[str, frozenset[DeviceKey]]] = {}  # kind -> node -> devices
        self.errors: dict[Kind, str] = {}  # a selector that failed on some device, per kind
        # Matching in progress across passes: kind -> (next node, matches so far, seconds spent);
        # kinds given up on, and why; the nodes in the order they are matched.
        self.partial: dict[Kind, tuple[int, dict[str, frozenset[DeviceKey]], float]] = {}
        self.too_costly: dict[Kind, str] = {}
        self.nodes_in_order: list[str] | None = None
        self.last: tuple[frozenset[Kind], dict[str, dict[DeviceKey, frozenset[Kind]]]] | None = None
        # What the last pass made of each pod and node, kept while what it was made from is the
        # same (an incremental pass counts again only what changed): uid -> (pod, what counted
        # it, the pod counted) and name -> (node, what counted it, the node counted, taken).
        self.pods: dict[str, tuple[Pod, tuple[object, ...], Pod]] = {}
        self.nodes: dict[str, CountedNode] = {}
        # Gangs whose claims have `firstAvailable` alternatives: how many there are (this pass),
        # and which one the gang tries (`tried`: one per pass, in order, until one fits).
        self.choices: dict[tuple[str, str], int] = {}
        self.tried: dict[tuple[str, str], int] = {}

    def alternative(self, gang: tuple[str, str]) -> int:
        return self.tried.get(gang, 0)

    def next_alternative(self, gang: tuple[str, str]) -> str:
        """After a pass held the gang for lack of room: the next pass tries its next alternative
        (after the last, the first again). What to tell."""
        count = self.choices.get(gang, 0)
        if count < 2:
            return ""
        now = self.tried.get(gang, 0)
        self.tried[gang] = (now + 1) % count
        return (
            f"its pods' firstAvailable requests tried alternative {now + 1} of {count}; "
            f"the next pass tries alternative {self.tried[gang] + 1}"
        )

    def forget_alternatives(self, keep: Collection[tuple[str, str]]) -> None:
        self.tried = {k: v for k, v in self.tried.items() if k in keep}

    def matches(
        self, world: DeviceWorld, kinds: Sequence[Kind]
    ) -> dict[str, dict[DeviceKey, frozenset[Kind]]]:
        """Per node, per device (every device of its local pools), the kinds it matches."""
        self._keep_if_current(world)
        if self.last is not None and self.last[0] == frozenset(kinds):
            return self.last[1]
        for kind in kinds:
            if kind not in self.per_kind:  # `pending` left it out if the pass had no time for it
                self.per_kind[kind] = self._matching(world, kind)
        out: dict[str, dict[DeviceKey, frozenset[Kind]]] = {}
        for node, devices in world.all_devices.items():
            found: dict[DeviceKey, list[Kind]] = {d.key: [] for d in devices}
            for kind in kinds:
                for key in self.per_kind[kind].get(node, ()):
                    found[key].append(kind)
            out[node] = {key: frozenset(k) for key, k in found.items()}
        self.last = (frozenset(kinds), out)
        return out

    def _keep_if_current(self, world: DeviceWorld) -> None:
        """Forget every match once the devices or classes are other objects (they changed)."""
        if self.seen is None or self.seen[0] is not world.all_devices or self.seen[1] is not world.classes:
            self.seen, self.per_kind, self.errors, self.last = (
                (world.all_devices, world.classes),
                {},
                {},
                None,
            )
            self.partial, self.too_costly, self.nodes_in_order = {}, {}, None

    def pending(self, world: DeviceWorld, kinds: Sequence[Kind], budget_seconds: float) -> set[Kind]:
        """The kinds, in the order given, whose devices are not all matched yet: this pass
        matches new kinds, node by node, while `budget_seconds` last, and the next pass goes on
        where it stopped. A kind whose matching takes more than `KIND_SECONDS` in all (a
        selector that reads every device differently and costs much) is given up: `too_costly`
        says why. So a tenant's selectors cost each pass at most the budget, and the cluster at
        most `KIND_SECONDS` per kind, once per change of the devices."""
        self._keep_if_current(world)
        deadline = self.clock() + budget_seconds
        left: set[Kind] = set()
        first = True  # the first kind not matched yet always gets on (a node at least)
        for kind in kinds:
            if kind in self.per_kind or kind in self.too_costly:
                continue
            if (not first and self.clock() >= deadline) or not self._match_some(world, kind, deadline):
                left.add(kind)
            first = False
        return left

    def _match_some(self, world: DeviceWorld, kind: Kind, deadline: float) -> bool:
        """Match the kind on more nodes until `deadline`; True once it is done (or given up)."""
        device_class = world.classes.get(kind.device_class)
        if device_class is None:
            self.per_kind[kind] = {}
            return True
        if self.nodes_in_order is None:
            self.nodes_in_order = sorted(world.all_devices)
        start, found, spent = self.partial.pop(kind, (0, {}, 0.0))
        expressions = (*device_class.selectors, *kind.selectors)
        began = self.clock()
        i = start
        while i < len(self.nodes_in_order):
            node = self.nodes_in_order[i]
            keys = []
            for device in world.all_devices[node]:
                try:
                    if all(self.cache.matches(e, device.key, device.view) for e in expressions):
                        keys.append(device.key)
                except SelectorError as err:  # the device is not one quorum would plan on
                    self.errors.setdefault(kind, f"{device.driver}/{device.pool}/{device.name}: {err}")
            if keys:
                found[node] = frozenset(keys)
            i += 1
            now = self.clock()
            if spent + now - began > self.kind_seconds:
                self.too_costly[kind] = (
                    f"its selectors took over {self.kind_seconds:g} s to match {i} of "
                    f"{len(self.nodes_in_order)} nodes' devices: quorum does not evaluate them further"
                )
                return True
            if now >= deadline and i < len(self.nodes_in_order):
                self.partial[kind] = (i, found, spent + now - began)
                return False
        self.per_kind[kind] = found
        return True

    def _matching(self, world: DeviceWorld, kind: Kind) -> dict[str, frozenset[DeviceKey]]:
        """The kind's matches on every node, at once (for a kind `pending` did not see)."""
        self._match_some(world, kind, float("inf"))
        return self.per_kind.get(kind, {})


class DeviceCounts:
    """The kinds a pass's pods ask, what each device matches, and the resources that count
    them (see the module's docstring). Built once per pass from the world and the asks."""

    def __init__(self, world: DeviceWorld, asks: Iterable[Ask], matcher: DeviceMatcher) -> None:
        self.world = world
        asks = list(asks)
        kinds = sorted({a.kind for a in asks}, key=lambda k: (k.device_class, k.selectors, k.extended or ""))
        self.kinds = kinds
        self.all_kinds = frozenset(a.kind for a in asks if a.all_devices)
        # Kinds asked both as a count and as all devices: not counted (`not_modelled`).
        self.mixed = self.all_kinds & {a.kind for a in asks if not a.all_devices}
        self.matches = matcher.matches(world, kinds)
        self.components = self._components()
        self.component_of = {k: i for i, comp in enumerate(self.components) for k in comp}
        self.signature = (tuple(kinds), self.all_kinds, tuple(self.components))
        # Each counted set of kinds (those of components not too large), with its resource's name.
        self.sets = [
            (frozenset(subset), self.resource(subset))
            for component in self.components
            if len(component) <= MAX_KINDS_PER_COMPONENT
            for subset in self.subsets(component)
        ]
        # Per node, the kinds of extended resources its device plugin serves (`capacity` notes it).
        self.native: dict[str, frozenset[Kind]] = {}

    def _components(self) -> list[tuple[Kind, ...]]:
        parent = {k: k for k in self.kinds}

        def root(k: Kind) -> Kind:
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        seen: set[frozenset[Kind]] = set()
        for per_device in self.matches.values():
            for matched in per_device.values():
                if len(matched) < 2 or matched in seen:
                    continue
                seen.add(matched)
                ordered = sorted(matched, key=self.kinds.index)
                for other in ordered[1:]:
                    parent[root(other)] = root(ordered[0])
        groups: dict[Kind, list[Kind]] = {}
        for k in self.kinds:
            groups.setdefault(root(k), []).append(k)
        return [tuple(g) for g in groups.values()]

    # -- what cannot be counted -------------------------------------------------------------------

    def not_modelled(self, asks: Sequence[Ask]) -> str | None:
        """Why these asks cannot be counted exactly, or None."""
        for ask in asks:
            component = self.components[self.component_of[ask.kind]]
            if len(component) > MAX_KINDS_PER_COMPONENT:
                return (
                    f"{len(component)} different device requests match the same devices "
                    f"(at most {MAX_KINDS_PER_COMPONENT} are counted together)"
                )
            if ask.all_devices and (len(component) > 1 or ask.kind in self.mixed):
                return f"a request of all {ask.kind.label()} whose devices other requests also ask"
            if ask.kind.match_attribute is not None and (len(component) > 1 or ask.all_devices):
                return f"a request of {ask.kind.label()} whose devices other requests also ask"
            if len(set(members := self.members(ask.kind))) < len(members):
                return f"a matchAttribute constraint over requests alike ({ask.kind.label()})"
        return None

    def group_token(self, kind: Kind) -> str:
        """The resource counting how many requests of the kind's constraint the node can serve
        (one per constraint: named after its first request)."""
        return f"groups of {self.members(kind)[0].label()}"

    def members(self, kind: Kind) -> tuple[Kind, ...]:
        """The kinds of the requests of a kind's `matchAttribute` constraint, in order."""
        if len(kind.together) < 2:
            return (kind,)
        return tuple(replace(kind, device_class=c, selectors=s, group_count=n) for c, s, n in kind.together)

    def groups(self, node: str, kind: Kind, keys: Iterable[DeviceKey]) -> dict[object, list[DeviceKey]]:
        """The devices `keys` of a kind with `match_attribute`, by their value of it (a device
        without it is in no group)."""
        attribute = kind.match_attribute or ""
        devices = {d.key: d for d in self.world.all_devices.get(node, ())}
        out: dict[object, list[DeviceKey]] = {}
        for key in keys:
            device = devices.get(key)
            if device is not None and attribute in device.attributes:
                out.setdefault(device.attributes[attribute], []).append(key)
        return out

    # -- resources --------------------------------------------------------------------------------

    def resource(self, kinds: Iterable[Kind]) -> str:
        ordered = sorted(kinds, key=self.kinds.index)
        if len(ordered) == 1:
            return ordered[0].label()
        digest = hashlib.sha256(repr(ordered).encode()).hexdigest()[:8]
        return f"devices of any of {len(ordered)} requests ({digest})"

    def all_token(self, kind: Kind) -> str:
        return f"all {kind.label()}"

    def subsets(self, component: Sequence[Kind]) -> list[tuple[Kind, ...]]:
        return [s for n in range(1, len(component) + 1) for s in combinations(component, n)]

    def capacity(self, node: str, allocatable: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        """The node's devices as resources, and how much of them is taken (allocated): per set
        of kinds, its devices matching one of them; per kind asked as All, a token, taken if
        any of its matching devices is. An extended resource the node has in allocatable is
        its device plugin's: the sets with that kind do not count there (the others still do)."""
        free = {d.key for d in self.world.devices.get(node, ())}
        matches = self.matches.get(node, {})
        total: dict[str, int] = {}
        taken: dict[str, int] = {}
        native = {k for k in self.kinds if k.extended is not None and allocatable.get(k.extended, 0) > 0}
        self.native[node] = frozenset(native)
        # Devices alike in what they match counted together (a node has few such groups).
        groups = Counter((kinds, key in free) for key, kinds in matches.items() if kinds)
        for wanted, name in self.sets:
            if wanted & native:
                total[name] = 1 << 60  # served by the device plugin there
                continue
            every = held = 0
            for (kinds, is_free), count in groups.items():
                if kinds & wanted:
                    every += count
                    held += 0 if is_free else count
            if every:
                total[name] = every * TOKEN
                if held:
                    taken[name] = held * TOKEN
        constraints = {self.members(k) for k in self.kinds if k.match_attribute is not None}
        for members in constraints:
            # How many claims of the constraint the node's free devices can serve, each from one
            # group (a value of the attribute): per group, as many as its scarcest request
            # allows. Exact, as no other kind shares their devices (`not_modelled`).
            per_value: Counter[object] | None = None
            for kind in members:
                by_value = self.groups(
                    node, kind, [k for k, kinds in matches.items() if kind in kinds and k in free]
                )
                slots = Counter({v: len(keys) // kind.group_count for v, keys in by_value.items()})
                per_value = slots if per_value is None else per_value & slots
            if per_value and (slots_total := sum(per_value.values())):
                total[self.group_token(members[0])] = slots_total * TOKEN
        for kind in self.all_kinds:
            matching = [key for key, kinds in matches.items() if kind in kinds]
            if matching:
                total[self.all_token(kind)] = TOKEN
                if not all(key in free for key in matching):
                    taken[self.all_token(kind)] = TOKEN
        return total, taken

    def freed(self, node: str, devices: Iterable[DeviceKey]) -> dict[str, int]:
        """What taking a pod's allocated devices away would free of the node's `capacity` (a
        preemption's victim): per set of kinds, its devices matching one of them."""
        matches = self.matches.get(node, {})
        held = [matches.get(key, frozenset()) for key in devices]
        out: dict[str, int] = {}
        for wanted, name in self.sets:
            if count := sum(1 for kinds in held if kinds & wanted):
                out[name] = count * TOKEN
        return out

    def demand(self, asks: Sequence[Ask]) -> dict[str, int]:
        """What a pod asks of the resources `capacity` gives."""
        out: dict[str, int] = {}
        for ask in asks:
            if ask.all_devices:
                name = self.all_token(ask.kind)
                out[name] = out.get(name, 0) + TOKEN
                continue
            for wanted, name in self.sets:
                if ask.kind in wanted:
                    out[name] = out.get(name, 0) + ask.count * TOKEN
            if ask.kind.match_attribute is not None and self.members(ask.kind)[0] == ask.kind:
                token = self.group_token(ask.kind)  # once per claim: asked by its first request
                out[token] = out.get(token, 0) + TOKEN
        return out

    # -- the devices themselves -------------------------------------------------------------------

    def assign_placement(
        self,
        placement: Iterable[tuple[Pod, Node]],
        asks: Mapping[str, Sequence[Ask]],
        unavailable: Collection[DeviceKey] = frozenset(),
    ) -> tuple[Assignment, set[str]]:
        """Devices for pods placed on nodes (a pass's releases, all together), node by node, each
        node's pods at once, none twice (a device of a pool serving several nodes is among the
        devices of each: chosen on one), none of `unavailable`; and the nodes whose pods did not
        fit their devices."""
        by_node: dict[str, list[tuple[str, Sequence[Ask]]]] = {}
        for pod, node in placement:
            if asks.get(pod.uid):
                by_node.setdefault(node.name, []).append((pod.uid, asks[pod.uid]))
        out: Assignment = {}
        failed: set[str] = set()
        used = set(unavailable)
        for name, pods in by_node.items():
            found = self.assign(name, pods, used)
            if found is None:
                failed.add(name)
                continue
            out.update(found)
            used.update(k for per in found.values() for keys in per.values() for k in keys)
        return out, failed

    def assign_release(
        self, placement: Sequence[tuple[Pod, Node]], asks: Mapping[str, Sequence[Ask]]
    ) -> Assignment | None:
        """Devices for one release's pods; None if some node's pods do not fit its devices."""
        out, failed = self.assign_placement(placement, asks)
        return None if failed else out

    def assign(
        self,
        node: str,
        pods: Sequence[tuple[str, Sequence[Ask]]],
        unavailable: Collection[DeviceKey] = frozenset(),
    ) -> Assignment | None:
        """Devices for every claim request of `pods` (uid, asks) on `node`, none twice and none
        of `unavailable`: {uid: {(claim, request): devices}}; None if they do not fit. An
        extended resource's devices are chosen too (claim ""): kept for it, kube-scheduler
        allocates them."""
        free = [d.key for d in self.world.devices.get(node, ()) if d.key not in unavailable]
        matches = self.matches.get(node, {})
        units: list[tuple[str, int, Ask]] = []  # one per device wanted
        out: Assignment = {}
        for uid, asks in pods:
            out[uid] = {}
            for i, ask in enumerate(asks):
                if ask.all_devices:
                    every = [key for key, kinds in matches.items() if ask.kind in kinds]
                    if not every or any(key not in free for key in every):
                        return None
                    out[uid][(ask.claim, ask.request)] = tuple(every)
                    free = [key for key in free if key not in every]
                    continue
                if ask.kind not in self.native.get(node, frozenset()):
                    units.extend((uid, i, ask) for _ in range(ask.count))
        # The requests of a matchAttribute constraint: all from one group (a value of the
        # attribute), the one that serves the most such claims after (no other kind shares their
        # devices, and `capacity` counted whole claims per group).
        grouped: dict[tuple[str, str, tuple[Kind, ...]], list[Ask]] = {}
        for uid, _i, ask in dict.fromkeys(u for u in units if u[2].kind.match_attribute is not None):
            grouped.setdefault((uid, ask.claim, self.members(ask.kind)), []).append(ask)
        units = [u for u in units if u[2].kind.match_attribute is None]
        for (uid, _claim, members), asks in grouped.items():
            pending = list(asks)  # one ask per member for each constraint of this shape
            while pending:
                instance = [
                    pending.pop(next(j for j, a in enumerate(pending) if a.kind == k)) for k in members
                ]
                by_kind = {
                    kind: self.groups(node, kind, [k for k in free if kind in matches.get(k, frozenset())])
                    for kind in members
                }
                values = [
                    v
                    for v in by_kind[members[0]]
                    if all(len(by_kind[k].get(v, ())) >= k.group_count for k in members)
                ]
                if not values:
                    return None
                best = max(
                    values, key=lambda v: (min(len(by_kind[k][v]) // k.group_count for k in members), str(v))
                )
                for ask in instance:
                    out[uid][(ask.claim, ask.request)] = tuple(sorted(by_kind[ask.kind][best])[: ask.count])
                    free = [k for k in free if k not in out[uid][(ask.claim, ask.request)]]
        owner: dict[DeviceKey, int] = {}  # device -> index of the unit it serves

        def augment(u: int, seen: set[DeviceKey]) -> bool:
            kind = units[u][2].kind
            for key in free:
                if key in seen or kind not in matches.get(key, frozenset()):
                    continue
                seen.add(key)
                if key not in owner or augment(owner[key], seen):
                    owner[key] = u
                    return True
            return False

        for u in range(len(units)):
            if not augment(u, set()):
                return None
        chosen: dict[tuple[str, int], list[DeviceKey]] = {}
        for key, u in sorted(owner.items()):
            uid, i, _ask = units[u]
            chosen.setdefault((uid, i), []).append(key)
        for (uid, i), keys in chosen.items():
            ask = dict(pods)[uid][i]
            # An extended resource's devices (claim "") are kept for it, not allocated: kube-
            # scheduler makes and allocates its claim, from the devices this leaves it.
            out[uid][(ask.claim, ask.request)] = tuple(keys)
        return out


@dataclass(frozen=True, slots=True)
class Counted:
    """A pass's nodes and gangs with devices counted as resources (`count_devices`)."""

    nodes: Mapping[str, Node]
    taken: dict[str, dict[str, int]]  # per node, the devices allocated, as counted in `nodes`
    queue: list[Gang]
    held: dict[tuple[str, str], tuple[str, str]]  # gangs whose devices cannot be counted: reason, why
    asks: dict[str, tuple[Ask, ...]]  # pod uid -> what it asks of devices
    counts: DeviceCounts | None  # None: no pod asks for devices


def count_devices(
    nodes: Mapping[str, Node],
    queue: Sequence[Gang],
    world: DeviceWorld,
    matcher: DeviceMatcher,
    matching_seconds: float = MATCHING_SECONDS,
) -> Counted:
    """The planner's nodes and gangs with devices as resources: each node's free devices added to
    its allocatable, each pod's asks to its requests (a pod whose allocated shared claim is on
    some nodes is pinned to them). A gang some pod of which asks what cannot be counted is left
    out, with why."""
    if not world.classes and not any(pod.claims for gang in queue for pod in gang.pods):
        return Counted(nodes, {}, list(queue), {}, {}, None)  # no DRA here: nothing to count
    sharers: dict[tuple[str, str], int] = {}
    gangs_of: dict[tuple[str, str], set[tuple[str, str]]] = {}  # claim -> the gangs naming it
    for gang in queue:
        for pod in gang.pods:
            for entry in pod.claims:
                # A claim named, or made for a PodGroup and named through a template by its pods.
                if (name := entry.claim or entry.made) is not None:
                    sharers[(gang.namespace, name)] = sharers.get((gang.namespace, name), 0) + 1
                    gangs_of.setdefault((gang.namespace, name), set()).add(gang.key)
    spanning = {claim for claim, gangs in gangs_of.items() if len(gangs) > 1}
    one_node: set[tuple[str, str]] = set()  # gangs whose pods share a claim not allocated yet
    held: dict[tuple[str, str], tuple[str, str]] = {}
    asks: dict[str, tuple[Ask, ...]] = {}
    pins: dict[str, tuple[NodeTerms, ...]] = {}
    choices: dict[tuple[str, str], int] = {}  # gangs with firstAvailable requests: how many choices
    for gang in queue:
        try:
            counted_already: set[str] = set()
            for pod in gang.pods:
                asks[pod.uid], pins[pod.uid] = asks_of(
                    pod.claims,
                    pod.requests,
                    gang.namespace,
                    world,
                    sharers,
                    matcher.alternative(gang.key),
                    frozenset(counted_already),
                    spanning,
                )
                for entry in pod.claims:
                    name = entry.claim or entry.made or ""
                    shared = world.claims.get((gang.namespace, name))
                    if shared is not None and shared.shared and not shared.allocated:
                        if sharers.get((gang.namespace, name), 0) > 1:
                            one_node.add(gang.key)
                        counted_already.add(name)
                if most := alternatives_of(pod, gang.namespace, world):
                    choices[gang.key] = max(choices.get(gang.key, 0), most)
        except DevicesNotModelled as err:
            held[gang.key] = (err.reason, str(err))
    matcher.choices = choices
    if not any(asks.values()) and not any(pins.values()):
        return Counted(nodes, {}, [g for g in queue if g.key not in held], held, asks, None)
    in_order = list(
        dict.fromkeys(a.kind for g in queue if g.key not in held for p in g.pods for a in asks[p.uid])
    )
    for kind in matcher.pending(world, in_order, matching_seconds):
        for gang in queue:
            if gang.key not in held and any(a.kind == kind for p in gang.pods for a in asks[p.uid]):
                waits = f"its {kind.label()} are still being matched against the cluster's devices"
                held[gang.key] = (WAITING, f"{waits} (many different device requests arrived at once)")
    for kind, costly in matcher.too_costly.items():
        for gang in queue:
            if gang.key not in held and any(a.kind == kind for p in gang.pods for a in asks[p.uid]):
                held[gang.key] = ("DevicesNotModelled", f"{kind.label()}: {costly}")
    counts = DeviceCounts(
        world, (a for g in queue if g.key not in held for p in g.pods for a in asks[p.uid]), matcher
    )
    # Kinds that match the same devices are counted together, at most MAX_KINDS_PER_COMPONENT of
    # them: the first in queue order; the gangs asking the others wait their turn.
    rank = {kind: i for i, kind in enumerate(in_order)}
    later = {
        kind
        for component in counts.components
        if len(component) > MAX_KINDS_PER_COMPONENT
        for kind in sorted(component, key=lambda k: rank.get(k, len(rank)))[MAX_KINDS_PER_COMPONENT:]
    }
    if later:
        for gang in queue:
            if gang.key not in held and any(a.kind in later for p in gang.pods for a in asks[p.uid]):
                held[gang.key] = (
                    WAITING,
                    f"more than {MAX_KINDS_PER_COMPONENT} different device requests ask for the same "
                    "devices; they are counted together in queue order, this gang's in a later pass",
                )
        counts = DeviceCounts(
            world, (a for g in queue if g.key not in held for p in g.pods for a in asks[p.uid]), matcher
        )
    out: list[Gang] = []
    for gang in queue:
        if gang.key in held:
            continue
        why = next((w for p in gang.pods if (w := counts.not_modelled(asks[p.uid])) is not None), None)
        if why is not None:
            held[gang.key] = ("DevicesNotModelled", why)
            continue
        pods = []
        for pod in gang.pods:
            basis = (counts.signature, asks[pod.uid], pins[pod.uid])
            before = matcher.pods.get(pod.uid)
            if before is not None and before[0] is pod and before[1] == basis:
                pods.append(before[2])
                continue
            counted_pod = _with_devices(pod, counts.demand(asks[pod.uid]), pins[pod.uid])
            matcher.pods[pod.uid] = (pod, basis, counted_pod)
            pods.append(counted_pod)
        if gang.key in one_node:  # its pods share a claim's devices: all on the node they are on
            out.append(replace(gang, pods=tuple(pods), topology_key=HOSTNAME))
        else:
            out.append(gang if tuple(pods) == gang.pods else replace(gang, pods=tuple(pods)))
    matcher.pods = {uid: v for uid, v in matcher.pods.items() if uid in asks}
    extended = [k for k in counts.kinds if k.extended is not None]
    counted: dict[str, Node] = {}
    taken: dict[str, dict[str, int]] = {}
    for name, node in nodes.items():
        devices, matches = world.devices.get(name, ()), counts.matches.get(name)
        kept = matcher.nodes.get(name)
        if (
            kept is not None
            and kept.node is node
            and kept.matches is matches
            and kept.signature == counts.signature
            and kept.devices == devices
        ):
            counted[name] = kept.counted
            counts.native[name] = kept.native
            if kept.taken:
                taken[name] = kept.taken
            continue
        room, held_there = counts.capacity(name, node.allocatable)
        if held_there:
            taken[name] = held_there
        for kind in extended:
            assert kind.extended is not None
            if node.allocatable.get(kind.extended, 0) <= 0:
                every = counts.matches.get(name, {})
                room[kind.extended] = sum(1 for kinds in every.values() if kind in kinds) * TOKEN
        counted[name] = replace(node, allocatable={**node.allocatable, **room}) if room else node
        matcher.nodes[name] = CountedNode(
            node, counts.signature, devices, matches, counted[name], held_there, counts.native[name]
        )
    if len(matcher.nodes) > len(nodes):
        matcher.nodes = {n: c for n, c in matcher.nodes.items() if n in nodes}
    return Counted(counted, taken, out, held, asks, counts)


def alternatives_of(pod: Pod, namespace: str, world: DeviceWorld) -> int:
    """How many alternatives the pod's `firstAvailable` requests offer at most (0: none)."""
    most = 0
    for entry in pod.claims:
        claim = world.claims.get((namespace, entry.claim or entry.made or ""))
        if claim is not None and not claim.allocated:
            most = max([most, *(len(r.alternatives) for r in claim.requests)])
    return most


def _with_devices(pod: Pod, demand: Mapping[str, int], pins: Sequence[NodeTerms]) -> Pod:
    if not demand and not any(pins):
        return pod
    affinity = pod.affinity
    for terms in pins:  # each allocated claim: one of its terms, and one of the pod's own
        if not terms:
            continue  # an allocation without a node selector: its devices are reachable anywhere
        required = tuple(tuple(Requirement(k, op, vals, fld) for k, op, vals, fld in term) for term in terms)
        affinity = tuple(a + r for a in affinity for r in required) if affinity else required
    return replace(pod, requests={**pod.requests, **demand}, affinity=affinity)
