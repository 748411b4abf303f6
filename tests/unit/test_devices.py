"""DRA devices counted for the planner (`quorum.core.devices`): plain data, examples and a
property against brute force."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.core.devices import (
    Ask,
    Claim,
    Device,
    DeviceClass,
    DeviceCounts,
    DeviceMatcher,
    DeviceRequest,
    DeviceWorld,
    Kind,
    count_devices,
    is_device_resource,
)
from quorum.core.model import Gang, Node, Pod, PodClaim, fits, resources, subtract
from quorum.core.planner import Plan, plan_gangs

DRIVER = "gpu.example.com"
EXTENDED = "example.com/gpu"


def gpu(
    node: str, i: int, model: str = "H100", flags: Mapping[str, bool] | None = None, **more: bool
) -> Device:
    attributes = {**(flags or {}), **more}
    return Device(
        DRIVER,
        node,
        f"gpu-{i}",
        {f"{DRIVER}/model": model, **{f"{DRIVER}/{k}": v for k, v in attributes.items()}},
    )


def node(name: str, extra: Mapping[str, str] | None = None) -> Node:
    alloc = {"cpu": "128", "memory": "1Ti", "pods": "110", **(extra or {})}
    labels = {"kubernetes.io/hostname": name}
    return Node(name=name, labels=labels, allocatable=resources(alloc))


def world(
    devices: Mapping[str, Sequence[Device]], claims: Sequence[Claim] = (), **classes: DeviceClass
) -> DeviceWorld:
    every = {n: tuple(d) for n, d in devices.items()}
    gpu_class = DeviceClass("gpu", (f'device.driver == "{DRIVER}"',), EXTENDED)
    return DeviceWorld(
        devices=every,
        all_devices=every,
        classes={"gpu": gpu_class, **{c.name: c for c in classes.values()}},
        claims={(c.namespace, c.name): c for c in claims},
    )


def claim(name: str, *requests: DeviceRequest, **kw: object) -> Claim:
    return Claim("ns", name, requests, **kw)  # type: ignore[arg-type]


def pod(uid: str, *claims: PodClaim, gpus: int = 0) -> Pod:
    req = {"cpu": "1", "pods": "1", **({EXTENDED: str(gpus)} if gpus else {})}
    return Pod(uid=uid, name=uid, requests=resources(req), claims=claims)


def made(name: str) -> PodClaim:
    """A pod's claim from a template, made already (under the same name)."""
    return PodClaim("gpus", template="t", made=name)


def gang(name: str, *pods: Pod) -> Gang:
    return Gang("ns", name, len(pods), tuple(pods), members=len(pods))


def still_matcher() -> DeviceMatcher:
    """A matcher whose clock stands still: its time budgets never run out, however slow the
    machine (the tests of the budgets say how much time passes)."""
    return DeviceMatcher(clock=lambda: 0.0)


def plan(
    nodes: Sequence[Node], queue: Sequence[Gang], devices: DeviceWorld
) -> tuple[Plan, dict[tuple[str, str], tuple[str, str]]]:
    counted = count_devices({n.name: n for n in nodes}, queue, devices, still_matcher())
    result = plan_gangs(list(counted.nodes.values()), counted.taken, counted.queue)
    for release in result.releases:
        assert counted.counts is not None
        assert counted.counts.assign_release(release.placement, counted.asks) is not None, (
            "counted, then chosen"
        )
    return result, counted.held


def test_claims_from_templates_fit_only_nodes_with_devices() -> None:
    devices = world({"a": [gpu("a", i) for i in range(8)], "b": [gpu("b", i) for i in range(8)]})
    claims = [claim(f"c{i}", DeviceRequest("gpus", "gpu", count=8)) for i in range(3)]
    devices = world(devices.devices, claims)
    three = gang("g", *(pod(f"p{i}", made(f"c{i}")) for i in range(3)))
    result, held = plan([node("a"), node("b"), node("none")], [three], devices)
    assert not result.releases and not held, (
        "3 pods x 8 devices, 16 devices: held, not released to a node without"
    )
    (hold,) = result.holds
    assert "devices of class gpu" in hold.message
    two = gang("g", *(pod(f"p{i}", made(f"c{i}")) for i in range(2)))
    result, _ = plan([node("a"), node("b"), node("none")], [two], devices)
    (release,) = result.releases
    assert sorted(n.name for _, n in release.placement) == ["a", "b"]


