from __future__ import annotations

import copy
from typing import Any

import pytest

from quorum.core.gangs import LABEL_GANG_MIN_AVAILABLE, LABEL_GANG_NAME
from quorum.install import DEFAULT_NAMESPACE, operator_username
from quorum.webhooks.patch import (
    AddSchedulingGate,
    SetAnnotation,
    SetLabel,
    SetSchedulerName,
    apply_patch,
    build_patch,
)
from quorum.webhooks.policies import gang_gate, ordered_statefulset, quorum_labels
from quorum.webhooks.registry import WEBHOOKS
from quorum.webhooks.server import evaluate
from quorum.webhooks.settings import WebhookSettings
from tests.unit.webhooks.factories import pod, request, workload

SETTINGS = WebhookSettings()
OPERATOR = operator_username(DEFAULT_NAMESPACE)


def seed_pod(**spec: Any) -> dict[str, Any]:
    return pod(
        {"app": "pause", "pod-group.scheduling.sigs.k8s.io": "pg1"}, schedulerName="cw-coscheduler", **spec
    )


def test_seed_001_pod_is_gated_labelled_and_rewritten() -> None:
    decision = gang_gate.mutate(request("Pod", seed_pod()), SETTINGS)
    assert decision.allowed
    assert decision.intents == [
        SetSchedulerName("default-scheduler"),
        SetAnnotation("quorum.dev/requested-scheduler", "cw-coscheduler"),
        AddSchedulingGate("quorum.dev/gang"),
        SetLabel("quorum.dev/gang", "pg-pg1"),
    ]


@pytest.mark.parametrize(
    ("labels", "spec", "gang"),
    [
        ({"scheduling.x-k8s.io/pod-group": "a"}, {}, "xpg-a"),
        (
            {
                "pod-group.scheduling.sigs.k8s.io/name": "Job_1",
                "pod-group.scheduling.sigs.k8s.io/min-available": "2",
            },
            {"schedulerName": "coscheduler"},
            None,
        ),
        ({}, {"schedulingGroup": {"podGroupName": "workers"}}, "wpg-workers"),
    ],
)
def test_every_kind_of_gang_pod_is_gated(
    labels: dict[str, str], spec: dict[str, Any], gang: str | None
) -> None:
    decision = gang_gate.mutate(request("Pod", pod(labels, **spec)), SETTINGS)
    assert AddSchedulingGate("quorum.dev/gang") in decision.intents
    label = next(i for i in decision.intents if isinstance(i, SetLabel))
    if gang:
        assert label.value == gang
    else:  # "Job_1" is not a valid label value: sanitised, with a hash
        assert label.value.startswith("lbl-job-1-") and len(label.value) <= 63


def test_coscheduler_pod_without_group_is_rewritten_not_gated() -> None:
    decision = gang_gate.mutate(request("Pod", pod({"app": "x"}, schedulerName="coscheduler")), SETTINGS)
    assert decision.intents == [
        SetSchedulerName("default-scheduler"),
        SetAnnotation("quorum.dev/requested-scheduler", "coscheduler"),
    ]


def test_other_schedulers_pods_are_not_touched() -> None:
    other = pod({"pod-group.scheduling.sigs.k8s.io": "pg1"}, schedulerName="volcano")
    assert gang_gate.mutate(request("Pod", other), SETTINGS).intents == []


def test_gang_pod_with_node_name_is_denied_with_the_reason() -> None:
    decision = gang_gate.mutate(request("Pod", seed_pod(nodeName="gpu-1")), SETTINGS)
    assert not decision.allowed
    assert decision.denied is not None
    assert "spec.nodeName='gpu-1'" in decision.denied and "nodeSelector" in decision.denied


def test_two_markers_first_row_wins_with_a_warning() -> None:
    both = pod({"scheduling.x-k8s.io/pod-group": "b", "pod-group.scheduling.sigs.k8s.io": "a"})
    decision = gang_gate.mutate(request("Pod", both), SETTINGS)
    assert SetLabel("quorum.dev/gang", "pg-a") in decision.intents
    assert "ignores PodGroup b (scheduling.x-k8s.io)" in decision.warnings[0]


