"""The platform's allow-list (QUORUM_SUNK_NAMESPACES): which partitions, accounts, QOS and
reservations a namespace's pods may name. Every job runs as one Slurm user, so this, not Slurm,
keeps a tenant to its own: a pod that asks for more is not submitted, and is told in words what
it asked, what its namespace may use and how to fix it, once until it changes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from devcluster import slurm as devslurm
from quorum.sunk import model
from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.settings import SunkSettings
from tests.unit.sunk.fakes import FakeSlurm, FakeSunkApi
from tests.unit.sunk.test_reconcile import pod, podgroup

GPU = model.Allowance(partitions=frozenset({"gpu"}), accounts=frozenset({"team-a"}))
EVERYONE = model.Allowance(partitions=frozenset({"cpu"}))
KINDS = {
    model.PARTITION: "partitions",
    model.ACCOUNT: "accounts",
    model.QOS: "qos",
    model.RESERVATION: "reservations",
}


def annotated(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    found = pod(name)
    found["metadata"]["annotations"] = dict(annotations)
    return found


def test_a_namespaces_own_entry_replaces_star_and_an_unlisted_one_gets_slurms_defaults_only() -> None:
    table = {"ml": GPU, "*": EVERYONE}
    assert model.allowance_of("ml", table) == GPU
    assert model.allowance_of("other", table) == EVERYONE
    assert model.allowance_of("other", {"ml": GPU}) == model.NOTHING
    assert model.allowance_of("ml", {}) == model.NOTHING


NAMES = st.sampled_from(["gpu", "cpu", "team-a", "normal", "maint"])


@given(
    asked=st.fixed_dictionaries({}, optional=dict.fromkeys(KINDS, NAMES)),
    allowed=st.fixed_dictionaries({field: st.frozensets(NAMES) for field in KINDS.values()}),
)
def test_a_pod_may_name_only_what_its_namespace_may_use_and_may_always_leave_it_to_slurm(
    asked: dict[str, str], allowed: dict[str, frozenset[str]]
) -> None:
    request = model.validate(annotated("p", asked), 30)
    allowance = model.Allowance(**allowed)
    refused = {r.annotation: r.value for r in model.not_allowed(request.options, allowance)}
    assert refused == {k: v for k, v in asked.items() if v not in allowed[KINDS[k]]}
    message = model.allowance_refusal(request, allowance)
    assert (message is None) == (not refused)
    for annotation, value in refused.items():
        assert message is not None and f"{annotation}={value}" in message
        for name in allowed[KINDS[annotation]]:
            assert name in message, "what the namespace may use is named"


def test_the_refusal_says_what_was_asked_what_may_be_used_and_the_fix() -> None:
    asked = {model.PARTITION: "gpu-high", model.QOS: "urgent"}
    request = model.validate(annotated("p", asked), 30)
    assert model.allowance_refusal(request, GPU) == (
        "namespace ns may not use what pod p asks of Slurm (sunk.coreweave.com/partition=gpu-high, "
        "sunk.coreweave.com/qos=urgent); it may use: partitions gpu; QOS none but Slurm's default. Set the "
        "annotation to an allowed value, or remove it for Slurm's default; to be allowed more, ask the "
        "platform (quorum-sunk-scheduler's QUORUM_SUNK_NAMESPACES)"
    )


def test_the_allow_list_is_read_from_json_and_a_typo_stops_the_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    value = '{"ml": {"partitions": ["gpu"], "accounts": ["team-a"]}, "*": {"partitions": ["cpu"]}}'
    monkeypatch.setenv("QUORUM_SUNK_NAMESPACES", value)
    assert SunkSettings().namespaces == {"ml": GPU, "*": EVERYONE}
    for bad, says in [
        ('{"ml": {"partition": ["gpu"]}}', "unknown key(s) partition; the keys are partitions"),
        ('{"ML": {}}', "'ML' is not a namespace name"),
        ('{"ml": {"qos": "normal"}}', "ml.qos: expected a list of Slurm names"),
        ('{"ml": {"accounts": ["a;b"]}}', "ml.accounts: expected a list of Slurm names"),
    ]:
        monkeypatch.setenv("QUORUM_SUNK_NAMESPACES", bad)
        with pytest.raises(ValidationError, match=re.escape(says)):
            SunkSettings()
    monkeypatch.delenv("QUORUM_SUNK_NAMESPACES")
    assert SunkSettings().namespaces == {}, "by default a pod names nothing: Slurm's defaults only"


class Scheduler:
    def __init__(self, table: dict[str, model.Allowance]) -> None:
        self.api, self.slurm = FakeSunkApi(), FakeSlurm()
        self.scheduler = SunkScheduler(SunkSettings(namespaces=table), self.api, self.slurm)

    async def reconcile(self) -> model.Counts:
        self.api.sync(self.scheduler)
        counts = await self.scheduler.reconcile()
        self.scheduler.passes += 1
        return counts


async def test_a_pod_asking_beyond_its_namespace_is_told_once_and_submitted_once_it_asks_within() -> None:
    cluster = Scheduler({"ns": GPU})
    cluster.api.add_pod(pod("solo"))["metadata"]["annotations"][model.PARTITION] = "gpu-high"
    assert (await cluster.reconcile()).invalid == 1
    assert (await cluster.reconcile()).invalid == 0
    assert cluster.slurm.bodies == []
    ((name, reason, message, warning),) = cluster.api.events
    assert (name, reason, warning) == ("solo", "SlurmNotAllowed", True)
    assert message.startswith("not passed to Slurm: namespace ns may not use what pod solo asks of Slurm")

    found = cluster.api.pod("solo")
    assert found is not None
    found["metadata"]["annotations"][model.PARTITION] = "gpu"  # the tenant fixes it
    assert (await cluster.reconcile()).submitted == 1
    (body,) = cluster.slurm.bodies
    assert body["job"]["partition"] == "gpu"


async def test_a_namespace_the_list_does_not_name_gets_slurms_defaults_and_nothing_more() -> None:
    cluster = Scheduler({"team-b": GPU})
    cluster.api.add_pod(pod("plain"))
    cluster.api.add_pod(pod("named"))["metadata"]["annotations"][model.ACCOUNT] = "team-b"
    counts = await cluster.reconcile()
    assert (counts.submitted, counts.invalid) == (1, 1)
    (body,) = cluster.slurm.bodies
    assert "partition" not in body["job"] and "account" not in body["job"]
    assert [e[:2] for e in cluster.api.events if e[3]] == [("named", "SlurmNotAllowed")]


async def test_a_gang_with_a_pod_asking_beyond_its_namespace_is_not_submitted_and_its_gang_says_why() -> None:
    cluster = Scheduler({"*": GPU})
    cluster.api.add_group("scheduling.sigs.k8s.io", "v1alpha1", podgroup("train", 2))
    cluster.api.add_pod(pod("train-0", "train"))["metadata"]["annotations"][model.PARTITION] = "gpu"
    cluster.api.add_pod(pod("train-1", "train"))["metadata"]["annotations"][model.RESERVATION] = "maint"
    await cluster.reconcile()
    await cluster.reconcile()
    assert cluster.slurm.bodies == []
    assert [e[:2] for e in cluster.api.events] == [("train-1", "SlurmNotAllowed")]
    status = cluster.api.gangs[("ns", "pg-train")]["status"]
    admitted = next(c for c in status["conditions"] if c["type"] == "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "SlurmNotAllowed")
    assert "sunk.coreweave.com/reservation=maint" in admitted["message"]
    assert "reservations none but Slurm's default" in admitted["message"]


async def test_a_comment_may_not_carry_the_placeholders_start_mark() -> None:
    """Else the job would look started (and its pods be bound) before its prolog locked the node."""
    cluster = Scheduler({})
    cluster.api.add_pod(pod("early"))["metadata"]["annotations"][model.COMMENT] = "ready" + model.STARTED
    assert (await cluster.reconcile()).invalid == 1
    assert cluster.slurm.bodies == []
    assert [e[1] for e in cluster.api.events] == ["FailedValidation"]
    assert "may not contain ': started'" in cluster.api.events[0][2]


def test_the_local_cluster_lets_every_namespace_name_its_partitions_and_nothing_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = [
        devslurm.SlurmNode("g-000", 8, 1024, 8, "gpu", 7001),
        devslurm.SlurmNode("c-000", 8, 1024, 0, "cpu", 7002),
    ]
    monkeypatch.setenv("QUORUM_SUNK_NAMESPACES", json.dumps(devslurm.sunk_namespaces(nodes)))
    partitions = frozenset({"gpu", "gpu-high", "cpu", "cpu-high"})
    assert SunkSettings().namespaces == {"*": model.Allowance(partitions=partitions)}
