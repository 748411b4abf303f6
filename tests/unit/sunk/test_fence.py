"""quorum-sunk-scheduler's fence (manifests/optional/sunk-scheduler.yaml) on generated requests,
evaluated by cel-python with the helpers of tests/unit/test_operator_fence.py (the integration
test in tests/integration/test_sunk.py shows the apiserver agrees, and runs the real scheduler
under it):

- every write the scheduler makes passes: the lock toleration added to its pods, their binding
  with the job recorded, the deletion of its pods, the lock taint and state and the drain
  reason on nodes, the SlurmCordon condition, Events about pods;
- anything else it might write with its rights is refused by a validation that says what: a
  pod of another scheduler, another toleration, a label, an image, another taint, a cordon,
  another condition, an Event about a node.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonpatch
import yaml
from celpy.adapter import json_to_cel
from celpy.celtypes import BoolType, MapType, StringType
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.install import DEFAULT_NAMESPACE
from quorum.sunk import api, model
from quorum.sunk.settings import SunkSettings
from tests.unit.test_operator_fence import Verdict, evaluate

MANIFEST = Path(__file__).resolve().parents[3] / "manifests" / "optional" / "sunk-scheduler.yaml"
SCHEDULER = f"system:serviceaccount:{DEFAULT_NAMESPACE}:quorum-sunk-scheduler"
NAME = SunkSettings().scheduler_name
JSON = dict[str, Any]


def documents() -> list[JSON]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


@cache
def programs() -> tuple[Any, list[tuple[str, Any]], list[Any], list[Any]]:
    """The match condition, the variables (in order), the validations and their messages."""
    spec = next(d for d in documents() if d["kind"] == "ValidatingAdmissionPolicy")["spec"]
    env = celpy.Environment()
    (condition,) = spec["matchConditions"]
    variables = [(v["name"], env.program(env.compile(v["expression"]))) for v in spec["variables"]]
    validations = [env.program(env.compile(v["expression"])) for v in spec["validations"]]
    # Kubernetes' CEL strings library has list.join(separator); cel-python does not.
    extra: dict[str, Any] = {"join": lambda items, sep="": StringType(str(sep).join(str(i) for i in items))}
    messages = [env.program(env.compile(v["messageExpression"]), extra) for v in spec["validations"]]
    return env.program(env.compile(condition["expression"])), variables, validations, messages


VALIDATION = {
    "schedulerName": 0,
    "metadata": 1,
    "podSpec": 2,
    "tolerations": 3,
    "binding": 4,
    "nodeSpec": 5,
    "lockState": 6,
    "nodeStatus": 7,
    "event": 8,
}
MESSAGES: dict[int, str] = {}  # the last refusal's message, for the assertions below


def judge(
    operation: str, resource: str, old: JSON | None, new: JSON | None, sub: str = "", user: str = SCHEDULER
) -> Verdict:
    condition, variables, validations, messages = programs()
    kind = {"nodes": "Node", "events": "Event"}.get(resource, "Binding" if sub == "binding" else "Pod")
    request = {
        "operation": operation,
        "resource": {"group": "", "version": "v1", "resource": resource},
        "subResource": sub,
        "kind": {"kind": kind},
        "namespace": "" if resource == "nodes" else "ml",
        "name": "x",
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
    }
    activation: JSON = {
        "object": json_to_cel(new),
        "oldObject": json_to_cel(old),
        "request": json_to_cel(request),
    }
    matched = evaluate(condition, activation)
    assert isinstance(matched, BoolType), f"CEL error in the match condition: {matched!r}"
    if not matched:
        return Verdict(False, ())
    values: dict[StringType, Any] = {}
    for name, program in variables:
        activation["variables"] = MapType(values)
        values[StringType(name)] = evaluate(program, activation)
    activation["variables"] = MapType(values)
    failed = tuple(i for i, v in enumerate(validations) if evaluate(v, activation) != BoolType(True))
    for i in failed:
        message = evaluate(messages[i], activation)
        assert isinstance(message, str), f"validation {i}'s message is a CEL error: {message!r}"
        MESSAGES[i] = str(message)
    return Verdict(True, failed)


def refused_by(verdict: Verdict, rule: str, says: str = "") -> None:
    index = VALIDATION[rule]
    assert verdict.matched and verdict.failed == (index,), verdict
    assert says in MESSAGES[index], MESSAGES[index]


def patched(obj: JSON, ops: list[JSON] | None) -> JSON:
    """The object after a JSON patch, as the apiserver applies it (its json-patch lets a `test`
    for null pass on a member that is not there; python's jsonpatch does not)."""
    assert ops is not None
    new: JSON = jsonpatch.apply_patch(obj, [op for op in ops if op != {**op, "op": "test", "value": None}])
    return new


def test_the_fence_names_the_scheduler_the_deployment_runs() -> None:
    spec = next(d for d in documents() if d["kind"] == "ValidatingAdmissionPolicy")["spec"]
    (condition,) = spec["matchConditions"]
    assert f"'{SCHEDULER}'" in condition["expression"]
    written = next(v["expression"] for v in spec["variables"] if v["name"] == "schedulerName")
    deployment = next(d for d in documents() if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert written == f"'{env['QUORUM_SUNK_SCHEDULER_NAME']}'" == f"'{NAME}'"
    (binding,) = [d for d in documents() if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": "quorum-sunk-scheduler-fence", "validationActions": ["Deny"]}


# -- pods -----------------------------------------------------------------------------------------

OTHER_TOLERATIONS: list[JSON] = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": model.LOCK, "operator": "Exists", "effect": "NoSchedule"},  # not the lock's effect
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
]


@st.composite
def our_pods(draw: st.DrawFn) -> JSON:
    spec: JSON = {
        "schedulerName": NAME,
        "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
    }
    tolerations: list[JSON] = draw(st.lists(st.sampled_from(OTHER_TOLERATIONS), unique_by=lambda t: t["key"]))
    empty_list: bool = draw(st.booleans())
    if tolerations or empty_list:
        spec["tolerations"] = tolerations
    if draw(st.booleans()):
        spec["nodeSelector"] = {"pool": "gpu"}
    meta: JSON = {"name": "x", "namespace": "ml", "uid": "u-1"}
    if draw(st.booleans()):
        meta["labels"] = {"app": "infer"}
    if draw(st.booleans()):
        meta["annotations"] = {model.PARTITION: "gpu"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def with_lock(pod: JSON) -> JSON:
    return patched(pod, api.toleration_patch(pod, model.LOCK_TOLERATION))


@settings(max_examples=150, deadline=None)
@given(our_pods())
def test_the_lock_toleration_the_scheduler_adds_passes(pod: JSON) -> None:
    assert judge("UPDATE", "pods", pod, with_lock(pod)) == Verdict(True, ())


POD_CHANGES: dict[str, tuple[Callable[[JSON], object], str, str]] = {
    "label": (lambda p: p["metadata"].setdefault("labels", {}).update(team="x"), "metadata", "the labels"),
    "annotation": (
        lambda p: p["metadata"].setdefault("annotations", {}).update({model.JOB_ID: "7"}),
        "metadata",
        "the annotations",
    ),
    "owner": (
        lambda p: p["metadata"].update(ownerReferences=[{"kind": "Job", "name": "j", "uid": "j"}]),
        "metadata",
        "ownerReferences",
    ),
    "image": (
        lambda p: p["spec"]["containers"][0].update(image="evil.example.com/miner"),
        "podSpec",
        "spec.containers",
    ),
    "deadline": (lambda p: p["spec"].update(activeDeadlineSeconds=1), "podSpec", "activeDeadlineSeconds"),
    "node selector": (
        lambda p: p["spec"].setdefault("nodeSelector", {}).update(evil="1"),
        "podSpec",
        "spec.nodeSelector",
    ),
    "another toleration": (
        lambda p: p["spec"]["tolerations"].append({"operator": "Exists"}),
        "tolerations",
        "only sunk.coreweave.com/lock",
    ),
    "the lock twice": (
        lambda p: p["spec"]["tolerations"].append(dict(model.LOCK_TOLERATION)),
        "tolerations",
        "once",
    ),
    "the lock for a while": (
        lambda p: p["spec"]["tolerations"][-1].update(tolerationSeconds=3600),
        "tolerations",
        "only sunk.coreweave.com/lock",
    ),
    "a toleration dropped": (
        lambda p: p["spec"]["tolerations"].pop(0),
        "tolerations",
        "only sunk.coreweave.com/lock",
    ),
}


@settings(max_examples=150, deadline=None)
@given(our_pods(), st.sampled_from(sorted(POD_CHANGES)))
def test_any_other_change_to_a_pod_is_refused_and_says_what(pod: JSON, change: str) -> None:
    mutate, rule, says = POD_CHANGES[change]
    new = with_lock(pod)
    if change == "a toleration dropped" and len(new["spec"]["tolerations"]) < 2:
        return  # nothing of its own to drop
    mutate(new)
    refused_by(judge("UPDATE", "pods", pod, new), rule, says)


def test_only_its_own_pods_are_changed_or_deleted() -> None:
    theirs = {
        "metadata": {"name": "x", "uid": "u"},
        "spec": {"schedulerName": "default-scheduler", "containers": []},
    }
    refused_by(judge("DELETE", "pods", theirs, None), "schedulerName", "has schedulerName default-scheduler")
    refused_by(
        judge("UPDATE", "pods", theirs, with_lock(theirs)), "schedulerName", f"spec.schedulerName {NAME}"
    )
    unnamed = {"metadata": {"name": "x"}, "spec": {"containers": []}}  # the apiserver's default
    refused_by(judge("DELETE", "pods", unnamed, None), "schedulerName", "default-scheduler")
    ours = {"metadata": {"name": "x"}, "spec": {"schedulerName": NAME, "containers": []}}
    assert judge("DELETE", "pods", ours, None) == Verdict(True, ())


def test_a_binding_may_record_the_job_and_nothing_else() -> None:
    pod = {"metadata": {"name": "x", "namespace": "ml", "uid": "u-1"}}
    ok = api.binding(pod, "gpu-001", 4242)
    assert judge("CREATE", "pods", None, ok, sub="binding") == Verdict(True, ())
    zoned = copy.deepcopy(ok)  # what the PodTopologyLabels admission plugin adds
    zoned["metadata"]["labels"] = {"topology.kubernetes.io/zone": "z1"}
    assert judge("CREATE", "pods", None, zoned, sub="binding") == Verdict(True, ())
    bare = copy.deepcopy(ok)
    del bare["metadata"]["annotations"]
    assert judge("CREATE", "pods", None, bare, sub="binding") == Verdict(True, ())
    changes: list[Callable[[JSON], object]] = [
        lambda b: b["metadata"]["annotations"].update(note="x"),
        lambda b: b["metadata"]["annotations"].update({model.JOB_ID: "4242; rm"}),
        lambda b: b["metadata"].update(labels={"team": "x"}),
    ]
    for mutate in changes:
        changed = copy.deepcopy(ok)
        mutate(changed)
        refused_by(
            judge("CREATE", "pods", None, changed, sub="binding"), "binding", "sunk.coreweave.com/job-id"
        )


# -- nodes ----------------------------------------------------------------------------------------

FOREIGN = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}


@st.composite
def nodes(draw: st.DrawFn) -> JSON:
    meta: JSON = {"name": "gpu-001", "labels": {"quorum.dev/slurm-node": "true"}}
    annotations = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "kwok.x-k8s.io/node": st.just("fake"),
                model.LOCK: st.sampled_from(model.LOCK_STATES),
                model.DRAIN_ANNOTATION: st.just("bad DIMM"),
            },
        )
    )
    if annotations:
        meta["annotations"] = annotations
    spec: JSON = {"providerID": "kwok://gpu-001"}
    taints = draw(st.lists(st.sampled_from([FOREIGN, model.LOCK_TAINT]), unique_by=lambda t: t["key"]))
    if taints:
        spec["taints"] = taints
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec}