def test_a_gang_that_fits_only_if_its_devices_are_chosen_together() -> None:
    # d0 serves both requests, d1 only the second: the first pod must get d0.
    devices = {"a": [gpu("a", 0, nvlink=True), gpu("a", 1, nvlink=False)]}
    linked = DeviceRequest("gpu", "gpu", (f'device.attributes["{DRIVER}"].nvlink',), 1)
    anyone = DeviceRequest("gpu", "gpu", (), 1)
    claims = [claim("c0", linked), claim("c1", anyone)]
    counted = count_devices(
        {"a": node("a")},
        [gang("g", pod("p1", made("c1")), pod("p0", made("c0")))],
        world(devices, claims),
        still_matcher(),
    )
    result = plan_gangs(list(counted.nodes.values()), counted.taken, counted.queue)
    (release,) = result.releases
    assert counted.counts is not None
    chosen = counted.counts.assign_release(release.placement, counted.asks)
    assert chosen is not None
    assert chosen["p0"][("gpus", "gpu")] == ((DRIVER, "a", "gpu-0"),)
    assert chosen["p1"][("gpus", "gpu")] == ((DRIVER, "a", "gpu-1"),)
    # Two pods that both need the linked device do not fit, though the node has two devices.
    claims = [claim("c0", linked), claim("c1", linked)]
    result, _ = plan(
        [node("a")], [gang("g", pod("p0", made("c0")), pod("p1", made("c1")))], world(devices, claims)
    )
    assert not result.releases


def test_selectors_rule_nodes_out() -> None:
    devices = world({"a": [gpu("a", i, "A100") for i in range(8)], "b": [gpu("b", i) for i in range(8)]})
    h100 = DeviceRequest("gpus", "gpu", (f'device.attributes["{DRIVER}"].model == "H100"',), 4)
    devices = world(devices.devices, [claim("c0", h100), claim("c1", h100)])
    result, _ = plan(
        [node("a"), node("b")], [gang("g", pod("p0", made("c0")), pod("p1", made("c1")))], devices
    )
    (release,) = result.releases
    assert {n.name for _, n in release.placement} == {"b"}


def test_the_extended_resource_mapping() -> None:
    """A pod asking example.com/gpu is served by the class's devices where the node does not have
    it in allocatable, and by the device plugin where it does."""
    devices = world({"dra": [gpu("dra", i) for i in range(8)]})
    nodes = [node("dra"), node("plugin", {EXTENDED: "8"}), node("neither")]
    result, _ = plan(nodes, [gang("g", pod("p0", gpus=8), pod("p1", gpus=8))], devices)
    (release,) = result.releases
    assert sorted(n.name for _, n in release.placement) == ["dra", "plugin"]
    result, _ = plan(nodes, [gang("g", *(pod(f"p{i}", gpus=8) for i in range(3)))], devices)
    assert not result.releases


def test_an_allocated_shared_claim_pins_its_pods() -> None:
    here = ((("metadata.name", "In", ("b",), True),),)
    shared = claim(
        "shared", DeviceRequest("gpus", "gpu", count=1), allocated=True, allocated_nodes=here, shared=True
    )
    devices = world({"a": [gpu("a", 0)], "b": [gpu("b", 0)]}, [shared])
    result, _ = plan([node("a"), node("b")], [gang("g", pod("p0", PodClaim("s", claim="shared")))], devices)
    (release,) = result.releases
    assert release.placement[0][1].name == "b"


