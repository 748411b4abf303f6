"""API objects to planner models, and the release patch (plain data)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.fit import FitSettings, why_not
from quorum.core.model import Node, milli
from quorum.k8s.convert import newer_or_same, node_from_api, pod_from_api, pod_requests
from quorum.k8s.writes import discard, pinned_node, release_patch
from tests.unit.fake_api import apply_json_patch


def api_pod(**spec: Any) -> dict[str, Any]:
    spec.setdefault("containers", [{"name": "c", "resources": {"requests": {"cpu": "1"}}}])
    return {"metadata": {"name": "p", "uid": "u1", "namespace": "ns"}, "spec": spec}


def test_requests_follow_kube_scheduler() -> None:
    pod = api_pod(
        containers=[
            {"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "8"}}}
        ],
        initContainers=[
            {"name": "setup", "resources": {"requests": {"cpu": "4"}}},
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
        ],
        overhead={"cpu": "100m"},
    )
    requests = pod_requests(pod)
    assert requests["cpu"] == milli("4") + milli("100m")  # the init container alone is the peak
    assert requests["nvidia.com/gpu"] == milli("8")  # a limit counts as the request
    assert requests["pods"] == 1000


def test_pod_model_keeps_constraints_and_notes_unmodeled_ones() -> None:
    pod = pod_from_api(
        api_pod(
            nodeSelector={"kubernetes.io/hostname": "n1"},
            tolerations=[{"key": "is_gpu", "operator": "Exists"}],
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                        ]
                    }
                },
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "x"}]},
            },
            topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "zone"}],
        )
    )
    assert pod.node_selector == {"kubernetes.io/hostname": "n1"}
    assert pod.tolerations[0].key == "is_gpu" and pod.tolerations[0].operator == "Exists"
    assert pod.affinity[0][0].matches({"zone": "a"}) and not pod.affinity[0][0].matches({"zone": "b"})
    assert pod.unmodeled == ("required pod anti-affinity", "topology spread constraints")


def test_node_model_keeps_taints_allocatable_and_state() -> None:
    node = node_from_api(
        {
            "metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "host-1"}},
            "spec": {
                "taints": [{"key": "is_gpu", "value": "true", "effect": "PreferNoSchedule"}],
                "unschedulable": True,
            },
            "status": {
                "allocatable": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    assert node.name == "node-1" and node.unschedulable and node.ready
    assert node.labels["kubernetes.io/hostname"] == "host-1"
    assert node.allocatable["nvidia.com/gpu"] == 8000
    assert node.taints[0].effect == "PreferNoSchedule"


PIN = {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def test_release_patch_tests_uid_and_gate_and_pins_by_node_name() -> None:
    pod = api_pod(schedulingGates=[{"name": "example.com/other"}, {"name": "quorum.dev/gang"}])
    assert release_patch(pod, "node-1") == [
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": "quorum.dev/gang"},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchFields": [PIN]}]}}},
        },
    ]
    assert release_patch(api_pod(), "node-1") is None, "no gate: nothing to release"
    assert len(release_patch(pod, None) or []) == 3, "no plan: the gate only"


def test_release_patch_sets_node_affinity_at_the_first_level_missing() -> None:
    gate = [{"name": "quorum.dev/gang"}]
    anti = api_pod(schedulingGates=gate, affinity={"podAntiAffinity": {"x": 1}})
    assert (release_patch(anti, "node-1") or [])[-1] == {
        "op": "add",
        "path": "/spec/affinity/nodeAffinity",
        "value": {REQUIRED: {"nodeSelectorTerms": [{"matchFields": [PIN]}]}},
    }
    preferred = api_pod(
        schedulingGates=gate,
        affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    )
    assert (release_patch(preferred, "node-1") or [])[-1] == {
        "op": "add",
        "path": f"/spec/affinity/nodeAffinity/{REQUIRED}",
        "value": {"nodeSelectorTerms": [{"matchFields": [PIN]}]},
    }


def test_the_pinned_node_is_read_back_from_the_pod() -> None:
    """What a new leader reserves for a pod released but not bound (the ledger's `resume`)."""
    gated = api_pod(schedulingGates=[{"name": "quorum.dev/gang"}])
    assert pinned_node(apply_json_patch(gated, release_patch(gated, "node-1") or [])["spec"]) == "node-1"
    assert pinned_node(api_pod()["spec"]) is None, "not pinned"
    rack = {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["a"]}]}
    pinned = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}
    cases = (([rack], None), ([rack, pinned], None), ([pinned, pinned], "node-2"), ([{}, pinned], "node-2"))
    for terms, want in cases:
        spec = {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}}
        assert pinned_node(spec) == want, terms


