"""API objects to planner models, and the release patch (plain data)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.model import milli
from quorum.k8s.convert import node_from_api, pod_from_api, pod_requests
from quorum.k8s.writes import discard, release_patch


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


def test_node_model_pins_by_the_hostname_label() -> None:
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
    assert node.hostname == "host-1" and node.unschedulable and node.ready
    assert node.allocatable["nvidia.com/gpu"] == 8000


def test_release_patch_tests_uid_and_gate_and_adds_the_whole_selector() -> None:
    pod = api_pod(schedulingGates=[{"name": "example.com/other"}, {"name": "quorum.dev/gang"}])
    assert release_patch(pod, "host-1") == [
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": "quorum.dev/gang"},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
        {"op": "add", "path": "/spec/nodeSelector", "value": {"kubernetes.io/hostname": "host-1"}},
    ]


def test_release_patch_adds_a_key_to_an_existing_selector_or_tests_the_users_own() -> None:
    pod = api_pod(schedulingGates=[{"name": "quorum.dev/gang"}], nodeSelector={"pool": "a"})
    assert (release_patch(pod, "h") or [])[-1] == {
        "op": "add",
        "path": "/spec/nodeSelector/kubernetes.io~1hostname",
        "value": "h",
    }
    pinned = api_pod(
        schedulingGates=[{"name": "quorum.dev/gang"}], nodeSelector={"kubernetes.io/hostname": "h"}
    )
    assert (release_patch(pinned, "h") or [])[-1] == {
        "op": "test",
        "path": "/spec/nodeSelector/kubernetes.io~1hostname",
        "value": "h",
    }
    assert release_patch(api_pod(), "h") is None, "no gate: nothing to release"
    assert len(release_patch(pod, None) or []) == 3, "no plan: the gate only"


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
