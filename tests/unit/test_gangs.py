"""Gang membership and gang names (the table in docs/architecture.md, "What a gang pod is")."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from quorum.core.gangs import (
    GangSource,
    gang_marker,
    gang_markers,
    gang_name,
    legacy_gang_name,
    name_now,
    queued_since,
)
from quorum.operator.gangs import Store, store_gangs

VALID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def name_of(labels: dict[str, str], group: str | None, scheduler: str | None) -> str | None:
    marker = gang_marker(labels, group, scheduler)
    return marker.gang_name if marker else None


def test_each_row_of_the_table() -> None:
    assert name_of({"pod-group.scheduling.sigs.k8s.io": "pg1"}, None, "cw-coscheduler") == "pg-pg1"
    assert name_of({"scheduling.x-k8s.io/pod-group": "a"}, None, None) == "xpg-a"
    marker = gang_marker(
        {
            "pod-group.scheduling.sigs.k8s.io/name": "job",
            "pod-group.scheduling.sigs.k8s.io/min-available": "4",
        },
        None,
        "coscheduler",
    )
    assert marker is not None and marker.gang_name == "lbl-job" and marker.min_available == "4"
    assert name_of({}, "workers", "default-scheduler") == "wpg-workers"


def test_first_row_wins() -> None:
    labels = {"scheduling.x-k8s.io/pod-group": "b", "pod-group.scheduling.sigs.k8s.io": "a"}
    assert [m.source for m in gang_markers(labels, "c")] == [
        GangSource.SIGS_POD_GROUP,
        GangSource.X_POD_GROUP,
        GangSource.WORKLOAD_POD_GROUP,
    ]
    assert name_of(labels, "c", "") == "pg-a"


def test_other_schedulers_pods_are_not_ours() -> None:
    assert gang_marker({"pod-group.scheduling.sigs.k8s.io": "a"}, None, "volcano") is None
    assert gang_marker({"app": "x"}, None, "cw-coscheduler") is None


@given(st.sampled_from(GangSource), st.text(min_size=1, max_size=300))
def test_gang_names_are_valid_label_values_and_dns_labels(source: GangSource, group: str) -> None:
    name = gang_name(source, group)
    assert VALID.match(name), name
    assert name == gang_name(source, group)


@given(st.sampled_from(GangSource), st.from_regex(r"[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?", fullmatch=True))
def test_clean_names_are_kept_unless_they_end_like_a_hashed_one(source: GangSource, group: str) -> None:
    name = gang_name(source, group)
    if re.search(r"-[0-9a-f]{8}$", group):
        assert name != f"{source.value}-{group}" and name.startswith(f"{source.value}-{group}"[:50])
        assert legacy_gang_name(source, group) == f"{source.value}-{group}", "what earlier releases named it"
    else:
        assert name == f"{source.value}-{group}"
        assert legacy_gang_name(source, group) is None, "its name did not change"


@given(st.sampled_from(GangSource), st.text(min_size=1, max_size=80))
def test_no_group_is_named_like_another_groups_shortened_name(source: GangSource, group: str) -> None:
    """`pg-a.b` is shortened to `pg-a-b-9b17870e`; a PodGroup named `a-b-9b17870e` once got
    that very name, and the two groups' pods were one gang."""
    shortened = gang_name(source, group)
    lookalike = shortened.removeprefix(f"{source.value}-")
    if lookalike != group:
        assert gang_name(source, lookalike) != shortened


def test_the_example_of_the_issue() -> None:
    assert gang_name(GangSource.SIGS_POD_GROUP, "a.b") == "pg-a-b-9b17870e"
    renamed = gang_name(GangSource.SIGS_POD_GROUP, "a-b-9b17870e")
    assert renamed.startswith("pg-a-b-9b17870e-") and len(renamed) == len("pg-a-b-9b17870e-") + 8


def gang_object(name: str, group: str) -> dict[str, object]:
    source = {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "PodGroup", "name": group, "uid": "u"}
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {"source": source, "minMember": 2}}


