"""The operator's fence (manifests/47-operator-fence.yaml) on generated requests, evaluated by
cel-python (an interpreter independent of the apiserver's cel-go; the integration tests in
tests/integration/test_operator_rights.py show the apiserver agrees on the cases that matter):

- every release patch quorum makes (quorum.k8s.writes.release_patch, onto pods of every affinity
  shape) passes, and one onto a pod with no affinity of its own is let through by the match
  condition alone;
- any other change to a pod, a Job or their metadata is refused by a validation, and a deletion
  of a pod that is not a gang pod;
- what the match condition lets through passes every validation (the condition is the fast
  path, the validations are the rules).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonpatch
import pytest
import yaml
from celpy.adapter import json_to_cel
from celpy.celtypes import BoolType, MapType, StringType
from celpy.evaluation import CELEvalError
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.install import DEFAULT_NAMESPACE, operator_username
from quorum.k8s.writes import GATE, REQUIRED, release_patch

POLICY = Path(__file__).resolve().parents[2] / "manifests" / "47-operator-fence.yaml"
OPERATOR = operator_username(DEFAULT_NAMESPACE)
JSON = dict[str, Any]


@cache
def programs() -> tuple[Any, list[tuple[str, Any]], list[Any]]:
    """The match condition, the variables (in order) and the validations, compiled."""
    docs = yaml.safe_load_all(POLICY.read_text())
    spec = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")["spec"]
    env = celpy.Environment()
    (condition,) = spec["matchConditions"]
    variables = [(v["name"], env.program(env.compile(v["expression"]))) for v in spec["variables"]]
    validations = [env.program(env.compile(v["expression"])) for v in spec["validations"]]
    return env.program(env.compile(condition["expression"])), variables, validations


def evaluate(program: Any, activation: JSON) -> Any:
    try:
        return program.evaluate(activation)
    except CELEvalError as err:
        return err  # an error is a value: used by an expression, it makes that one an error


@dataclass(frozen=True)
class Verdict:
    matched: bool  # the match condition held: the validations decide
    failed: tuple[int, ...]  # the validations that did not evaluate to true

    @property
    def allowed(self) -> bool:
        return not self.matched or not self.failed


def judge(
    operation: str,
    resource: str,
    old: JSON | None,
    new: JSON | None,
    user: str = OPERATOR,
    sub: str = "",
) -> Verdict:
    condition, variables, validations = programs()
    kind = {"jobs": "Job", "nodes": "Node"}.get(resource, "Pod")
    request = {
        "operation": operation,
        "resource": {"group": "batch" if resource == "jobs" else "", "version": "v1", "resource": resource},
        "subResource": sub,
        "kind": {"kind": kind},
        "namespace": "ml",
        "name": "x",
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
    }
    activation: JSON = {
        "object": json_to_cel(new),
        "oldObject": json_to_cel(old),
        "request": json_to_cel(request),
    }
    matched = evaluate(condition, activation)
    # A CEL error in a match condition makes the apiserver apply failurePolicy Fail: refused.
    assert isinstance(matched, BoolType), f"CEL error in the match condition: {matched!r}"
    if user != OPERATOR:
        return Verdict(bool(matched), ())
    values: dict[StringType, Any] = {}
    for name, program in variables:  # the apiserver evaluates them lazily; errors are values here
        activation["variables"] = MapType(values)
        values[StringType(name)] = evaluate(program, activation)
    activation["variables"] = MapType(values)
    results = [evaluate(v, activation) for v in validations]
    return Verdict(bool(matched), tuple(i for i, r in enumerate(results) if r != BoolType(True)))


# -- generated pods ---------------------------------------------------------------------------

expression = st.builds(
    lambda key, op, values: {"key": key, "operator": op, "values": values},
    st.sampled_from(["zone", "pool"]),
    st.sampled_from(["In", "NotIn"]),
    st.lists(st.sampled_from(["x", "y"]), min_size=1, max_size=2, unique=True),
)
field_requirement = st.builds(
    lambda op, values: {"key": "metadata.name", "operator": op, "values": values},
    st.sampled_from(["In", "NotIn"]),
    st.lists(st.sampled_from(["node-1", "node-2"]), min_size=1, max_size=2, unique=True),
)
term = st.fixed_dictionaries(
    {},
    optional={
        "matchExpressions": st.lists(expression, min_size=1, max_size=2),
        "matchFields": st.lists(field_requirement, min_size=1, max_size=2),
    },
)
pod_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}


@st.composite
def node_affinities(draw: st.DrawFn) -> JSON:
    affinity: JSON = {}
    if draw(st.booleans()):
        affinity[REQUIRED] = {"nodeSelectorTerms": draw(st.lists(term, min_size=1, max_size=3))}
    if draw(st.booleans()) or not affinity:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 1, "preference": draw(term)}
        ]
    return affinity


@st.composite
def affinities(draw: st.DrawFn) -> JSON | None:
    affinity: JSON = {}
    if draw(st.booleans()):
        affinity["nodeAffinity"] = draw(node_affinities())
    if draw(st.booleans()):
        affinity["podAffinity"] = pod_affinity
    if draw(st.booleans()):
        affinity["podAntiAffinity"] = pod_affinity
    return affinity or None


def gated_pod(
    gates: list[str] | None = None,
    affinity: JSON | None = None,
    spec: JSON | None = None,
    owned: bool = False,
) -> JSON:
    full: JSON = {
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        "schedulingGates": [{"name": g} for g in gates or [GATE]],
        "terminationGracePeriodSeconds": 30,
        **(spec or {}),
    }
    if affinity is not None:
        full["affinity"] = affinity
    meta: JSON = {
        "name": "x",
        "namespace": "ml",
        "uid": "u-1",
        "labels": {"quorum.dev/gang": "g", "app": "train"},
    }
    if owned:
        meta["ownerReferences"] = [{"kind": "Job", "name": "train", "uid": "j-1", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": full}


@st.composite
def gated_pods(draw: st.DrawFn) -> JSON:
    gates = draw(st.lists(st.sampled_from(["example.com/other", "kueue.x-k8s.io/admission"]), unique=True))
    gates.insert(draw(st.integers(0, len(gates))), GATE)
    spec: JSON = {}
    if draw(st.booleans()):
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if draw(st.booleans()):
        spec["nodeSelector"] = {"pool": "a100"}
    return gated_pod(gates, draw(affinities()), spec, draw(st.booleans()))


def released(pod: JSON, node: str | None) -> JSON:
    ops = release_patch(pod, node)
    assert ops is not None
    new: JSON = jsonpatch.apply_patch(pod, ops)
    return new


nodes = st.sampled_from(["node-1", "node-9", None])


@settings(max_examples=200, deadline=None)
@given(gated_pods(), nodes)
def test_every_release_patch_passes(pod: JSON, node: str | None) -> None:
    verdict = judge("UPDATE", "pods", pod, released(pod, node))
    assert not verdict.failed, verdict  # whether or not the match condition let it through
    if "affinity" not in pod["spec"]:
        assert not verdict.matched, "a plain release is let through by the match condition"


@settings(max_examples=100, deadline=None)
@given(gated_pods(), st.sampled_from(["node-1", "node-9"]))
def test_a_preemptors_release_may_add_its_reservation_toleration_and_no_other(pod: JSON, node: str) -> None:
    ops = release_patch(pod, node, tolerate="t0k3n")
    assert ops is not None
    new: JSON = jsonpatch.apply_patch(pod, ops)
    assert not judge("UPDATE", "pods", pod, new).failed
    other = copy.deepcopy(new)
    other["spec"]["tolerations"][-1]["key"] = "node.kubernetes.io/unschedulable"
    assert judge("UPDATE", "pods", pod, other).failed == (1,)
    twice = copy.deepcopy(new)
    twice["spec"]["tolerations"].append(twice["spec"]["tolerations"][-1])
    assert judge("UPDATE", "pods", pod, twice).failed == (1,)


def a_node(taints: list[JSON]) -> JSON:
    return {
        "metadata": {"name": "n1", "labels": {"zone": "a"}},
        "spec": {"taints": taints, "providerID": "kwok://n1"},
    }


RESERVED = {"key": "quorum.dev/reserved", "value": "t0k3n", "effect": "NoSchedule"}
FOREIGN = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}


def test_a_node_may_gain_or_lose_only_reservation_taints() -> None:
    assert not judge("UPDATE", "nodes", a_node([FOREIGN]), a_node([FOREIGN, RESERVED])).failed
    assert not judge("UPDATE", "nodes", a_node([RESERVED]), a_node([])).failed
    assert judge("UPDATE", "nodes", a_node([FOREIGN]), a_node([])).failed == (8,), "a foreign taint"
    assert judge("UPDATE", "nodes", a_node([]), a_node([FOREIGN])).failed == (8,)
    cordoned = a_node([RESERVED])
    cordoned["spec"]["unschedulable"] = True
    assert judge("UPDATE", "nodes", a_node([]), cordoned).failed == (8,)
    relabelled = a_node([RESERVED])
    relabelled["metadata"]["labels"]["zone"] = "b"
    assert judge("UPDATE", "nodes", a_node([]), relabelled).failed == (0,)
    evicting = {**RESERVED, "effect": "NoExecute"}  # would evict pods past their budgets
    assert judge("UPDATE", "nodes", a_node([]), a_node([evicting])).failed == (8,)
    assert judge(
        "UPDATE", "nodes", a_node([]), a_node([{**RESERVED, "effect": "PreferNoSchedule"}])
    ).failed == (8,)


def a_status(conditions: list[JSON], phase: str = "Running") -> JSON:
    pod = {"metadata": {"name": "v", "labels": {}}, "spec": {"containers": [{"name": "c"}]}}
    return {**pod, "status": {"phase": phase, "conditions": conditions}}


READY = {"type": "Ready", "status": "True"}
TARGET = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByQuorum", "message": "m"}


def test_a_pods_status_may_gain_only_the_disruption_target_condition() -> None:
    assert not judge("UPDATE", "pods", a_status([READY]), a_status([READY, TARGET]), sub="status").failed
    assert judge("UPDATE", "pods", a_status([READY]), a_status([TARGET]), sub="status").failed == (6,)
    assert judge(
        "UPDATE", "pods", a_status([READY]), a_status([READY, TARGET], "Failed"), sub="status"
    ).failed == (6,)
    plain = judge("UPDATE", "pods", a_status([READY]), a_status([READY, TARGET]), sub="status")
    assert plain.matched, "a status write never takes the release's fast path"


NEVER_VICTIMS: dict[str, Callable[[JSON], object]] = {
    "system-critical": lambda p: p["spec"].update(priority=2_000_000_000),
    "a DaemonSet's": lambda p: p["metadata"].update(
        ownerReferences=[{"kind": "DaemonSet", "name": "d", "uid": "u", "controller": True}]
    ),
    "static": lambda p: p["metadata"].update(annotations={"kubernetes.io/config.mirror": "x"}),
    "a Node's": lambda p: p["metadata"].update(
        ownerReferences=[{"kind": "Node", "name": "n", "uid": "u", "controller": True}]
    ),
    "immune by the platform": lambda p: p["metadata"].update(annotations={"quorum.dev/preemptible": "false"}),
}


def test_a_pod_no_preemption_may_take_is_never_marked() -> None:
    for what, make in NEVER_VICTIMS.items():
        old = a_status([READY])
        make(old)
        new = copy.deepcopy(old)
        new["status"]["conditions"] = [READY, TARGET]
        assert judge("UPDATE", "pods", old, new, sub="status").failed == (7,), what
    highest_user = a_status([READY])
    highest_user["spec"]["priority"] = 1_000_000_000
    marked = {**highest_user, "status": {"phase": "Running", "conditions": [READY, TARGET]}}
    assert not judge("UPDATE", "pods", highest_user, marked, sub="status").failed


# -- anything else is refused -----------------------------------------------------------------


def terms_of(pod: JSON) -> list[JSON]:
    node_affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    terms: list[JSON] = (node_affinity.get(REQUIRED) or {}).get("nodeSelectorTerms") or []
    return terms


def mutations(old: JSON, new: JSON) -> dict[str, Callable[[JSON], object]]:
    """Changes to a released pod `new` (of `old`) beyond the release; each changes something."""
    out: dict[str, Callable[[JSON], object]] = {
        "image": lambda p: p["spec"]["containers"][0].update(image="evil.example.com/miner"),
        "label": lambda p: p["metadata"]["labels"].update(extra="1"),
        "gang label removed": lambda p: p["metadata"]["labels"].pop("quorum.dev/gang"),
        "annotation": lambda p: p["metadata"].setdefault("annotations", {}).update(note="x"),
        "owner": lambda p: (
            p["metadata"]
            .setdefault("ownerReferences", [])
            .append({"kind": "ReplicaSet", "name": "r", "uid": "r-1"})
        ),
        "finalizer": lambda p: p["metadata"].setdefault("finalizers", []).append("example.com/keep"),
        "toleration": lambda p: p["spec"].setdefault("tolerations", []).append({"operator": "Exists"}),
        "deadline": lambda p: p["spec"].update(activeDeadlineSeconds=1),
        "grace": lambda p: p["spec"].update(terminationGracePeriodSeconds=1),
        "node selector": lambda p: p["spec"].setdefault("nodeSelector", {}).update(evil="1"),
        "pod affinity": lambda p: p["spec"].setdefault("affinity", {}).update(podAntiAffinity={"x": 1}),
        "two-node pin": lambda p: p["spec"].update(
            affinity={"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchFields": [two_nodes]}]}}}
        ),
        "pinned by label": lambda p: p["spec"].update(
            affinity={"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [by_label]}]}}}
        ),
    }
    gates = [g["name"] for g in new["spec"].get("schedulingGates") or []]
    if gates:
        out["another gate removed"] = lambda p: p["spec"]["schedulingGates"].pop()
    terms = terms_of(new)
    if terms:
        out["a term added"] = lambda p: terms_of(p).append({"matchFields": [two_nodes]})
    if terms_of(old):
        out["a term dropped"] = lambda p: terms_of(p).pop()
    if any(t.get("matchExpressions") for t in terms):
        out["a requirement dropped"] = lambda p: next(t for t in terms_of(p) if t.get("matchExpressions"))[
            "matchExpressions"
        ].pop()
    if any(t.get("matchFields") for t in terms_of(old)):
        out["its own pin moved"] = lambda p: [
            f.update(values=["node-elsewhere"]) for t in terms_of(p) for f in t.get("matchFields") or []
        ]
    return out


two_nodes = {"key": "metadata.name", "operator": "In", "values": ["node-1", "node-2"]}
by_label = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1"]}


@settings(max_examples=200, deadline=None)
@given(gated_pods(), nodes, st.data())
def test_any_other_change_to_a_pod_is_refused(pod: JSON, node: str | None, data: st.DataObject) -> None:
    new = released(pod, node)
    choices = mutations(pod, new)
    name = data.draw(st.sampled_from(sorted(choices)))
    new = copy.deepcopy(new)
    choices[name](new)
    verdict = judge("UPDATE", "pods", pod, new)
    assert verdict.matched and verdict.failed, (name, verdict)


IN_ZONE = {"key": "zone", "operator": "In", "values": ["x"]}
USER_PIN = {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
OWN_AFFINITIES: dict[str, JSON] = {
    "its own one-node pin": {
        "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchFields": [USER_PIN]}]}}
    },
    "a label term": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [IN_ZONE]}]}}},
    "an empty term and a pin": {
        "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{}, {"matchFields": [USER_PIN, USER_PIN]}]}}
    },
    "pod affinity": {"podAffinity": pod_affinity},
    "a preference": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}},
}


@pytest.mark.parametrize("node", ["node-1", "node-2", None])
@pytest.mark.parametrize("shape", sorted(OWN_AFFINITIES))
def test_a_pod_with_affinity_of_its_own_is_judged_by_the_rules(shape: str, node: str | None) -> None:
    """Shapes the generator rarely makes: the rules, not the match condition, judge them."""
    pod = gated_pod(affinity=copy.deepcopy(OWN_AFFINITIES[shape]))
    new = released(pod, node)
    assert judge("UPDATE", "pods", pod, new) == Verdict(matched=True, failed=())
    for name, mutate in mutations(pod, new).items():
        changed = copy.deepcopy(new)
        mutate(changed)
        verdict = judge("UPDATE", "pods", pod, changed)
        assert verdict.matched and verdict.failed, (name, verdict)


def test_only_gang_pods_and_marked_victims_may_be_deleted() -> None:
    gang = {"metadata": {"name": "x", "labels": {"quorum.dev/gang": "g"}}, "spec": {"containers": []}}
    assert not judge("DELETE", "pods", gang, None).matched
    other = {"metadata": {"name": "x", "labels": {"app": "a"}}, "spec": {"containers": []}}
    unlabelled = {"metadata": {"name": "x"}, "spec": {"containers": []}}
    someone_elses = {**a_status([READY, {**TARGET, "reason": "PreemptionByScheduler"}])}
    for pod in (other, unlabelled, a_status([READY]), someone_elses):
        verdict = judge("DELETE", "pods", pod, None)
        assert verdict.matched and verdict.failed == (4,), verdict
    victim = a_status([READY, TARGET])
    assert judge("DELETE", "pods", victim, None).allowed, "marked by a preemption first"
    for what, make in NEVER_VICTIMS.items():
        never = copy.deepcopy(victim)
        make(never)
        assert judge("DELETE", "pods", never, None).failed == (4,), what


def job(**spec: Any) -> JSON:
    template = {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    return {"metadata": {"name": "train", "uid": "j-1"}, "spec": {"template": template, **spec}}


@settings(max_examples=12, deadline=None)
@given(st.booleans(), st.sampled_from([None, 1, 4]))
def test_a_job_may_only_be_suspended_or_resumed(suspend: bool, parallelism: int | None) -> None:
    old = (
        job(suspend=not suspend) if parallelism is None else job(suspend=not suspend, parallelism=parallelism)
    )
    ops: list[JSON] = [
        {"op": "test", "path": "/metadata/uid", "value": "j-1"},
        {"op": "add", "path": "/spec/suspend", "value": suspend},
    ]
    assert judge("UPDATE", "jobs", old, jsonpatch.apply_patch(old, ops)).allowed
    for change in (
        {"parallelism": 8},
        {"completions": 3},
        {"backoffLimit": 100},
        {"activeDeadlineSeconds": 5},
        {"template": {"spec": {"containers": [{"name": "c", "image": "evil"}]}}},
    ):
        new = copy.deepcopy(old)
        new["spec"].update(change)
        verdict = judge("UPDATE", "jobs", old, new)
        assert verdict.matched and verdict.failed == (5,), (change, verdict)
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert judge("UPDATE", "jobs", old, relabelled).failed == (0,)


@settings(max_examples=30, deadline=None)
@given(gated_pods(), nodes)
def test_others_requests_are_not_the_fences_business(pod: JSON, node: str | None) -> None:
    new = released(pod, node)
    new["spec"]["containers"][0]["image"] = "other"
    for user in ("customer@example.com", "system:serviceaccount:kube-system:generic-garbage-collector"):
        assert not judge("UPDATE", "pods", pod, new, user).matched
        assert not judge("DELETE", "pods", pod, None, user).matched
        assert not judge("UPDATE", "jobs", job(), job(parallelism=3), user).matched
