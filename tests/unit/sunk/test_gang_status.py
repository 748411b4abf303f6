"""The Gang of a gang Slurm places, composed from plain facts by the operator's status rules: its
phase, counters, conditions and `status.slurm`; and a group's size as the scheduler reads it."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from quorum.core.conditions import CONDITION_TYPES
from quorum.sunk import model

STAMP, LATER = "2026-11-24T06:00:00Z", "2026-11-24T06:05:00Z"


def job(state: str = "RUNNING", reason: str | None = None, started: bool = True) -> model.SlurmJobFacts:
    return model.SlurmJobFacts(42, state, reason, "gpu", "slurm-gpu-[000-003]", started)


def facts(
    job: model.SlurmJobFacts | None = None, members: int = 4, bound: int = 0, **more: Any
) -> model.SlurmGangFacts:
    counts = {"members": members, "bound": bound, **more.pop("counts", {})}
    return model.SlurmGangFacts(more.pop("min_member", 4), counts, job, more.pop("note", None))


def conditions(status: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_gang_short_of_members_waits_for_them() -> None:
    status = model.slurm_gang_status(facts(members=2), None, STAMP)
    admitted = conditions(status)["Admitted"]
    assert (status["phase"], admitted["status"], admitted["reason"]) == (
        "Pending",
        "False",
        "WaitingForMembers",
    )
    assert admitted["message"] == "2 of 4 members exist (minMember 4)"
    assert status["slurm"] is None


def test_a_pending_job_without_room_is_unschedulable_and_says_slurm_places_all_or_none() -> None:
    status = model.slurm_gang_status(facts(job("PENDING", "Resources")), None, STAMP)
    found = conditions(status)
    assert status["phase"] == "Pending"  # as a gang quorum-operator finds no room for
    assert found["Unschedulable"]["status"] == "True" and found["Unschedulable"]["reason"] == "SlurmResources"
    assert (
        "PENDING (Resources)" in found["Admitted"]["message"]
        and "all 4 pods at once" in found["Admitted"]["message"]
    )
    assert status["slurm"] == {"jobId": 42, "state": "PENDING", "reason": "Resources", "partition": "gpu",
                               "nodes": "slurm-gpu-[000-003]"}  # fmt: skip


def test_a_job_waiting_on_priority_is_not_called_unschedulable() -> None:
    status = model.slurm_gang_status(facts(job("PENDING", "Priority")), None, STAMP)
    assert conditions(status)["Unschedulable"]["status"] == "False"


def test_a_running_job_is_admitted_only_once_its_script_started() -> None:
    before = model.slurm_gang_status(facts(job(started=False)), None, STAMP)
    assert conditions(before)["Admitted"]["reason"] == "SlurmPending" and before["phase"] == "Pending"
    after = model.slurm_gang_status(facts(job(), bound=4, counts={"running": 4}), before, LATER)
    admitted = conditions(after)["Admitted"]
    assert (after["phase"], admitted["status"], admitted["reason"]) == ("Running", "True", "Released")
    assert (after["released"], after["gated"]) == (4, 0)
    assert admitted["lastTransitionTime"] == LATER
    assert conditions(after)["Unschedulable"]["lastTransitionTime"] == STAMP  # unchanged, kept


def test_a_refusal_is_the_reason_while_no_job_exists() -> None:
    note = ("SlurmRejected", "Slurm did not take the job: invalid partition")
    status = model.slurm_gang_status(facts(note=note), None, STAMP)
    assert (conditions(status)["Admitted"]["reason"], conditions(status)["Admitted"]["message"]) == note


def test_finished_and_failed() -> None:
    done = model.slurm_gang_status(facts(job(), members=0, counts={"succeeded": 4}), None, STAMP)
    assert done["phase"] == "Finished"
    ended = facts(None, members=0, counts={"failed": 1, "succeeded": 3})
    failed = model.slurm_gang_status(ended, None, STAMP)
    assert failed["phase"] == "Failed"


counts = st.fixed_dictionaries(
    {k: st.integers(0, 10_000) for k in ("members", "bound", "running", "succeeded", "failed")}
)
jobs = st.none() | st.builds(
    model.SlurmJobFacts,
    st.integers(1, 2**31),
    st.sampled_from(["PENDING", "RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING", "x" * 300]),
    st.none() | st.text(max_size=80),
    st.none() | st.text(max_size=40),
    st.none() | st.text(max_size=80),
    st.booleans(),
)


@given(st.integers(1, 4096), counts, jobs, st.none() | st.tuples(st.text(max_size=20), st.text(max_size=200)))
def test_any_facts_compose_a_status_the_gang_schema_holds(
    min_member: int,
    found: dict[str, int],
    slurm_job: model.SlurmJobFacts | None,
    note: tuple[str, str] | None,
) -> None:
    status = model.slurm_gang_status(model.SlurmGangFacts(min_member, found, slurm_job, note), None, STAMP)
    assert status["phase"] in ("Pending", "Scheduling", "Running", "Finished", "Failed")
    assert [c["type"] for c in status["conditions"]] == list(CONDITION_TYPES)
    assert all(
        c["status"] in ("True", "False") and c["lastTransitionTime"] == STAMP for c in status["conditions"]
    )
    admitted = status["conditions"][0]["status"] == "True"
    allocated = slurm_job is not None and slurm_job.state == "RUNNING" and slurm_job.started
    # Released: every pod once Slurm allocated the gang, else those placed (bound) already.
    placed = found["members"] if allocated else min(found["bound"], found["members"])
    assert admitted == (placed >= min_member)
    if status["phase"] == "Running":
        assert found["running"] >= min_member
    # Composing again from what was written changes nothing: a pass writes only on change.
    assert (
        model.slurm_gang_status(model.SlurmGangFacts(min_member, found, slurm_job, note), status, LATER)
        == status
    )


def test_group_sizes() -> None:
    assert model.group_min_member({"spec": {"minMember": 3}}, workload_api=False) == 3
    assert model.group_min_member({"spec": {"schedulingPolicy": {"gang": {"minCount": 5}}}}, True) == 5
    assert model.group_min_member({"spec": {"schedulingPolicy": {"basic": {}}}}, True) == 1


anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=12,
)


@given(anything, st.booleans())
def test_a_group_of_any_shape_has_a_size_in_range_or_none(spec: Any, workload_api: bool) -> None:
    for group in (
        {"spec": spec},
        {"spec": {"minMember": spec}},
        {"spec": {"schedulingPolicy": {"gang": {"minCount": spec}}}},
    ):
        size = model.group_min_member(group, workload_api)
        assert size is None or (type(size) is int and 1 <= size <= model.MAX_GANG_PODS)