def test_what_is_not_modelled_holds_the_gang_with_why() -> None:
    unmodeled = claim("c0", unmodeled=("request gpus: firstAvailable alternatives are not modelled yet",))
    devices = world({"a": [gpu("a", i) for i in range(8)]}, [unmodeled])
    result, held = plan([node("a")], [gang("g", pod("p0", made("c0")))], devices)
    assert not result.releases
    assert held[("ns", "g")][0] == "DevicesNotModelled" and "firstAvailable" in held[("ns", "g")][1]
    _, held = plan([node("a")], [gang("g", pod("p0", made("missing")))], devices)
    assert held[("ns", "g")] == ("WaitingForClaims", "ResourceClaim missing is not seen yet")
    shared = claim("s", DeviceRequest("gpus", "gpu", count=1), shared=True)
    one = gang("g", pod("p0", PodClaim("s", claim="s")))
    other = gang("h", pod("q0", PodClaim("s", claim="s")))
    _, held = plan([node("a")], [one, other], world({"a": [gpu("a", 0)]}, [shared]))
    assert "shared by pods of several gangs" in held[("ns", "g")][1]
    others = claim("theirs", DeviceRequest("gpus", "gpu", count=1), owner_pod="uid-of-another-pod")
    _, held = plan([node("a")], [gang("g", pod("p0", PodClaim("c", claim="theirs")))], world({}, [others]))
    assert held[("ns", "g")] == ("DevicesNotModelled", "ResourceClaim theirs was made for another pod")


def test_all_devices_takes_a_node_whose_devices_are_all_free() -> None:
    every = DeviceRequest("gpus", "gpu", all_devices=True)
    free = {"a": (gpu("a", 0), gpu("a", 1)), "b": (gpu("b", 0),)}
    taken = DeviceWorld(
        devices=free,
        all_devices={"a": free["a"] + (gpu("a", 2),), "b": free["b"]},  # a's gpu-2 is allocated
        classes=world({}).classes,
        claims={("ns", "c0"): claim("c0", every)},
    )
    result, _ = plan([node("a"), node("b")], [gang("g", pod("p0", made("c0")))], taken)
    (release,) = result.releases
    assert release.placement[0][1].name == "b"


def test_device_resources_are_told_apart() -> None:
    counts = DeviceCounts(world({"a": [gpu("a", 0)]}), [Ask(Kind("gpu"), 1)], still_matcher())
    assert all(is_device_resource(r) for r in counts.capacity("a", {})[0])
    assert not is_device_resource("nvidia.com/gpu")


# -- Hall's condition, against brute force --------------------------------------------------------

FLAGS = ("x", "y", "z")
KINDS = [Kind("gpu", (f'device.attributes["{DRIVER}"].{f}',)) for f in FLAGS]


def brute_force(devices: Sequence[frozenset[int]], units: Sequence[int]) -> bool:
    """Whether each unit (a kind's index) gets its own device that matches it."""

    def place(i: int, used: frozenset[int]) -> bool:
        if i == len(units):
            return True
        return any(
            j not in used and units[i] in devices[j] and place(i + 1, used | {j}) for j in range(len(devices))
        )

    return place(0, frozenset())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.frozensets(st.integers(0, 2)), max_size=6),
    st.lists(st.lists(st.integers(0, 2), max_size=3), max_size=3),
)
def test_counts_fit_exactly_when_devices_can_be_chosen(
    matches: list[frozenset[int]], pods: list[list[int]]
) -> None:
    devices = [gpu("a", i, flags={f: (k in m) for k, f in enumerate(FLAGS)}) for i, m in enumerate(matches)]
    asks = [[Ask(KINDS[k], 1, claim="c", request=f"r{i}") for i, k in enumerate(p)] for p in pods]
    counts = DeviceCounts(world({"a": devices}), [a for p in asks for a in p], still_matcher())
    total, taken = counts.capacity("a", {})
    capacity = subtract(total, taken)
    demand: dict[str, int] = {}
    for p in asks:
        for name, amount in counts.demand(p).items():
            demand[name] = demand.get(name, 0) + amount
    expected = brute_force(matches, [k for p in pods for k in p])
    assert fits(demand, capacity) == expected
    chosen = counts.assign("a", [(f"p{i}", p) for i, p in enumerate(asks)])
    assert (chosen is not None) == expected
    if chosen is not None:
        picked = [key for per_pod in chosen.values() for keys in per_pod.values() for key in keys]
        assert len(picked) == len(set(picked)) == sum(len(p) for p in pods)


