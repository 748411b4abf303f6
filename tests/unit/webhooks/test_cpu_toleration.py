from __future__ import annotations

import pytest

from quorum.webhooks.patch import AddToleration, apply_patch, build_patch
from quorum.webhooks.policies.cpu_toleration import mutate, requests_accelerator
from quorum.webhooks.settings import WebhookSettings
from tests.unit.webhooks.factories import gpu_container, pod, request

SETTINGS = WebhookSettings()
CPU_TOLERATION = {"key": "is_cpu_compute", "operator": "Exists", "effect": "NoSchedule"}


def test_cpu_pod_gets_the_toleration() -> None:
    decision = mutate(request("Pod", pod()), SETTINGS)
    assert decision.allowed
    assert decision.intents == [AddToleration.of(CPU_TOLERATION)]


@pytest.mark.parametrize(
    "spec",
    [
        {"containers": [gpu_container()]},
        {"containers": [gpu_container(section="requests")]},
        {"containers": [{"name": "c", "image": "i"}], "initContainers": [gpu_container()]},
        {"containers": [gpu_container(resource="sunk.coreweave.com/accelerator")]},
        {
            "containers": [{"name": "c", "image": "i"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "a"}],
        },
        {"containers": [{"name": "c", "image": "i"}], "resources": {"limits": {"nvidia.com/gpu": "2"}}},
    ],
)
def test_accelerated_pods_are_untouched(spec: dict) -> None:  # type: ignore[type-arg]
    assert mutate(request("Pod", pod(**spec)), SETTINGS).intents == []


def test_zero_gpus_is_no_gpu() -> None:
    assert not requests_accelerator({"containers": [gpu_container("0")]}, SETTINGS)


def test_resource_claims_can_be_counted_as_cpu() -> None:
    settings = WebhookSettings(resource_claims_are_accelerated=False)
    spec = {"containers": [{"name": "c"}], "resourceClaims": [{"name": "x"}]}
    assert not requests_accelerator(spec, settings)


def test_other_accelerators_come_from_settings() -> None:
    settings = WebhookSettings(accelerator_resources=("amd.com/gpu",))
    assert requests_accelerator({"containers": [gpu_container(resource="amd.com/gpu")]}, settings)
    assert not requests_accelerator({"containers": [gpu_container()]}, settings)


@pytest.mark.parametrize(
    "existing",
    [
        CPU_TOLERATION,
        {"key": "is_cpu_compute", "operator": "Exists"},  # any effect
        {"operator": "Exists"},  # tolerates everything
    ],
)
def test_no_duplicate_when_already_tolerated(existing: dict) -> None:  # type: ignore[type-arg]
    assert mutate(request("Pod", pod(tolerations=[existing])), SETTINGS).intents == []


def test_an_equal_toleration_is_not_enough() -> None:
    # operator Equal with some value does not tolerate every value of the taint
    existing = {"key": "is_cpu_compute", "operator": "Equal", "value": "x", "effect": "NoSchedule"}
    assert mutate(request("Pod", pod(tolerations=[existing])), SETTINGS).intents != []


def test_patch_adds_the_list_or_appends_and_is_idempotent() -> None:
    for obj in (pod(), pod(tolerations=[{"key": "a", "operator": "Exists"}])):
        intents = mutate(request("Pod", obj), SETTINGS).intents
        patched = apply_patch(obj, build_patch(obj, intents))
        assert CPU_TOLERATION in patched["spec"]["tolerations"]
        assert mutate(request("Pod", patched), SETTINGS).intents == []
        assert build_patch(patched, intents) == []


def test_only_create_is_mutated() -> None:
    assert mutate(request("Pod", pod(), pod(), operation="UPDATE"), SETTINGS).intents == []