def test_whole_mutating_webhook_is_idempotent_and_one_patch() -> None:
    webhook = next(w for w in WEBHOOKS if w.name == "mutate-pods")
    obj = seed_pod()
    decision = evaluate(webhook, request("Pod", obj), SETTINGS)
    ops = build_patch(obj, decision.intents)
    assert sum(1 for op in ops if op["path"] == "/metadata/annotations") == 1
    patched = apply_patch(obj, ops)
    assert patched["spec"]["schedulingGates"] == [{"name": "quorum.dev/gang"}]
    assert patched["spec"]["schedulerName"] == "default-scheduler"
    assert {"key": "is_cpu_compute", "operator": "Exists", "effect": "NoSchedule"} in patched["spec"][
        "tolerations"
    ]
    again = evaluate(webhook, request("Pod", patched), SETTINGS)
    assert build_patch(patched, again.intents) == []
    # and the validating side accepts what the mutating side made
    assert quorum_labels.validate(request("Pod", patched), SETTINGS).allowed


def test_user_set_quorum_labels_are_denied_on_create() -> None:
    forged = pod({"quorum.dev/gang": "pg-other", "pod-group.scheduling.sigs.k8s.io": "pg1"})
    decision = quorum_labels.validate(request("Pod", forged), SETTINGS)
    assert (
        not decision.allowed
        and decision.denied is not None
        and "quorum.dev/gang='pg-other'" in decision.denied
    )
    stray = pod({"app": "x"})
    stray["metadata"]["annotations"] = {"quorum.dev/anything": "1"}
    assert not quorum_labels.validate(request("Pod", stray), SETTINGS).allowed


def test_quorum_labels_change_only_by_the_operator() -> None:
    old = pod({"quorum.dev/gang": "pg-pg1", "pod-group.scheduling.sigs.k8s.io": "pg1"})
    new = pod({"pod-group.scheduling.sigs.k8s.io": "pg1"})
    assert not quorum_labels.validate(request("Pod", new, old, operation="UPDATE"), SETTINGS).allowed
    assert quorum_labels.validate(
        request("Pod", new, old, operation="UPDATE", user=OPERATOR), SETTINGS
    ).allowed
    same = pod({"quorum.dev/gang": "pg-pg1", "pod-group.scheduling.sigs.k8s.io": "pg1", "x": "y"})
    assert quorum_labels.validate(request("Pod", same, old, operation="UPDATE"), SETTINGS).allowed


@pytest.mark.parametrize("kind", ["Deployment", "Job", "StatefulSet", "CronJob"])
def test_workload_templates_may_not_carry_quorum_labels(kind: str) -> None:
    decision = quorum_labels.validate(request(kind, workload(kind, {"quorum.dev/gang": "x"})), SETTINGS)
    assert not decision.allowed and decision.denied is not None and "pod template" in decision.denied


def test_a_template_quorum_key_is_judged_when_added_or_changed_not_when_kept_or_removed() -> None:
    old = workload("Deployment", {"quorum.dev/gang": "x", "app": "a"})
    kept = workload("Deployment", {"quorum.dev/gang": "x", "app": "b"})
    changed = workload("Deployment", {"quorum.dev/gang": "y", "app": "a"})
    removed = workload("Deployment", {"app": "a"})
    assert quorum_labels.validate(request("Deployment", kept, old, operation="UPDATE"), SETTINGS).allowed
    assert quorum_labels.validate(request("Deployment", removed, old, operation="UPDATE"), SETTINGS).allowed
    assert not quorum_labels.validate(
        request("Deployment", changed, old, operation="UPDATE"), SETTINGS
    ).allowed


