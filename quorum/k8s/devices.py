"""DRA objects (resource.k8s.io/v1, plain dicts as the watch delivers them) to the models of
`quorum.core.devices`, and the index the operator's watches keep of them.

ResourceSlices give devices: only the newest generation of a pool counts, and a pool whose
slices are not all seen yet (incomplete) is left out, as kube-scheduler's allocator does. A
device of a slice local to one node (`spec.nodeName`) is that node's; one of a slice serving
several nodes (`nodeSelector`, `allNodes`, per device with `perDeviceNodeSelection`) is among
the devices of every node it serves, one device all the same (docs/dra.md).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from quorum.core.device_cel import Version
from quorum.core.devices import (
    AttributeValue,
    Claim,
    Device,
    DeviceClass,
    DeviceKey,
    DeviceRequest,
    DeviceWorld,
    NodeTerms,
    reaches,
)
from quorum.core.model import Node
from quorum.k8s.convert import newer_or_same

JSON = dict[str, Any]
ASSUMED_SECONDS = 60.0  # a device quorum allocated counts as taken at least this long, or until seen


def _attribute(value: Any) -> AttributeValue | None:
    if not isinstance(value, dict):
        return None
    for kind in ("bool", "int", "string"):
        if kind in value:
            found = value[kind]
            return found if isinstance(found, bool | int | str) else None
    if isinstance(value.get("version"), str):
        return Version(value["version"])
    return None


def _qualified(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def device_from_api(driver: str, pool: str, obj: JSON) -> Device:
    attributes = {}
    for name, value in (obj.get("attributes") or {}).items():
        parsed = _attribute(value)
        if parsed is not None:
            attributes[_qualified(name, driver)] = parsed
    capacity = {
        _qualified(name, driver): str((value or {}).get("value", "0"))
        for name, value in (obj.get("capacity") or {}).items()
    }
    return Device(driver, pool, str(obj["name"]), attributes, capacity)


def plannable(device: JSON) -> bool:
    """Whether quorum may choose the device: not one with a taint that keeps pods off (device
    tolerations are not modelled), nor one whose allocation waits on binding conditions."""
    if any((t or {}).get("effect") in ("NoSchedule", "NoExecute") for t in device.get("taints") or []):
        return False
    return not device.get("bindingConditions")


def device_class_from_api(obj: JSON) -> DeviceClass:
    spec = obj.get("spec") or {}
    selectors = tuple(
        str(s["cel"]["expression"])
        for s in spec.get("selectors") or []
        if (s.get("cel") or {}).get("expression")
    )
    return DeviceClass(obj["metadata"]["name"], selectors, spec.get("extendedResourceName") or None)


def _selectors(request: JSON) -> tuple[str, ...]:
    return tuple(
        str(s["cel"]["expression"])
        for s in request.get("selectors") or []
        if (s.get("cel") or {}).get("expression")
    )


def _node_terms(selector: JSON | None) -> NodeTerms:
    terms = []
    for term in (selector or {}).get("nodeSelectorTerms") or []:
        reqs = tuple(
            (e["key"], e["operator"], tuple(e.get("values") or ()), False)
            for e in term.get("matchExpressions") or []
        )
        fields = tuple(
            (f["key"], f["operator"], tuple(f.get("values") or ()), True)
            for f in term.get("matchFields") or []
        )
        terms.append(reqs + fields)
    return tuple(terms)


def claim_spec(namespace: str, name: str, spec: JSON) -> Claim:
    """A claim's requests as modelled, and what of its spec is not (said on the Gang)."""
    devices = spec.get("devices") or {}
    requests: list[DeviceRequest] = []
    unmodeled: list[str] = []
    for request in devices.get("requests") or []:
        label = str(request.get("name", "?"))
        exactly = request.get("exactly")
        if exactly is not None:
            requests.append(_request(label, exactly, unmodeled))
        elif request.get("firstAvailable"):
            alternatives = tuple(
                _request(f"{label}/{sub.get('name', '?')}", sub, unmodeled)
                for sub in request["firstAvailable"]
            )
            requests.append(replace(alternatives[0], name=label, alternatives=alternatives))
        else:
            unmodeled.append(f"request {label}: no device class")
    for constraint in devices.get("constraints") or []:
        attribute = constraint.get("matchAttribute")
        if not attribute:
            unmodeled.append("a distinctAttribute constraint is not modelled yet")
            continue
        named = constraint.get("requests") or [r.name for r in requests]
        if len(named) > 1:
            _match_together(requests, [str(n) for n in named], str(attribute), unmodeled)
            continue
        if not named:
            continue
        for i, request in enumerate(requests):  # the request, or each of its alternatives
            if request.name == named[0].partition("/")[0]:
                alternatives = tuple(
                    replace(a, match_attribute=str(attribute)) if named[0] in (request.name, a.name) else a
                    for a in request.alternatives
                )
                requests[i] = replace(request, match_attribute=str(attribute), alternatives=alternatives)
    return Claim(namespace, name, tuple(requests), tuple(unmodeled))