def labelled(gang: str) -> dict[str, object]:
    return {"metadata": {"namespace": "ns", "labels": {"quorum.dev/gang": gang}}}


def test_a_gang_made_under_its_legacy_name_keeps_it_for_its_new_pods() -> None:
    """An upgrade splits no gang: the group's Gang object was made under the name earlier
    releases gave it, so its pods made since (labelled with today's name) join it."""
    legacy, now = "pg-train-0badcafe", gang_name(GangSource.SIGS_POD_GROUP, "train-0badcafe")
    store = Store()
    gangs = store_gangs(store)
    assert store.gang_of(labelled(now)) == now, "no Gang yet: the label's name"
    gangs.upsert(gang_object(legacy, "train-0badcafe"))
    assert store.gang_of(labelled(now)) == legacy and store.gang_of(labelled(legacy)) == legacy
    assert store.labels_of(("ns", legacy)) == (legacy, now)
    assert store.gang_of({"metadata": {"namespace": "other", "labels": {"quorum.dev/gang": now}}}) == now
    gangs.delete(gang_object(legacy, "train-0badcafe"))
    assert store.gang_of(labelled(now)) == now, "its Gang gone: the name it has now"
    gangs.replace_all([gang_object(legacy, "train-0badcafe")])
    assert store.gang_of(labelled(now)) == legacy
    gangs.replace_all([])
    assert store.aliases == {}
    store.assume_gang(("ns", legacy), gang_object(legacy, "train-0badcafe"))  # made by this process
    assert store.gang_of(labelled(now)) == legacy, "known before the watch shows it"
    store.assume_gang(("ns", legacy), None)
    assert store.aliases == {}


def test_a_gang_under_todays_name_has_no_alias() -> None:
    """`pg-a-b-9b17870e` is today's name of PodGroup `a.b` (and legacy of none): no alias."""
    store = Store()
    store_gangs(store).upsert(gang_object("pg-a-b-9b17870e", "a.b"))
    store_gangs(store).upsert(gang_object("pg-x", "x"))
    assert store.aliases == {}


@given(st.sampled_from(GangSource), st.text(min_size=1, max_size=80), st.text(min_size=1, max_size=80))
def test_different_groups_get_different_names(source: GangSource, a: str, b: str) -> None:
    if a != b:
        assert gang_name(source, a) != gang_name(source, b)


@given(
    st.none() | st.floats(0, 1e6),
    st.lists(st.floats(0, 1e6), max_size=8),
    st.integers(1, 10),
    st.floats(0, 1e6),
)
def test_a_gang_is_queued_once_it_has_its_group_and_min_member_pods(
    group: float | None, pods: list[float], min_member: int, later: float
) -> None:
    age = queued_since(group, pods, min_member)
    assert age >= (group or 0.0), "never older than its group object"
    if len(pods) >= min_member:
        assert age == max(group or 0.0, sorted(pods)[min_member - 1])
    # A pod made at or after that time never makes the gang older.
    assert queued_since(group, [*pods, age + later], min_member) >= age


@given(st.sampled_from(GangSource), st.from_regex(r"[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?", fullmatch=True))
def test_an_earlier_name_says_todays(source: GangSource, group: str) -> None:
    now = gang_name(source, group)
    legacy = legacy_gang_name(source, group)
    if legacy is not None:
        assert name_now(legacy) == now
    else:
        assert name_now(f"{source.value}-{group}") == now


def test_a_legacy_gang_adopted_by_another_group_drops_its_old_alias() -> None:
    """`keep_gang` may hand a Gang left without an owner to the group made again under its name;
    the alias follows the Gang's source as it is now."""
    legacy = "pg-train-0badcafe"
    store = Store()
    gangs = store_gangs(store)
    gangs.upsert(gang_object(legacy, "train-0badcafe"))
    assert store.aliases
    gangs.upsert(gang_object(legacy, "other"))
    assert store.aliases == {}