def test_ordered_ready_statefulset_gang_warns() -> None:
    sts = workload("StatefulSet", {"pod-group.scheduling.sigs.k8s.io": "pg1"}, replicas=4)
    decision = ordered_statefulset.validate(request("StatefulSet", sts), SETTINGS)
    assert "Parallel" in decision.warnings[0]
    parallel = workload(
        "StatefulSet", {"pod-group.scheduling.sigs.k8s.io": "pg1"}, replicas=4, podManagementPolicy="Parallel"
    )
    assert ordered_statefulset.validate(request("StatefulSet", parallel), SETTINGS).warnings == []
    plain = workload("StatefulSet", {"app": "db"}, replicas=3)
    assert ordered_statefulset.validate(request("StatefulSet", plain), SETTINGS).warnings == []


def test_a_forged_gang_label_is_denied_not_overwritten() -> None:
    forged = pod({"pod-group.scheduling.sigs.k8s.io": "pg1", "quorum.dev/gang": "pg-other"})
    decision = gang_gate.mutate(request("Pod", forged), SETTINGS)
    assert not decision.allowed and decision.denied is not None
    assert "quorum.dev/gang='pg-other'" in decision.denied
    lone = pod({"quorum.dev/gang": "pg-x"})
    assert not gang_gate.mutate(request("Pod", lone), SETTINGS).allowed
    fake_annotation = pod({"app": "x"})
    fake_annotation["metadata"]["annotations"] = {"quorum.dev/requested-scheduler": "volcano"}
    assert not gang_gate.mutate(request("Pod", fake_annotation), SETTINGS).allowed


def test_a_gang_label_for_a_dropped_scheduling_group_is_accepted() -> None:
    # GenericWorkload off: the apiserver drops spec.schedulingGroup after the mutating webhook.
    dropped = pod({"quorum.dev/gang": "wpg-workers"}, schedulingGates=[{"name": "quorum.dev/gang"}])
    assert quorum_labels.validate(request("Pod", dropped), SETTINGS).allowed
    assert not quorum_labels.validate(request("Pod", pod({"quorum.dev/gang": "pg-x"})), SETTINGS).allowed
    # Ungated, the same label is a claim on another gang of the namespace: refused.
    claim = pod({"quorum.dev/gang": "wpg-workers"})
    assert not quorum_labels.validate(request("Pod", claim), SETTINGS).allowed


def template_of(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    found: dict[str, Any] = (
        spec["jobTemplate"]["spec"]["template"] if "jobTemplate" in spec else spec["template"]
    )
    return found


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "Job", "CronJob"])
def test_the_member_loss_policy_is_the_tenants_to_set_on_pods_and_templates(kind: str) -> None:
    """A label-only gang says its member-loss policy on its pods (docs/lifecycle.md): the one
    quorum.dev key a tenant sets; any other beside it is still refused."""
    labels = {LABEL_GANG_NAME: "mpi", LABEL_GANG_MIN_AVAILABLE: "2"}
    chosen = {"quorum.dev/member-loss-policy": "RestartGang"}
    if kind == "Pod":
        obj = pod(labels)
        obj["metadata"]["annotations"] = dict(chosen)
        changed = pod(labels)
        changed["metadata"]["annotations"] = {"quorum.dev/member-loss-policy": "Replace"}
        assert quorum_labels.validate(request("Pod", changed, obj, operation="UPDATE"), SETTINGS).allowed
        forged = pod(labels)
        forged["metadata"]["annotations"] = {**chosen, "quorum.dev/preemptible": "false"}
    else:
        obj = workload(kind, labels)
        template_of(obj)["metadata"]["annotations"] = dict(chosen)
        forged = copy.deepcopy(obj)
        template_of(forged)["metadata"]["annotations"]["quorum.dev/preemptible"] = "false"
    assert quorum_labels.validate(request(kind, obj), SETTINGS).allowed
    decision = quorum_labels.validate(request(kind, forged), SETTINGS)
    assert not decision.allowed and "quorum.dev/preemptible" in (decision.denied or "")


VOLCANO = WebhookSettings(
    coscheduler_names=("cw-coscheduler", "coscheduler", "scheduler-plugins-scheduler", "volcano")
)