def _match_together(
    requests: list[DeviceRequest], named: list[str], attribute: str, unmodeled: list[str]
) -> None:
    """A matchAttribute constraint over several requests: each of them gets it, naming the
    others; what quorum does not model of it goes to `unmodeled`."""
    found = {r.name: i for i, r in enumerate(requests) if r.name in named}
    why = ""
    if len(found) < len(named):
        why = "names a request that is not one of the claim's (or a firstAvailable alternative)"
    elif any(requests[i].alternatives or requests[i].all_devices for i in found.values()):
        why = "names a request with firstAvailable alternatives or of all devices"
    elif any(requests[i].match_attribute is not None for i in found.values()):
        why = "names a request another matchAttribute constraint names too"
    if why:
        unmodeled.append(f"a matchAttribute constraint over {len(named)} requests {why}: not modelled yet")
        return
    for i in found.values():
        requests[i] = replace(requests[i], match_attribute=attribute, match_with=tuple(named))


def _request(label: str, exactly: JSON, unmodeled: list[str]) -> DeviceRequest:
    """A request's `exactly` (or one `firstAvailable` alternative) as modelled; what of it is
    not goes to `unmodeled`."""
    if exactly.get("adminAccess"):
        unmodeled.append(f"request {label}: adminAccess is not modelled")
    if exactly.get("capacity"):
        unmodeled.append(f"request {label}: requests of consumable capacity are not modelled")
    if exactly.get("tolerations"):
        unmodeled.append(f"request {label}: device taint tolerations are not modelled")
    mode = exactly.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        unmodeled.append(f"request {label}: allocationMode {mode}")
    return DeviceRequest(
        name=label,
        device_class=str(exactly.get("deviceClassName", "")),
        selectors=_selectors(exactly),
        count=int(exactly.get("count") or 1),
        all_devices=mode == "All",
    )


def claim_from_api(obj: JSON) -> Claim:
    meta = obj["metadata"]
    claim = claim_spec(meta.get("namespace", ""), meta["name"], obj.get("spec") or {})
    allocation = (obj.get("status") or {}).get("allocation")
    owner = next(
        (
            str(r.get("uid", ""))
            for r in meta.get("ownerReferences") or []
            if r.get("kind") == "Pod" and r.get("controller")
        ),
        None,
    )
    return Claim(
        claim.namespace,
        claim.name,
        claim.requests,
        claim.unmodeled,
        allocated=allocation is not None,
        allocated_nodes=_node_terms((allocation or {}).get("nodeSelector")),
        shared=owner is None,
        owner_pod=owner,
    )


def allocated_node(obj: JSON) -> str | None:
    """The one node an allocated claim's node selector names (`metadata.name In [node]`, as
    kube-scheduler and quorum write it); None for any other selector, or none."""
    allocation = (obj.get("status") or {}).get("allocation") or {}
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    if len(terms) != 1:
        return None
    fields = terms[0].get("matchFields") or []
    if len(fields) == 1 and fields[0].get("key") == "metadata.name" and fields[0].get("operator") == "In":
        values = fields[0].get("values") or []
        return str(values[0]) if len(values) == 1 else None
    return None