@settings(max_examples=150, deadline=None)
@given(nodes(), st.sampled_from(model.LOCK_STATES), st.sampled_from(["", "drained by an admin"]))
def test_the_lock_and_drain_writes_pass(node: JSON, state: str, reason: str) -> None:
    ops = model.lock_patch(node, state)
    if ops is not None:
        assert judge("UPDATE", "nodes", node, patched(node, ops)) == Verdict(True, ())
    if reason or model.DRAIN_ANNOTATION in (node["metadata"].get("annotations") or {}):
        shown = patched(node, model.drain_annotation_patch(node, reason))
        assert judge("UPDATE", "nodes", node, shown) == Verdict(True, ())


NODE_CHANGES: dict[str, tuple[Callable[[JSON], object], str, str]] = {
    "another taint": (
        lambda n: n["spec"].setdefault("taints", []).append({"key": "evil", "effect": "NoExecute"}),
        "nodeSpec",
        "spec.taints",
    ),
    "the lock as NoSchedule": (
        lambda n: n["spec"].update(taints=[{**model.LOCK_TAINT, "effect": "NoSchedule"}]),
        "nodeSpec",
        "sunk.coreweave.com/lock taint (true, NoExecute)",
    ),
    "cordon": (lambda n: n["spec"].update(unschedulable=True), "nodeSpec", "spec.unschedulable"),
    "provider": (lambda n: n["spec"].update(providerID="aws://x"), "nodeSpec", "spec.providerID"),
    "label": (lambda n: n["metadata"]["labels"].update(pool="evil"), "metadata", "the labels of Node x ("),
    "annotation": (
        lambda n: n["metadata"].setdefault("annotations", {}).update(note="x"),
        "metadata",
        "the annotations",
    ),
    "lock state": (
        lambda n: n["metadata"].setdefault("annotations", {}).update({model.LOCK: "open"}),
        "lockState",
        "only to a lock state",
    ),
}