def test_a_claim_the_pods_of_a_gang_share_puts_them_on_one_node() -> None:
    """With DRAWorkloadResourceClaims, a PodGroup's claim is made once and its pods name it
    through their template entry: not one claim per pod. Its devices are asked once, by the
    first pod, and all the gang's pods go to one node, where the devices are."""
    group_claim = claim("pg-gpus", DeviceRequest("gpus", "gpu", count=8), shared=True)
    devices = world(
        {"a": [gpu("a", i) for i in range(8)], "b": [gpu("b", i) for i in range(8)]}, [group_claim]
    )
    pair = gang("g", pod("p0", made("pg-gpus")), pod("p1", made("pg-gpus")))
    counted = count_devices({"a": node("a"), "b": node("b")}, [pair], devices, still_matcher())
    result = plan_gangs(list(counted.nodes.values()), counted.taken, counted.queue)
    (release,) = result.releases
    assert len({n.name for _, n in release.placement}) == 1, "one node for the pods that share it"
    assert counted.counts is not None
    chosen = counted.counts.assign_release(release.placement, counted.asks)
    assert chosen is not None and len(chosen["p0"][("gpus", "gpus")]) == 8 and not chosen.get("p1")
    twelve = claim("pg-gpus", DeviceRequest("gpus", "gpu", count=12), shared=True)
    result, _ = plan([node("a"), node("b")], [pair], world(devices.devices, [twelve]))
    assert not result.releases, "12 devices in one claim: no node has them, though two together do"


def test_kinds_of_request_new_to_a_pass_are_matched_within_its_time() -> None:
    """Many different selectors at once (a tenant's, say): the first is matched, the rest wait
    for later passes, holding only the gangs that ask them."""
    devices = world({"a": [gpu("a", i) for i in range(8)]})
    selectors = [f'device.attributes["{DRIVER}"].model != "X{i}"' for i in range(4)]
    claims = [claim(f"c{i}", DeviceRequest("gpus", "gpu", (s,), 1)) for i, s in enumerate(selectors)]
    devices = world(devices.devices, claims)
    queue = [gang(f"g{i}", pod(f"p{i}", made(f"c{i}"))) for i in range(4)]
    matcher = still_matcher()
    for passes in range(1, 5):  # no time at all: the first new kind of each pass only
        counted = count_devices({"a": node("a")}, queue, devices, matcher, matching_seconds=0.0)
        assert [g.name for g in counted.queue] == [f"g{i}" for i in range(passes)]
        assert {k[1] for k in counted.held} == {f"g{i}" for i in range(passes, 4)}
        assert all(r == "WaitingForClaims" and "still being matched" in m for r, m in counted.held.values())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sets(st.integers(0, 7), max_size=8), min_size=1, max_size=5))