def allocated_devices(obj: JSON) -> tuple[DeviceKey, ...]:
    """The devices an allocated claim holds (admin access holds none)."""
    allocation = (obj.get("status") or {}).get("allocation") or {}
    return tuple(
        (str(r["driver"]), str(r["pool"]), str(r["device"]))
        for r in (allocation.get("devices") or {}).get("results") or []
        if not r.get("adminAccess")
    )


@dataclass(frozen=True, slots=True)
class Reach:
    """The nodes a device of a pool that serves several nodes can be used from: those matching
    `terms` (a slice's or device's `nodeSelector`), one node (a device's `nodeName`), or all."""

    terms: NodeTerms = ()
    node: str | None = None
    all_nodes: bool = False

    def serves(self, node: Node) -> bool:
        if self.all_nodes:
            return True
        if self.node is not None:
            return node.name == self.node
        return reaches(self.terms, node)


@dataclass(frozen=True, slots=True)
class Slice:
    node: str | None  # the node of a slice local to one (`spec.nodeName`)
    driver: str
    pool: str
    generation: int
    slice_count: int
    devices: tuple[Device, ...]
    # A slice that serves several nodes (`nodeSelector`, `allNodes`, or per device with
    # `perDeviceNodeSelection`): its devices, by the nodes they serve.
    reaching: tuple[tuple[Reach, tuple[Device, ...]], ...] = ()


def _reach(obj: JSON) -> Reach | None:
    if obj.get("allNodes"):
        return Reach(all_nodes=True)
    if obj.get("nodeSelector"):
        return Reach(terms=_node_terms(obj["nodeSelector"]))
    if obj.get("nodeName"):
        return Reach(node=str(obj["nodeName"]))
    return None


def slice_from_api(obj: JSON) -> Slice:
    spec = obj.get("spec") or {}
    driver, pool = str(spec["driver"]), spec.get("pool") or {}
    name = str(pool.get("name", ""))
    kept = [d for d in spec.get("devices") or [] if plannable(d)]
    devices = tuple(device_from_api(driver, name, d) for d in kept)
    reaching: dict[Reach, list[Device]] = {}
    if spec.get("perDeviceNodeSelection"):
        for raw, device in zip(kept, devices, strict=True):
            if (reach := _reach(raw)) is not None:  # the apiserver requires one per device
                reaching.setdefault(reach, []).append(device)
    elif not spec.get("nodeName") and (reach := _reach(spec)) is not None:
        reaching[reach] = list(devices)
    return Slice(
        spec.get("nodeName") or None,
        driver,
        name,
        int(pool.get("generation") or 0),
        int(pool.get("resourceSliceCount") or 1),
        devices,
        tuple((reach, tuple(found)) for reach, found in reaching.items()),
    )