def volcano_pod(scheduler: str = "volcano") -> dict[str, Any]:
    """A pod as LeaderWorkerSet's Volcano provider makes it: the group annotation, schedulerName
    volcano from the LeaderWorkerSet's template."""
    made = pod({"leaderworkerset.sigs.k8s.io/name": "lws"}, schedulerName=scheduler)
    made["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "lws-0-5d8f7"}
    return made


def test_volcano_pods_are_gangs_only_where_the_install_takes_volcanos_dialect() -> None:
    taken = gang_gate.mutate(request("Pod", volcano_pod()), VOLCANO)
    assert taken.intents == [
        SetSchedulerName("default-scheduler"),
        SetAnnotation("quorum.dev/requested-scheduler", "volcano"),
        AddSchedulingGate("quorum.dev/gang"),
        SetLabel("quorum.dev/gang", "vpg-lws-0-5d8f7"),
    ]
    # By default `volcano` is another scheduler's, and the annotation marks nothing: a pod that
    # asks for the default scheduler with it is not held for a PodGroup the cluster may not serve.
    assert gang_gate.mutate(request("Pod", volcano_pod()), SETTINGS).intents == []
    assert gang_gate.mutate(request("Pod", volcano_pod("default-scheduler")), SETTINGS).intents == []
    assert (
        AddSchedulingGate("quorum.dev/gang")
        in gang_gate.mutate(request("Pod", volcano_pod("default-scheduler")), VOLCANO).intents
    )


def test_a_non_default_coscheduler_name_is_taken_and_the_defaults_are_not() -> None:
    """The one list: with coscheduler_names ["gang-scheduler"], only that name is rewritten."""
    own = WebhookSettings(coscheduler_names=("gang-scheduler",))
    renamed = pod({"pod-group.scheduling.sigs.k8s.io": "pg1"}, schedulerName="gang-scheduler")
    taken = gang_gate.mutate(request("Pod", renamed), own)
    assert SetSchedulerName("default-scheduler") in taken.intents
    assert AddSchedulingGate("quorum.dev/gang") in taken.intents
    assert gang_gate.mutate(request("Pod", seed_pod()), own).intents == []  # cw-coscheduler: another's


def kueue_pod(count: str | None = "3") -> dict[str, Any]:
    """A pod of a Kueue plain-pod group as Kueue's documentation writes it: the queue and group
    labels, and the group's size in the total-count annotation."""
    made = pod({"kueue.x-k8s.io/queue-name": "user-queue", "kueue.x-k8s.io/pod-group-name": "sample"})
    made["metadata"]["annotations"] = {} if count is None else {"kueue.x-k8s.io/pod-group-total-count": count}
    return made


def test_a_kueue_pod_group_is_a_gang_sized_by_its_total_count() -> None:
    taken = gang_gate.mutate(request("Pod", kueue_pod()), SETTINGS)
    assert taken.intents == [AddSchedulingGate("quorum.dev/gang"), SetLabel("quorum.dev/gang", "kpg-sample")]
    for count, said in ((None, "is missing"), ("04", "is '04'"), ("0", "is '0'")):
        denied = gang_gate.mutate(request("Pod", kueue_pod(count)), SETTINGS).denied
        assert denied is not None and "Kueue pod group sample (gang kpg-sample)" in denied, denied
        assert f"annotation kueue.x-k8s.io/pod-group-total-count {said}" in denied, denied
    # A group Kueue admits pod by pod (its StatefulSets') is not a gang: nothing to hold.
    fast = kueue_pod()
    fast["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-fast-admission"] = "true"
    assert gang_gate.mutate(request("Pod", fast), SETTINGS).intents == []
    # quorum's own label group comes first where a pod names both.
    both = kueue_pod()
    both["metadata"]["labels"] |= {LABEL_GANG_NAME: "mine", LABEL_GANG_MIN_AVAILABLE: "3"}
    decided = gang_gate.mutate(request("Pod", both), SETTINGS)
    assert SetLabel("quorum.dev/gang", "lbl-mine") in decided.intents
    assert any("ignores Kueue pod group sample" in w for w in decided.warnings), decided.warnings