def test_a_pass_counts_the_same_from_what_it_kept_as_from_scratch(allocations: list[set[int]]) -> None:
    """Pass after pass, devices allocated and freed on one node: what a matcher kept from
    earlier passes gives the counts a fresh one gives."""
    every = {"a": tuple(gpu("a", i) for i in range(8)), "b": tuple(gpu("b", i) for i in range(8))}
    h100 = DeviceRequest("gpus", "gpu", (f'device.attributes["{DRIVER}"].model == "H100"',), 2)
    queue = [gang("g", pod("p0", made("c0")), pod("p1", made("c1")))]
    claims = {("ns", c.name): c for c in (claim("c0", h100), claim("c1", h100))}
    base = world(every)
    kept = still_matcher()
    nodes = {"a": node("a"), "b": node("b")}
    for taken in allocations:
        free = {"a": tuple(d for i, d in enumerate(every["a"]) if i not in taken), "b": every["b"]}
        now = DeviceWorld(devices=free, all_devices=every, classes=base.classes, claims=claims)
        again = count_devices(nodes, queue, now, kept)
        fresh = count_devices(nodes, queue, now, still_matcher())
        assert {n: c.allocatable for n, c in again.nodes.items()} == {
            n: c.allocatable for n, c in fresh.nodes.items()
        }
        assert again.taken == fresh.taken
        assert [g.pods for g in again.queue] == [g.pods for g in fresh.queue]


def test_a_request_whose_devices_share_an_attribute_takes_them_from_one_group() -> None:
    """matchAttribute pcieRoot, 4 devices a claim: a node whose devices are in two roots of 4
    takes two such pods, one per root; a node of four roots of 2 takes none, though it has 8."""
    root = f"{DRIVER}/pcieRoot"

    def rooted(node_name: str, size: int) -> list[Device]:
        return [
            replace(gpu(node_name, i), attributes={f"{DRIVER}/model": "H100", root: f"r{i // size}"})
            for i in range(8)
        ]

    four = DeviceRequest("gpus", "gpu", count=4, match_attribute=root)
    claims = [claim(f"c{i}", four) for i in range(3)]
    devices = world({"halves": rooted("halves", 4), "quarters": rooted("quarters", 2)}, claims)
    nodes = [node("halves"), node("quarters")]
    pair = gang("g", pod("p0", made("c0")), pod("p1", made("c1")))
    counted = count_devices({n.name: n for n in nodes}, [pair], devices, still_matcher())
    result = plan_gangs(list(counted.nodes.values()), counted.taken, counted.queue)
    (release,) = result.releases
    assert {n.name for _, n in release.placement} == {"halves"}
    assert counted.counts is not None
    chosen = counted.counts.assign_release(release.placement, counted.asks)
    assert chosen is not None
    roots = [
        {d.attributes[root] for d in devices.devices["halves"] if d.key in keys}
        for keys in (chosen["p0"][("gpus", "gpus")], chosen["p1"][("gpus", "gpus")])
    ]
    assert roots in ([{"r0"}, {"r1"}], [{"r1"}, {"r0"}]), roots
    three = gang("g", *(pod(f"p{i}", made(f"c{i}")) for i in range(3)))
    result, _ = plan(nodes, [three], devices)
    assert not result.releases, "8 free devices on the quarters node, but no root of 4"


