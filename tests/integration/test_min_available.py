"""A label-only gang's `min-available` through the real apiserver: a pod whose value is not a
size from 1 to 100000 is refused at creation (the policy quorum-gang-pods, in the default way of
admitting pods), with what is wrong and what to write; a good value is created, held at quorum's
gate."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

pytestmark = pytest.mark.cluster

NAME = "pod-group.scheduling.sigs.k8s.io/name"
MIN = "pod-group.scheduling.sigs.k8s.io/min-available"
# Label values that are not sizes: refused by quorum's policy, with quorum's words.
BAD = ["abc", "0", "1e9", "1.5", "0x10", "01"]
# Not label values at all (" 3", 10,000 characters): the apiserver's own validation refuses them
# before any ValidatingAdmissionPolicy is asked (with `--pod-admission webhooks`, the mutating
# webhook, called before validation, refuses them with quorum's words instead).
NOT_LABEL_VALUES = ["-1", " 3", "9" * 10_000, "+2", "٣"]


def gang_pod(name: str, min_available: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {NAME: "trainers", MIN: min_available}},
        "spec": {
            "schedulerName": "cw-coscheduler",
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


async def test_the_apiserver_refuses_a_label_only_gang_pod_with_a_bad_min_available(
    customer_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(customer_api)
    for i, value in enumerate(BAD):
        with pytest.raises(ApiException) as refused:
            await core.create_namespaced_pod(namespace, gang_pod(f"bad-{i}", value))
        message = json.loads(refused.value.body)["message"]
        assert refused.value.status == 403, (value[:20], message)
        # Pods are admitted in the apiserver (the default way): the policy refuses, with the
        # webhook's words (tests/integration/test_pod_admission.py compares the two ways).
        assert "ValidatingAdmissionPolicy 'quorum-gang-pods'" in message, message
        assert "pod is a member of label group trainers (gang lbl-trainers), but label " in message
        assert f"{MIN} is {value[:20]!r}" in message
        assert "it must be a whole number from 1 to 100000" in message
        assert 'write "4" for a gang of four pods' in message
    for i, value in enumerate(NOT_LABEL_VALUES):
        with pytest.raises(ApiException) as refused:
            await core.create_namespaced_pod(namespace, gang_pod(f"invalid-{i}", value))
        assert refused.value.status == 422 and "metadata.labels: Invalid value" in str(refused.value.body)
    created = await core.create_namespaced_pod(namespace, gang_pod("good", "2"))
    assert [g.name for g in created.spec.scheduling_gates or []] == ["quorum.dev/gang"]
    assert created.metadata.labels["quorum.dev/gang"] == "lbl-trainers"
    assert (await core.list_namespaced_pod(namespace)).items[0].metadata.name == "good", "none of the others"
