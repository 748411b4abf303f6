from __future__ import annotations

import pytest

from quorum.webhooks.policies.interruptable import validate
from quorum.webhooks.settings import InterruptableOnGang, WebhookSettings
from tests.unit.webhooks.factories import pod, request, workload

SETTINGS = WebhookSettings()
KEY = "qos.coreweave.cloud/interruptable"
GANG = {"pod-group.scheduling.sigs.k8s.io": "pg1"}


@pytest.mark.parametrize("value", ["maybe", "True", "1", "", "yes"])
def test_values_other_than_true_false_are_denied(value: str) -> None:
    decision = validate(request("Pod", pod({KEY: value})), SETTINGS)
    assert not decision.allowed
    assert decision.denied is not None and '"true"' in decision.denied and '"false"' in decision.denied


@pytest.mark.parametrize("kind", ["Deployment", "Job", "CronJob", "StatefulSet"])
def test_true_on_a_gang_workload_warns(kind: str) -> None:
    decision = validate(request(kind, workload(kind, {KEY: "true", **GANG})), SETTINGS)
    assert decision.allowed
    assert len(decision.warnings) == 1
    assert "gang 'pg1'" in decision.warnings[0] and "checkpoint" in decision.warnings[0]


def test_true_on_a_statefulset_warns_about_databases() -> None:
    decision = validate(request("StatefulSet", workload("StatefulSet", {KEY: "true"})), SETTINGS)
    assert "database" in decision.warnings[0]


def test_true_on_a_parallel_job_warns() -> None:
    assert validate(request("Job", workload("Job", {KEY: "true"}, parallelism=4)), SETTINGS).warnings
    assert not validate(request("Job", workload("Job", {KEY: "true"}, parallelism=1)), SETTINGS).warnings


def test_true_on_an_inference_deployment_is_fine() -> None:
    decision = validate(request("Deployment", workload("Deployment", {KEY: "true"})), SETTINGS)
    assert decision.allowed and decision.warnings == []


def test_bare_gang_pod_warns_but_a_controllers_pod_does_not() -> None:
    bare = pod({KEY: "true", **GANG})
    assert validate(request("Pod", bare), SETTINGS).warnings
    owned = pod({KEY: "true", **GANG})
    owned["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "r", "controller": True}]
    assert validate(request("Pod", owned), SETTINGS).warnings == []


def test_gang_detection_follows_the_scheduler_name_and_workload_groups() -> None:
    other = workload("Deployment", {KEY: "true", **GANG}, pod={"schedulerName": "volcano"})
    assert validate(request("Deployment", other), SETTINGS).warnings == []
    was = workload("Deployment", {KEY: "true"}, pod={"schedulingGroup": {"podGroupName": "g"}})
    assert validate(request("Deployment", was), SETTINGS).warnings


def test_deny_mode() -> None:
    settings = WebhookSettings(interruptable_on_gang=InterruptableOnGang.DENY)
    decision = validate(request("Deployment", workload("Deployment", {KEY: "true", **GANG})), settings)
    assert not decision.allowed and decision.denied is not None and "gang" in decision.denied


def test_unchanged_value_on_update_is_not_judged_again() -> None:
    old = workload("StatefulSet", {KEY: "maybe"})
    new = workload("StatefulSet", {KEY: "maybe"})
    new["spec"]["replicas"] = 3
    assert validate(request("StatefulSet", new, old, operation="UPDATE"), SETTINGS).allowed


def test_a_controllers_object_is_judged_on_its_template_not_at_creation() -> None:
    owned = pod({"qos.coreweave.cloud/interruptable": "yes"})
    owned["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "r", "controller": True}]
    assert validate(request("Pod", owned), SETTINGS).allowed
    before = pod({"qos.coreweave.cloud/interruptable": "true"})
    before["metadata"]["ownerReferences"] = owned["metadata"]["ownerReferences"]
    changed = validate(request("Pod", owned, before, operation="UPDATE"), SETTINGS)
    assert changed.denied is not None and "'yes'" in changed.denied