def test_requests_that_share_an_attribute_take_their_devices_from_one_group() -> None:
    """A claim of 2 GPUs and 1 NIC on one PCIe root (matchAttribute over both requests). Node
    "split" has roots of 4 GPUs and no NIC, and of 4 NICs and no GPU: 8 GPUs and 4 NICs, and
    no claim fits. Node "paired" has two roots of 4 GPUs and 1 NIC: two claims fit, one per
    root, not three (though 8 GPUs would serve four pods of 2)."""
    root = f"{DRIVER}/pcieRoot"

    def device(node_name: str, name: str, model: str, at: str) -> Device:
        return Device(DRIVER, node_name, name, {f"{DRIVER}/model": model, root: at})

    split = [device("split", f"gpu-{i}", "H100", "r0") for i in range(4)] + [
        device("split", f"gpu-{i}", "H100", "r1") for i in range(4, 8)
    ]
    split += [device("split", f"nic-{i}", "NIC", "r2") for i in range(4)]
    paired = [device("paired", f"gpu-{i}", "H100", f"r{i // 4}") for i in range(8)]
    paired += [device("paired", f"nic-{i}", "NIC", f"r{i}") for i in range(2)]
    gpus = DeviceRequest(
        "gpus",
        "gpu",
        (f'device.attributes["{DRIVER}"].model == "H100"',),
        2,
        match_attribute=root,
        match_with=("gpus", "nic"),
    )
    nic = DeviceRequest(
        "nic",
        "gpu",
        (f'device.attributes["{DRIVER}"].model == "NIC"',),
        1,
        match_attribute=root,
        match_with=("gpus", "nic"),
    )
    claims = [claim(f"c{i}", gpus, nic) for i in range(3)]
    devices = world({"split": split, "paired": paired}, claims)
    pair = gang("pair", pod("p0", made("c0")), pod("p1", made("c1")))
    result, _ = plan([node("split")], [pair], devices)
    assert not result.releases, "GPUs and NICs on different roots: no claim fits"
    counted = count_devices({"paired": node("paired")}, [pair], devices, still_matcher())
    result = plan_gangs(list(counted.nodes.values()), counted.taken, counted.queue)
    (release,) = result.releases
    assert counted.counts is not None
    chosen = counted.counts.assign_release(release.placement, counted.asks)
    assert chosen is not None
    by_key = {d.key: d for d in paired}
    for uid in ("p0", "p1"):
        picked = [by_key[k] for r in ("gpus", "nic") for k in chosen[uid][("gpus", r)]]
        assert len(picked) == 3 and len({d.attributes[root] for d in picked}) == 1, picked
    assert {by_key[chosen[u][("gpus", "nic")][0]].attributes[root] for u in ("p0", "p1")} == {"r0", "r1"}
    three = gang("three", *(pod(f"p{i}", made(f"c{i}")) for i in range(3)))
    result, _ = plan([node("paired")], [three], devices)
    assert not result.releases, "two roots with a NIC each: two claims, not three"


def test_two_constraints_alike_in_one_claim_take_two_groups() -> None:
    """One claim, two constraints of the same shape (2 GPUs and a NIC on a root, twice): on a
    node of two such roots, each constraint gets a root of its own, no device twice."""
    root = f"{DRIVER}/pcieRoot"
    devices_of = [
        Device(DRIVER, "a", f"gpu-{i}", {f"{DRIVER}/model": "H100", root: f"r{i // 4}"}) for i in range(8)
    ]
    devices_of += [
        Device(DRIVER, "a", f"nic-{i}", {f"{DRIVER}/model": "NIC", root: f"r{i}"}) for i in range(2)
    ]

    def request(name: str, model: str, count: int, group: tuple[str, str]) -> DeviceRequest:
        selector = (f'device.attributes["{DRIVER}"].model == "{model}"',)
        return DeviceRequest(name, "gpu", selector, count, match_attribute=root, match_with=group)

    both = claim(
        "c0",
        request("g1", "H100", 2, ("g1", "n1")),
        request("n1", "NIC", 1, ("g1", "n1")),
        request("g2", "H100", 2, ("g2", "n2")),
        request("n2", "NIC", 1, ("g2", "n2")),
    )
    world_of = world({"a": devices_of}, [both])
    counted = count_devices({"a": node("a")}, [gang("g", pod("p0", made("c0")))], world_of, still_matcher())
    result = plan_gangs(list(counted.nodes.values()), counted.taken, counted.queue)
    (release,) = result.releases
    assert counted.counts is not None
    chosen = counted.counts.assign_release(release.placement, counted.asks)
    assert chosen is not None
    by_key = {d.key: d for d in devices_of}
    picked = {r: [by_key[k] for k in keys] for (_, r), keys in chosen["p0"].items()}
    assert sum(len(v) for v in picked.values()) == len({k for v in chosen["p0"].values() for k in v}) == 6
    first = {d.attributes[root] for r in ("g1", "n1") for d in picked[r]}
    second = {d.attributes[root] for r in ("g2", "n2") for d in picked[r]}
    assert len(first) == len(second) == 1 and first != second, (first, second)


