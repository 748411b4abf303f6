"""The patch builder: one consistent patch, idempotent, touching only what intents own."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from quorum.webhooks.patch import (
    AddSchedulingGate,
    AddToleration,
    Intent,
    SetAnnotation,
    SetLabel,
    SetSchedulerName,
    apply_patch,
    build_patch,
    escape,
)

keys = st.sampled_from(["app", "quorum.dev/gang", "a/b~c", "team.example.com/x", "x"])
values = st.sampled_from(["", "1", "pg-a", "v/w"])
intents: st.SearchStrategy[Intent] = st.one_of(
    st.builds(SetLabel, keys, values),
    st.builds(SetAnnotation, keys, values),
    st.builds(
        AddToleration.of,
        st.fixed_dictionaries(
            {"key": st.sampled_from(["is_cpu_compute", "k"]), "operator": st.just("Exists")}
        ),
    ),
    st.builds(AddSchedulingGate, st.sampled_from(["quorum.dev/gang", "example.com/g"])),
    st.builds(SetSchedulerName, st.sampled_from(["default-scheduler", "other"])),
)
maybe_map = st.none() | st.dictionaries(keys, values, max_size=3)
maybe_list = st.none() | st.lists(
    st.fixed_dictionaries({"key": st.sampled_from(["is_cpu_compute", "z"]), "operator": st.just("Exists")}),
    max_size=2,
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p"}
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    for field, strategy, target in (
        ("labels", maybe_map, metadata),
        ("annotations", maybe_map, metadata),
        ("tolerations", maybe_list, spec),
    ):
        value = draw(strategy)
        if value is not None:
            target[field] = value
    if draw(st.booleans()):
        spec["schedulingGates"] = [{"name": "example.com/g"}]
    if draw(st.booleans()):
        spec["schedulerName"] = draw(st.sampled_from(["default-scheduler", "cw-coscheduler"]))
    return {"metadata": metadata, "spec": spec}


OWNED_PREFIXES = (
    "/metadata/labels",
    "/metadata/annotations",
    "/spec/tolerations",
    "/spec/schedulingGates",
    "/spec/schedulerName",
)


@given(pods(), st.lists(intents, max_size=8))
def test_patch_is_idempotent(pod: dict[str, Any], wanted: list[Intent]) -> None:
    patched = apply_patch(pod, build_patch(pod, wanted))
    assert build_patch(patched, wanted) == []


@given(pods(), st.lists(intents, max_size=8))
def test_patch_touches_only_owned_paths_and_creates_each_container_once(
    pod: dict[str, Any], wanted: list[Intent]
) -> None:
    ops = build_patch(pod, wanted)
    paths = [op["path"] for op in ops]
    assert all(p.startswith(OWNED_PREFIXES) for p in paths), paths
    for whole in ("/metadata/labels", "/metadata/annotations", "/spec/tolerations", "/spec/schedulingGates"):
        assert paths.count(whole) <= 1
        if whole in paths:  # created whole: nothing else may write inside it
            assert not any(p.startswith(whole + "/") for p in paths)
    patched = apply_patch(pod, ops)
    assert patched["spec"]["containers"] == pod["spec"]["containers"]


@given(pods(), st.lists(intents, max_size=8))
def test_every_intent_holds_after_the_patch(pod: dict[str, Any], wanted: list[Intent]) -> None:
    patched = apply_patch(pod, build_patch(pod, wanted))
    final_labels: dict[str, str] = {}
    final_annotations: dict[str, str] = {}
    scheduler = None
    for intent in wanted:
        match intent:
            case SetLabel(k, v):
                final_labels[k] = v
            case SetAnnotation(k, v):
                final_annotations[k] = v
            case AddToleration(items):
                assert dict(items) in patched["spec"]["tolerations"]
            case AddSchedulingGate(name):
                assert {"name": name} in patched["spec"]["schedulingGates"]
            case SetSchedulerName(name):
                scheduler = name
    assert final_labels.items() <= patched["metadata"].get("labels", {}).items()
    assert final_annotations.items() <= patched["metadata"].get("annotations", {}).items()
    if scheduler:
        assert patched["spec"]["schedulerName"] == scheduler


def test_two_policies_labelling_a_pod_without_labels_make_one_add() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {}}
    ops = build_patch(pod, [SetLabel("a", "1"), SetLabel("quorum.dev/gang", "pg-x")])
    assert ops == [{"op": "add", "path": "/metadata/labels", "value": {"a": "1", "quorum.dev/gang": "pg-x"}}]


def test_keys_are_escaped_as_json_pointers() -> None:
    assert escape("quorum.dev/gang") == "quorum.dev~1gang"
    assert escape("a~b/c") == "a~0b~1c"
    ops = build_patch({"metadata": {"labels": {}}, "spec": {}}, [SetLabel("quorum.dev/gang", "x")])
    assert ops == [{"op": "add", "path": "/metadata/labels/quorum.dev~1gang", "value": "x"}]
