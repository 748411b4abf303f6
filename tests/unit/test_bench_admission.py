"""The admission benchmark's workload and report on plain data (`make bench-admission`)."""

from __future__ import annotations

import math
from itertools import groupby

from hypothesis import given
from hypothesis import strategies as st

from tests.bench.admission_load import (
    GANG_LABEL,
    GANG_SIZE,
    INTERRUPTABLE,
    PLUGIN,
    REQUEST,
    WEBHOOK,
    apiserver_report,
    mix,
    percentile,
    plan,
    round_order,
)
from tests.bench.histograms import Samples, total


def test_the_mix_of_2000_pods() -> None:
    assert mix(2000) == {"cpu": 800, "gpu": 480, "gang": 520, "interruptable": 200}


@given(st.integers(1, 3000))
def test_the_mix_adds_up_and_gangs_are_whole(pods: int) -> None:
    counts = mix(pods)
    assert sum(counts.values()) == pods
    assert counts["gang"] % GANG_SIZE == 0
    assert min(counts.values()) >= 0


def test_the_plan_has_the_mix_and_whole_gangs_in_one_namespace() -> None:
    pods = plan(500, "pod")
    assert len({p.name for p in pods}) == 500
    kinds = {kind: sum(1 for p in pods if p.kind == kind) for kind in ("cpu", "gpu", "gang", "interruptable")}
    assert kinds == mix(500)
    gang_runs = [
        list(run) for gang, run in groupby(pods, key=lambda p: p.body["metadata"]["labels"].get(GANG_LABEL))
    ]
    gangs = [run for run in gang_runs if run[0].kind == "gang"]
    assert len(gangs) == mix(500)["gang"] // GANG_SIZE  # each gang's pods one after another
    for run in gangs:
        assert len(run) == GANG_SIZE
        assert len({p.namespace for p in run}) == 1
        assert all(p.body["spec"]["schedulerName"] == "cw-coscheduler" for p in run)
    for p in pods:
        labels = p.body["metadata"]["labels"]
        assert (labels.get(INTERRUPTABLE) == "true") == (p.kind == "interruptable")
        if p.kind in ("cpu", "gpu", "gang"):
            assert p.cpu_only == (p.kind == "cpu")
    interruptable = [p for p in pods if p.kind == "interruptable"]
    assert sum(p.cpu_only for p in interruptable) == (len(interruptable) + 1) // 2  # half of them CPU pods


def test_the_plan_is_the_same_every_time_and_shuffled() -> None:
    assert plan(200, "pod") == plan(200, "pod")
    assert [p.kind for p in plan(200, "pod")] != sorted(p.kind for p in plan(200, "pod"))


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([5.0], 0.99) == 5.0
    assert math.isclose(percentile(list(map(float, range(101))), 0.99), 99.0)


def bucket(
    metric: str, le: str, value: float, **labels: str
) -> tuple[tuple[str, tuple[tuple[str, str], ...]], float]:
    return (f"{metric}_bucket", tuple(sorted({**labels, "le": le}.items()))), value


def test_the_report_sums_over_unnamed_labels_and_keeps_the_admission_plugins() -> None:
    window: Samples = dict(
        [
            bucket(WEBHOOK, "0.005", 3, name="pods.mutate.quorum.dev", operation="CREATE", rejected="false"),
            bucket(WEBHOOK, "+Inf", 4, name="pods.mutate.quorum.dev", operation="CREATE", rejected="false"),
            bucket(WEBHOOK, "0.005", 0, name="pods.mutate.quorum.dev", operation="CREATE", rejected="true"),
            bucket(WEBHOOK, "+Inf", 1, name="pods.mutate.quorum.dev", operation="CREATE", rejected="true"),
            bucket(PLUGIN, "0.005", 2, name="ValidatingAdmissionPolicy", operation="CREATE"),
            bucket(PLUGIN, "+Inf", 2, name="ValidatingAdmissionPolicy", operation="CREATE"),
            bucket(PLUGIN, "0.005", 2, name="LimitRanger", operation="CREATE"),
            bucket(PLUGIN, "+Inf", 2, name="LimitRanger", operation="CREATE"),
            bucket(REQUEST, "0.1", 7, verb="POST", resource="pods", subresource=""),
            bucket(REQUEST, "+Inf", 7, verb="POST", resource="pods", subresource=""),
            bucket(REQUEST, "0.1", 9, verb="POST", resource="pods", subresource="binding"),
            bucket(REQUEST, "+Inf", 9, verb="POST", resource="pods", subresource="binding"),
        ]
    )
    report = apiserver_report(total([window, {}]))
    assert report["webhooks"]["pods.mutate.quorum.dev CREATE"]["count"] == 5
    assert list(report["admission_plugins"]) == ["ValidatingAdmissionPolicy CREATE"]
    assert report["pod_create_request"]["POST"]["count"] == 7
    assert report["policy_checks"] == {}


def test_every_other_round_runs_the_ways_in_reverse_so_none_always_follows_the_same() -> None:
    ways = ("absent", "cks", "webhooks", "policies")
    assert round_order(ways, 1) == ways
    assert round_order(ways, 2) == ("policies", "webhooks", "cks", "absent")
    assert round_order(ways, 3) == ways