class _Objects:
    """One kind of object, converted once per resourceVersion; an object that cannot be read is
    left out (and logged by the watch), never taken for something it is not."""

    def __init__(self, convert: Any, keep: bool = True) -> None:
        self.convert = convert
        self.keep = keep  # False: the object itself is not kept, only its model (ResourceSlices)
        self.items: dict[str, tuple[str, Any, JSON]] = {}  # uid -> (version, model, object)
        self.names: dict[tuple[str, str], str] = {}  # (namespace, name) -> uid
        self.progress = ""  # the newest resourceVersion delivered
        self.version = 0  # bumped on every change: the world is assembled again only then

    def upsert(self, obj: JSON) -> None:
        meta = obj["metadata"]
        version = meta.get("resourceVersion", "")
        held = self.items.get(meta["uid"])
        if held is not None and held[0] == version:
            return
        self.advance(version)
        self.items[meta["uid"]] = (version, self.convert(obj), obj if self.keep else {"metadata": meta})
        self.names[(meta.get("namespace", ""), meta["name"])] = meta["uid"]
        self.version += 1

    def delete(self, obj: JSON) -> None:
        meta = obj["metadata"]
        self.advance(meta.get("resourceVersion", ""))
        if self.items.pop(meta["uid"], None) is not None:
            self.version += 1
        if self.names.get((meta.get("namespace", ""), meta["name"])) == meta["uid"]:
            del self.names[(meta.get("namespace", ""), meta["name"])]

    def advance(self, version: str) -> None:
        if newer_or_same(version, self.progress) is not False:
            self.progress = version

    def object(self, uid: str) -> JSON | None:
        held = self.items.get(uid)
        return held[2] if held is not None else None

    def get(self, namespace: str, name: str) -> JSON | None:
        """The object as the watch delivered it last."""
        held = self.items.get(self.names.get((namespace, name), ""))
        return held[2] if held is not None else None

    def replace_all(self, objs: list[JSON]) -> None:
        self.items = {}
        self.names = {}
        self.version += 1
        for obj in objs:
            self.upsert(obj)


class _Claims(_Objects):
    """The claims, with the devices allocated to them counted as they change (a pass does not
    walk every claim of the cluster)."""

    def __init__(self) -> None:
        super().__init__(claim_from_api)
        self.taken: Counter[DeviceKey] = Counter()
        self.models: dict[tuple[str, str], Claim] = {}
        # Devices more than one allocated claim holds: two allocators (quorum and kube-
        # scheduler, for a pod that is not a gang's) took the same one (docs/dra.md).
        self.twice: set[DeviceKey] = set()

    def upsert(self, obj: JSON) -> None:
        held = self.items.get(obj["metadata"]["uid"])
        if held is not None and held[0] == obj["metadata"].get("resourceVersion", ""):
            return
        if held is not None:
            self._forget(held[2])
        super().upsert(obj)
        model: Claim = self.items[obj["metadata"]["uid"]][1]
        self.models[(model.namespace, model.name)] = model
        devices = allocated_devices(obj)
        self.taken.update(devices)
        self.twice.update(key for key in devices if self.taken[key] > 1)

    def delete(self, obj: JSON) -> None:
        held = self.items.get(obj["metadata"]["uid"])
        if held is not None:
            self._forget(held[2])
        super().delete(obj)

    def _forget(self, obj: JSON) -> None:
        for key in allocated_devices(obj):
            self.taken[key] -= 1
            if self.taken[key] <= 1:
                self.twice.discard(key)
            if self.taken[key] <= 0:
                del self.taken[key]
        meta = obj["metadata"]
        self.models.pop((meta.get("namespace", ""), meta["name"]), None)

    def replace_all(self, objs: list[JSON]) -> None:
        self.taken, self.models, self.twice = Counter(), {}, set()
        super().replace_all(objs)

    def holding(self, key: DeviceKey) -> list[JSON]:
        """The allocated claims that hold a device (a scan: for the rare device held twice)."""
        return [obj for _, _, obj in self.items.values() if key in allocated_devices(obj)]