@settings(max_examples=150, deadline=None)
@given(nodes(), st.sampled_from(sorted(NODE_CHANGES)))
def test_any_other_change_to_a_node_is_refused_and_says_what(node: JSON, change: str) -> None:
    mutate, rule, says = NODE_CHANGES[change]
    new = copy.deepcopy(node)
    mutate(new)
    refused_by(judge("UPDATE", "nodes", node, new), rule, says)


def with_condition(node: JSON, condition: JSON) -> JSON:
    """The strategic merge by type the scheduler's status patch makes."""
    new = copy.deepcopy(node)
    conditions = [c for c in new["status"]["conditions"] if c["type"] != condition["type"]]
    new["status"]["conditions"] = [*conditions, condition]
    return new


def test_a_nodes_status_may_change_only_in_its_slurm_cordon_condition() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    node = {
        "metadata": {"name": "gpu-001", "labels": {"a": "b"}},
        "spec": {},
        "status": {"conditions": [ready], "capacity": {"nvidia.com/gpu": "8"}, "phase": "Running"},
    }
    condition = model.cordon_condition(node, ("SlurmDrain", "bad DIMM"), "2026-11-25T10:00:00Z")
    assert condition is not None
    cordoned = with_condition(node, condition)
    assert judge("UPDATE", "nodes", node, cordoned, sub="status") == Verdict(True, ())
    lifted = model.cordon_condition(cordoned, None, "2026-11-25T10:05:00Z")
    assert lifted is not None
    assert judge("UPDATE", "nodes", cordoned, with_condition(cordoned, lifted), sub="status") == Verdict(
        True, ()
    )
    not_ready = with_condition(node, {**ready, "status": "False"})
    refused_by(judge("UPDATE", "nodes", node, not_ready, sub="status"), "nodeStatus", "status.conditions")
    more = copy.deepcopy(cordoned)
    more["status"]["capacity"]["nvidia.com/gpu"] = "64"
    refused_by(judge("UPDATE", "nodes", node, more, sub="status"), "nodeStatus", "status.capacity")
    relabelled = copy.deepcopy(cordoned)
    relabelled["metadata"]["labels"]["node.coreweave.cloud/state"] = "production"
    refused_by(judge("UPDATE", "nodes", node, relabelled, sub="status"), "metadata", "the labels")


# -- events, and everyone else --------------------------------------------------------------------


def event(kind: str = "Pod", component: str = "quorum-sunk-scheduler") -> JSON:
    """What quorum.k8s.writes.post_event creates for the scheduler."""
    return {
        "metadata": {"generateName": "x.", "namespace": "ml"},
        "involvedObject": {"apiVersion": "v1", "kind": kind, "name": "x", "namespace": "ml", "uid": "u"},
        "reason": "SlurmJobSubmitted",
        "message": "placeholder Slurm job 7 submitted for this pod",
        "type": "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
    }


def test_events_only_about_pods_and_as_itself() -> None:
    assert judge("CREATE", "events", None, event()) == Verdict(True, ())
    refused_by(judge("CREATE", "events", None, event(kind="Node")), "event", "only about pods")
    refused_by(judge("CREATE", "events", None, event(component="kubelet")), "event", "only about pods")


def test_nobody_else_is_fenced_by_it() -> None:
    theirs = {"metadata": {"name": "x"}, "spec": {"schedulerName": "default-scheduler", "containers": []}}
    for user in ("system:serviceaccount:quorum-system:quorum-operator", "system:kube-scheduler", "alice"):
        assert judge("DELETE", "pods", theirs, None, user=user) == Verdict(False, ())
