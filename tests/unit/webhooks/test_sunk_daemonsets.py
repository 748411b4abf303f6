"""The DaemonSet warning for SUNK nodes (seed 002): which tolerations are missing, what counts
as tolerating (Kubernetes' rules), when a DaemonSet is kept off SUNK nodes, and that no input a
tenant writes makes it raise, deny or print without bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.webhooks.policies.sunk_daemonsets import sunk_taints, validate
from quorum.webhooks.settings import WebhookSettings
from tests.unit.webhooks.factories import request, workload

SETTINGS = WebhookSettings()
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "seed-002-sunk" / "daemonset.yaml"
ALL = [
    {"key": "sunk.coreweave.com/lock", "operator": "Equal", "value": "true"},
    {"key": "is_cpu_compute", "operator": "Exists"},
    {"key": "is_gpu", "operator": "Exists"},
    {"key": "node.coreweave.cloud/reserved", "operator": "Exists"},
]


def daemonset(tolerations: Any = None, **pod: Any) -> dict[str, Any]:
    if tolerations is not None:
        pod["tolerations"] = tolerations
    return workload("DaemonSet", {"app": "x"}, pod=pod)


def warnings(
    obj: dict[str, Any], old: dict[str, Any] | None = None, s: WebhookSettings = SETTINGS
) -> list[str]:
    operation = "UPDATE" if old is not None else "CREATE"
    decision = validate(request("DaemonSet", obj, old, operation=operation), s)
    assert decision.allowed
    return decision.warnings


def test_the_example_gets_no_warning() -> None:
    assert warnings(yaml.safe_load(EXAMPLE.read_text())) == []


def test_no_tolerations_names_all_four_and_the_lines_to_add() -> None:
    (text,) = warnings(daemonset())
    assert (
        "sunk.coreweave.com/lock=true:NoExecute, is_cpu_compute, is_gpu, node.coreweave.cloud/reserved"
        in text
    )
    assert '- {key: sunk.coreweave.com/lock, operator: Equal, value: "true"}' in text
    assert "NotIn" in text  # how to keep it off SUNK nodes instead


@pytest.mark.parametrize("index", range(4))
def test_each_missing_one_is_named_alone(index: int) -> None:
    (text,) = warnings(daemonset(ALL[:index] + ALL[index + 1 :]))
    named = text.split("does not tolerate ", 1)[1].split(":", 1)[0]
    assert named.startswith(ALL[index]["key"]) and "," not in named


def test_an_empty_key_exists_tolerates_everything_and_effects_must_match() -> None:
    assert warnings(daemonset([{"operator": "Exists"}])) == []
    assert warnings(daemonset([{"operator": "Exists", "effect": "NoSchedule"}]))  # not the lock's NoExecute
    lock_wrong_effect = [{**ALL[0], "effect": "NoSchedule"}, *ALL[1:]]
    assert "sunk.coreweave.com/lock" in warnings(daemonset(lock_wrong_effect))[0]
    lock_exists = [{"key": "sunk.coreweave.com/lock", "operator": "Exists", "effect": "NoExecute"}, *ALL[1:]]
    assert warnings(daemonset(lock_exists)) == []


def test_a_wrong_value_is_shown() -> None:
    (text,) = warnings(daemonset([{**ALL[0], "value": "yes"}, *ALL[1:]]))
    assert "found" in text and "'yes'" in text


def test_the_reserved_value_is_checked_when_the_org_is_configured() -> None:
    org = WebhookSettings(sunk_reserved_value="org-abc")
    equal = [*ALL[:3], {"key": "node.coreweave.cloud/reserved", "operator": "Equal", "value": "org-xyz"}]
    assert "org-abc" in warnings(daemonset(equal), s=org)[0]
    equal[3]["value"] = "org-abc"
    assert warnings(daemonset(equal), s=org) == []
    assert warnings(daemonset(ALL), s=org) == []  # Exists tolerates any value


def test_a_daemonset_kept_off_sunk_nodes_is_not_warned() -> None:
    label = SETTINGS.sunk_node_label
    assert warnings(daemonset(nodeSelector={label: "false"})) == []
    assert warnings(daemonset(nodeSelector={label: "true"}))
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": label, "operator": "NotIn", "values": ["true"]}]},
        {"matchExpressions": [{"key": label, "operator": "DoesNotExist"}]},
    ]}}}  # fmt: skip
    assert warnings(daemonset(affinity=affinity)) == []
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    terms.append({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]})
    assert warnings(daemonset(affinity=affinity)), "one term lets it onto SUNK nodes"


def test_an_update_is_judged_only_when_its_placement_changes() -> None:
    old = daemonset()
    changed_image = daemonset()
    changed_image["spec"]["template"]["spec"]["containers"][0]["image"] = "other"
    assert warnings(changed_image, old) == []
    assert warnings(daemonset(ALL[:2]), old)


def test_the_setting_turns_it_off() -> None:
    assert warnings(daemonset(), s=WebhookSettings(sunk_daemonset_warnings=False)) == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=4),
    max_leaves=20,
)
toleration = st.fixed_dictionaries(
    {},
    optional={
        "key": st.sampled_from([t.key for t in sunk_taints(SETTINGS)] + ["", "other"]) | json_values,
        "operator": st.sampled_from(["Exists", "Equal", "", "In"]) | json_values,
        "value": st.sampled_from(["true", "", "x" * 500]) | json_values,
        "effect": st.sampled_from(["NoExecute", "NoSchedule", "PreferNoSchedule", ""]) | json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(toleration | json_values, max_size=30) | json_values, json_values, json_values)
def test_any_template_is_answered_allowed_with_a_bounded_warning(
    tolerations: Any, node_selector: Any, affinity: Any
) -> None:
    obj = daemonset(tolerations, nodeSelector=node_selector, affinity=affinity)
    found = warnings(obj)
    assert len(found) <= 1 and all(len(w) < 2000 for w in found)
    if isinstance(tolerations, list):
        # The four tolerations added: nothing is missing any more.
        assert warnings(daemonset([*tolerations, *ALL], nodeSelector=node_selector, affinity=affinity)) == []