def test_many_kinds_on_the_same_devices_hold_only_the_gangs_that_come_later() -> None:
    """Seven different selectors on the same GPUs (seven teams, or one tenant trying): the first
    six in queue order are counted and their gangs planned; the seventh waits, and no other."""
    selectors = [f"{i} == {i}" for i in range(7)]
    claims = [claim(f"c{i}", DeviceRequest("gpus", "gpu", (s,), 1)) for i, s in enumerate(selectors)]
    devices = world({"a": [gpu("a", i) for i in range(8)]}, claims)
    queue = [replace(gang(f"g{i}", pod(f"p{i}", made(f"c{i}"))), created=float(i)) for i in range(7)]
    counted = count_devices({"a": node("a")}, queue, devices, still_matcher())
    assert [g.name for g in counted.queue] == [f"g{i}" for i in range(6)]
    assert set(counted.held) == {("ns", "g6")} and counted.held[("ns", "g6")][0] == "WaitingForClaims"
    result = plan_gangs(list(counted.nodes.values()), counted.taken, counted.queue)
    assert len(result.releases) == 6


def test_a_claim_name_in_another_namespace_is_another_claim() -> None:
    """Gangs of another namespace naming a claim of the same name do not make this one's shared."""
    shared = claim("shared", DeviceRequest("gpus", "gpu", count=1), shared=True)
    theirs = Claim("other", "shared", (DeviceRequest("gpus", "gpu", count=1),), shared=True)
    devices = world({"a": [gpu("a", i) for i in range(8)]}, [shared, theirs])
    mine = gang("g", pod("p0", PodClaim("s", claim="shared")), pod("p1", PodClaim("s", claim="shared")))
    attack = [
        Gang("other", name, 1, (pod(f"{name}-0", PodClaim("s", claim="shared")),), members=1)
        for name in ("x", "y")
    ]
    counted = count_devices({"a": node("a")}, [mine, *attack], devices, still_matcher())
    assert ("ns", "g") not in counted.held


def test_the_devices_of_a_passs_releases_on_one_node_are_chosen_together() -> None:
    """Two gangs of one pod on one node in one pass: the first asks any device, the second the
    NVLinked one. Chosen gang by gang, the first could take the linked device; together, each
    gets its own."""
    from quorum.core.planner import Planner
    from quorum.operator.snapshot import DeviceNodes, Snapshot, plan_queue

    linked = DeviceRequest("gpu", "gpu", (f'device.attributes["{DRIVER}"].nvlink',), 1)
    anyone = DeviceRequest("gpu", "gpu", (), 1)
    devices = world(
        {"a": [gpu("a", 0, nvlink=True), gpu("a", 1, nvlink=False)]},
        [claim("c0", anyone), claim("c1", linked)],
    )
    queue = [
        replace(gang("first", pod("p0", made("c0"))), created=0.0),
        replace(gang("second", pod("p1", made("c1"))), created=1.0),
    ]
    snapshot = Snapshot({"a": node("a")}, {}, {}, {}, {}, None, 0.0, devices=devices)
    planned = plan_queue(snapshot, queue, Planner(), DeviceNodes(still_matcher()))
    assert {r.gang.name for r in planned.plan.releases} == {"first", "second"}
    assert planned.devices[("ns", "second")]["p1"][("gpus", "gpu")] == ((DRIVER, "a", "gpu-0"),)
    assert planned.devices[("ns", "first")]["p0"][("gpus", "gpu")] == ((DRIVER, "a", "gpu-1"),)