class DeviceObjects:
    """The DRA objects the operator watches, and the `DeviceWorld` a pass plans on."""

    def __init__(self) -> None:
        self.slices = _Objects(slice_from_api, keep=False)  # 40,000 devices' JSON is 60 MiB
        self.classes = _Objects(device_class_from_api)
        self.claims = _Claims()
        self._world: tuple[tuple[int, ...], frozenset[DeviceKey], DeviceWorld] | None = None
        # The devices and classes, the same objects until a slice, a class or the nodes a pool
        # serving several nodes reaches change (what the planner's selector results are kept
        # for: `DeviceMatcher`): per node, its devices; the pools serving several nodes.
        self._pools: tuple[int, PoolDevices] | None = None
        self._devices: tuple[int, Mapping[str, tuple[int, ...]], Mapping[str, tuple[Device, ...]]] | None = (
            None
        )
        self._devices_version = 0
        self._classes: tuple[int, Mapping[str, DeviceClass]] | None = None
        # Devices quorum allocated, until the claim watch shows them taken (or ASSUMED_SECONDS
        # pass): a watch that lags must not make them look free (monotonic deadline per device).
        self.assumed: dict[DeviceKey, float] = {}

    def assume(self, keys: Iterable[DeviceKey]) -> None:
        deadline = time.monotonic() + ASSUMED_SECONDS
        for key in keys:
            self.assumed[key] = deadline

    def held_by_pods(self) -> dict[str, tuple[DeviceKey, ...]]:
        """Pod uid -> the devices of the claims allocated for it alone (a shared claim's devices
        free only when all its pods go: counted for none)."""
        out: dict[str, tuple[DeviceKey, ...]] = {}
        for _, _, obj in self.claims.items.values():
            users = [r.get("uid") for r in (obj.get("status") or {}).get("reservedFor") or []]
            if len(users) == 1 and isinstance(users[0], str):
                out[users[0]] = out.get(users[0], ()) + allocated_devices(obj)
        return out

    def world(self, nodes: Mapping[str, Node], assumed: Iterable[DeviceKey] = ()) -> DeviceWorld:
        """The world of this moment on these nodes, with the devices of allocations quorum
        wrote but the watch has not shown yet (`assumed`) taken too. Assembled again only after
        a change."""
        if self.assumed:
            now = time.monotonic()
            self.assumed = {k: d for k, d in self.assumed.items() if d > now and k not in self.claims.taken}
        assumed = frozenset(assumed) | frozenset(self.assumed)
        if self._pools is None or self._pools[0] != self.slices.version:
            self._pools = (self.slices.version, pool_devices([m for _, m, _ in self.slices.items.values()]))
        pools = self._pools[1]
        # Which nodes each device of a pool serving several nodes reaches: looked at every pass
        # (node labels change), the devices' mapping kept while it is the same.
        reached = (
            {
                name: tuple(i for i, (reach, _) in enumerate(pools.reaching) if reach.serves(node))
                for name, node in nodes.items()
            }
            if pools.reaching
            else {}
        )
        if self._devices is None or self._devices[:2] != (self.slices.version, reached):
            by_node = dict(pools.local)
            for name, indices in reached.items():
                if indices:
                    by_node[name] = by_node.get(name, ()) + tuple(
                        d for i in indices for d in pools.reaching[i][1]
                    )
            self._devices = (self.slices.version, reached, by_node)
            self._devices_version += 1
        if self._classes is None or self._classes[0] != self.classes.version:
            self._classes = (self.classes.version, {m.name: m for _, m, _ in self.classes.items.values()})
        versions = (self._devices_version, self.classes.version, self.claims.version)
        if self._world is not None and self._world[:2] == (versions, assumed):
            return self._world[2]
        every = self._devices[2]
        taken = self.claims.taken
        world = DeviceWorld(
            devices={
                node: tuple(d for d in devices if d.key not in taken and d.key not in assumed)
                for node, devices in every.items()
            },
            all_devices=every,
            classes=self._classes[1],
            claims=dict(self.claims.models),
            shared_pools=pools.shared,
        )
        self._world = (versions, assumed, world)
        return world


@dataclass(frozen=True, slots=True)
class PoolDevices:
    """The devices of the complete pools (newest generation): those local to one node, per
    node; those of slices serving several nodes, by the nodes they serve; and the names of
    those pools (driver/pool)."""

    local: Mapping[str, tuple[Device, ...]]
    reaching: tuple[tuple[Reach, tuple[Device, ...]], ...]
    shared: frozenset[str]