def test_release_patch_adds_the_pin_to_every_term_a_user_wrote() -> None:
    terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}]},
        {},  # matches no node, and may not gain a requirement
    ]
    pod = api_pod(
        schedulingGates=[{"name": "quorum.dev/gang"}],
        affinity={"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}},
    )
    base = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"
    assert (release_patch(pod, "node-1") or [])[3:] == [
        {"op": "add", "path": f"{base}/0/matchFields", "value": [PIN]},
        {"op": "add", "path": f"{base}/1/matchFields/-", "value": PIN},
    ]


async def test_a_write_whose_answer_is_not_parsed_still_raises_on_an_error_status() -> None:
    """`discard` skips the model of a write's answer; a refused write must still raise (a mock
    answer: a real apiserver's 409 comes only in a race)."""

    class Answer:
        def __init__(self, status: int) -> None:
            self.status, self.reason = status, "Conflict"

        async def read(self) -> bytes:
            return b'{"reason": "Conflict"}'

        def release(self) -> None:
            return None

    async def answer(status: int) -> Answer:
        return Answer(status)

    await discard(answer(200))
    with pytest.raises(ApiException) as caught:
        await discard(answer(409))
    assert caught.value.status == 409 and "Conflict" in str(caught.value.body)


NAMES = ["n0", "n1", "n2", "n3"]
requirements = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["zone", "rack"]),
        "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
        "values": st.lists(st.sampled_from(["a", "b"]), max_size=2),
    }
)
name_fields = st.fixed_dictionaries(
    {
        "key": st.just("metadata.name"),
        "operator": st.sampled_from(["In", "NotIn"]),
        "values": st.lists(st.sampled_from(NAMES), min_size=1, max_size=1),  # the API's rule
    }
)
terms = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "matchExpressions": st.lists(requirements, max_size=2),
            "matchFields": st.lists(name_fields, max_size=2),
        },
    ),
    max_size=3,
)
affinities: st.SearchStrategy[dict[str, Any] | None] = st.one_of(
    st.none(),
    st.just({"podAntiAffinity": {}}),
    terms.map(lambda t: {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": t}}}),
)
nodes = st.lists(
    st.tuples(
        st.sampled_from(NAMES),
        st.dictionaries(st.sampled_from(["zone", "rack"]), st.sampled_from(["a", "b"])),
    ),
    min_size=1,
    max_size=4,
)


@given(affinities, nodes, st.sampled_from(NAMES))
def test_a_pinned_pod_fits_only_its_node_and_only_where_it_fitted_before(
    affinity: dict[str, Any] | None, cluster: list[tuple[str, dict[str, str]]], target: str
) -> None:
    extra = {"affinity": affinity} if affinity is not None else {}
    before = api_pod(schedulingGates=[{"name": "quorum.dev/gang"}], **extra)
    after = apply_json_patch(before, release_patch(before, target) or [])
    settings = FitSettings(require_production=False)
    for name, labels in cluster:
        node = Node(name=name, labels=labels, allocatable={}, ready=True)
        fitted = why_not(pod_from_api(before), node, settings) is None
        fits = why_not(pod_from_api(after), node, settings) is None
        assert fits == (fitted and name == target), (name, labels, after["spec"].get("affinity"))
    # KEP-3838: existing terms only gain requirements, and an empty term none.
    old = ((affinity or {}).get("nodeAffinity") or {}).get(REQUIRED, {}).get("nodeSelectorTerms") or []
    new = after["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert not old or len(new) == len(old)
    for was, now in zip(old, new, strict=False):
        for key in ("matchExpressions", "matchFields"):
            assert now.get(key, [])[: len(was.get(key, []))] == was.get(key, [])
        if not was.get("matchExpressions") and not was.get("matchFields"):
            assert now == was
    # What a new leader reads back as the pod's promised node (the ledger's `resume`).
    assert pinned_node(after["spec"]) in (None, target)
    if not old:
        assert pinned_node(after["spec"]) == target


def test_resource_versions_compare_as_integers_or_not_at_all() -> None:
    assert newer_or_same("10", "9") and newer_or_same("9", "9") and not newer_or_same("9", "10")
    assert newer_or_same("123456789012345678901", "99") is True, "no limit on length"
    for odd in ("", "0", "012", "a1"):
        assert newer_or_same(odd, "5") is None and newer_or_same("5", odd) is None