def test_a_device_of_a_pool_serving_several_nodes_is_chosen_once() -> None:
    """One network device (allNodes) is among the devices of nodes a and b. A gang of two pods
    that each ask one fits the counts (one on each node) but not the device: it is held with
    why, and a later gang of one pod is planned again without it and gets the device."""
    from quorum.core.planner import Planner
    from quorum.operator.snapshot import DeviceNodes, Snapshot, plan_queue

    nic = Device(DRIVER, "fabric", "nic-0", {f"{DRIVER}/model": "NIC"})
    one = DeviceRequest("nic", "gpu", count=1)
    devices = replace(
        world({"a": [nic], "b": [nic]}, [claim(f"c{i}", one) for i in range(3)]),
        shared_pools=frozenset({f"{DRIVER}/fabric"}),
    )
    queue = [
        replace(gang("pair", pod("p0", made("c0")), pod("p1", made("c1"))), created=0.0),
        replace(gang("single", pod("p2", made("c2"))), created=1.0),
    ]
    snapshot = Snapshot({"a": node("a"), "b": node("b")}, {}, {}, {}, {}, None, 0.0, devices=devices)
    planned = plan_queue(snapshot, queue, Planner(), DeviceNodes(still_matcher()))
    assert [r.gang.name for r in planned.plan.releases] == ["single"]
    assert planned.devices[("ns", "single")]["p2"][("gpus", "nic")] == ((DRIVER, "fabric", "nic-0"),)
    (hold,) = [h for h in planned.plan.holds if h.gang.name == "pair"]
    assert hold.reason == "Unschedulable"
    assert f"pools that serve several nodes ({DRIVER}/fabric)" in hold.message


def test_a_selector_that_fails_on_devices_is_said_on_the_gang() -> None:
    """A selector reading an attribute the devices do not have fails on each (as in kube-
    scheduler's allocator): no device counts for the gang, and its hold says which selector
    failed where."""
    from quorum.core.planner import Planner
    from quorum.operator.snapshot import DeviceNodes, Snapshot, plan_queue

    broken = DeviceRequest("gpus", "gpu", (f'device.attributes["{DRIVER}"].memoryGiB > 40',), 1)
    devices = world({"a": [gpu("a", 0)]}, [claim("c0", broken)])
    snapshot = Snapshot({"a": node("a")}, {}, {}, {}, {}, None, 0.0, devices=devices)
    queue = [gang("g", pod("p0", made("c0")))]
    planned = plan_queue(snapshot, queue, Planner(), DeviceNodes(still_matcher()))
    (hold,) = planned.plan.holds
    assert not planned.plan.releases and hold.reason == "Unschedulable"
    assert f"a device selector failed on {DRIVER}/a/gpu-0" in hold.message, hold.message
    assert "memoryGiB" in hold.message, hold.message


def test_matching_a_new_kind_is_spread_over_passes_and_given_up_past_its_time() -> None:
    """A pass with no time left matches one node of a new kind and goes on from there the next
    pass; a kind whose matching takes longer than the matcher's `kind_seconds` in all is given
    up, its gangs held with why."""
    many = {f"n{i}": [gpu(f"n{i}", j) for j in range(8)] for i in range(5)}
    devices = world(many, [claim("c0", DeviceRequest("gpus", "gpu", count=1))])
    queue = [gang("g", pod("p0", made("c0")))]
    nodes = {n: node(n) for n in many}
    matcher = still_matcher()
    for passes in range(1, 5):
        counted = count_devices(nodes, queue, devices, matcher, matching_seconds=0.0)
        assert counted.held[("ns", "g")][0] == "WaitingForClaims", passes
        assert next(iter(matcher.partial.values()))[0] == passes, "one node more each pass"
    counted = count_devices(nodes, queue, devices, matcher, matching_seconds=0.0)
    assert [g.name for g in counted.queue] == ["g"] and not matcher.partial

    ticks = itertools.count()  # a clock a second on at each look
    costly = DeviceMatcher(kind_seconds=0.5, clock=lambda: float(next(ticks)))
    counted = count_devices(nodes, queue, devices, costly, matching_seconds=0.0)
    reason, why = counted.held[("ns", "g")]
    assert reason == "DevicesNotModelled" and "took over 0.5 s to match 1 of 5 nodes" in why, why