def pool_devices(slices: Iterable[Slice]) -> PoolDevices:
    newest: dict[tuple[str, str], int] = {}
    slices = list(slices)
    for s in slices:
        newest[(s.driver, s.pool)] = max(newest.get((s.driver, s.pool), 0), s.generation)
    seen: dict[tuple[str, str], list[Slice]] = {}
    for s in slices:
        if s.generation == newest[(s.driver, s.pool)]:
            seen.setdefault((s.driver, s.pool), []).append(s)
    local: dict[str, list[Device]] = {}
    reaching: list[tuple[Reach, tuple[Device, ...]]] = []
    shared: set[str] = set()
    for (driver, pool), pool_slices in sorted(seen.items()):
        if len(pool_slices) < max(s.slice_count for s in pool_slices):
            continue  # incomplete: not all of its slices are seen yet
        for s in pool_slices:
            if s.node is not None:
                local.setdefault(s.node, []).extend(s.devices)
            for reach, devices in s.reaching:
                if reach.node is not None:  # a device of a node, named per device
                    local.setdefault(reach.node, []).extend(devices)
                else:
                    reaching.append((reach, devices))
                    shared.add(f"{driver}/{pool}")
    return PoolDevices(
        {node: tuple(devices) for node, devices in local.items()}, tuple(reaching), frozenset(shared)
    )


DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"


def allocation_status(
    claim: JSON,
    classes: Mapping[str, JSON],
    chosen: Mapping[str, Iterable[DeviceKey]],
    node: str,
    pod: JSON,
    now: str,
) -> JSON:
    """The `status` that allocates `claim` to the devices `chosen` per request, on `node`, for
    `pod`, as kube-scheduler's allocator writes it: results in the claim's order of requests,
    the classes' and the claim's configuration, the node, the time (without it kube-scheduler
    writes one itself, which the apiserver refuses on an allocation once set), and its
    consumer (`consumer`)."""
    # Each request as allocated: its own name and class, or those of the alternative chosen.
    allocated: list[tuple[str, str]] = []
    for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if "exactly" in r:
            allocated.append((r["name"], (r.get("exactly") or {}).get("deviceClassName", "")))
            continue
        for sub in r.get("firstAvailable") or []:
            if (name := f"{r['name']}/{sub.get('name')}") in chosen:
                allocated.append((name, sub.get("deviceClassName", "")))
                break
    results = [
        {"request": name, "driver": driver, "pool": pool, "device": device}
        for name, _ in allocated
        for driver, pool, device in chosen.get(name, ())
    ]
    config: list[JSON] = []
    by_class: dict[str, list[JSON]] = {}
    for name, class_name in allocated:
        if class_name in by_class:
            for entry in by_class[class_name]:
                entry["requests"].append(name)
            continue
        entries = [
            {"source": "FromClass", "requests": [name], **{k: v for k, v in c.items() if k != "requests"}}
            for c in ((classes.get(class_name) or {}).get("spec") or {}).get("config") or []
        ]
        by_class[class_name] = entries
        config.extend(entries)
    # A claim's config names a request, or one alternative of it ("<request>/<alternative>").
    names = {name for name, _ in allocated} | {name.partition("/")[0] for name, _ in allocated}
    for c in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
        wanted = c.get("requests") or []
        if not wanted or names & set(wanted):
            config.append({"source": "FromClaim", **c, "requests": list(wanted)})
    devices: JSON = {"results": results}
    if config:
        devices["config"] = config
    return {
        "allocation": {
            "devices": devices,
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
            "allocationTimestamp": now,
        },
        "reservedFor": [consumer(claim, pod)],
    }


def consumer(claim: JSON, pod: JSON) -> JSON:
    """Whom an allocated claim is reserved for: the Workload PodGroup a claim was made for
    (`PodGroup.spec.resourceClaims`, DRAWorkloadResourceClaims), as kube-scheduler reserves
    it; otherwise the pod."""
    for owner in claim["metadata"].get("ownerReferences") or []:
        group = str(owner.get("apiVersion", "")).partition("/")[0]
        if owner.get("controller") and owner.get("kind") == "PodGroup" and group == "scheduling.k8s.io":
            return {"apiGroup": group, "resource": "podgroups", "name": owner["name"], "uid": owner["uid"]}
    meta = pod["metadata"]
    return {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
