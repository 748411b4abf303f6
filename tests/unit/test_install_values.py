"""`quorum manifests --values`: values merged as Helm merges them, the options mapped onto them,
settings written as Helm writes them, and what the values leave alone printed as written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from quorum import install_values
from quorum.cli import main
from quorum.install_values import (
    InstallValues,
    InvalidValues,
    cel_strings,
    env_value,
    load_values,
    merged,
    render_values,
)
from quorum.operator.settings import OperatorSettings
from quorum.webhooks.settings import WebhookSettings


def test_a_values_file_is_merged_onto_the_defaults_as_helm_merges_it() -> None:
    base = {"a": {"b": 1, "c": [1, 2], "d": {"e": 1}}, "f": 1}
    assert merged(base, {"a": {"b": 2, "c": [3], "d": None}}) == {"a": {"b": 2, "c": [3]}, "f": 1}
    values = load_values({"operator": {"resources": {"requests": {"cpu": "1"}}}})
    assert values.operator.resources.requests == {"cpu": "1", "memory": "256Mi"}
    assert values.operator.resources.limits == {"memory": "1Gi"}
    assert load_values({"operator": {"resources": {"limits": None}}}).operator.resources.limits is None


def test_settings_are_written_as_helms_tojson_writes_them() -> None:
    assert [env_value(v) for v in (True, False, 180.0, 0.5, 2.5, 1, "Replace")] == [
        "true",
        "false",
        "180",
        "0.5",
        "2.5",
        "1",
        "Replace",
    ]


def test_identities_are_one_list_literal_for_cel_and_yaml() -> None:
    text = cel_strings(["quorum:node-lifecycle", "a@b.c"])
    assert text == "['quorum:node-lifecycle', 'a@b.c']"
    assert yaml.safe_load(f"x: {text}")["x"] == ["quorum:node-lifecycle", "a@b.c"]
    with pytest.raises(InvalidValues, match=r"platform\.users\.0"):
        load_values({"platform": {"users": ["o'brien"]}})


def test_an_address_block_is_written_as_kubernetes_writes_it_back() -> None:
    with pytest.raises(InvalidValues, match=r"write the address block as 10\.0\.0\.0/24"):
        load_values({"networkPolicy": {"apiserverCidrs": ["10.0.0.5/24"]}})
    assert load_values(
        {"networkPolicy": {"apiserverCidrs": ["fd00::/64"]}}
    ).network_policy.apiserver_cidrs == ["fd00::/64"]


def test_what_the_values_leave_alone_keeps_its_comments() -> None:
    text = render_values(InstallValues())
    assert "# Gate protection, inside the apiserver (CEL)" in text, "40-gate-protection.yaml as written"
    assert "cert-manager.io/inject-ca-from" not in text, "no cert-manager: no injection asked of it"
    assert "&id0" not in text and "*id0" not in text


def test_the_options_map_onto_the_values(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("namespace: {name: from-file}\nplatform: {groups: [ops]}\n")
    argv = [
        "manifests",
        "--values",
        str(values),
        "--namespace",
        "ml-platform",
        "--apiserver-cidr",
        "10.0.0.5",
    ]
    assert main(argv) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert {d["metadata"].get("namespace") for d in docs} == {None, "ml-platform"}
    policy = next(
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "quorum-webhooks"
    )
    assert policy["spec"]["ingress"][0]["from"][0] == {"ipBlock": {"cidr": "10.0.0.5/32"}}
    settings = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["settings.yaml"]
    assert yaml.safe_load(settings)["platform_groups"] == ["ops"]
    assert main(["manifests", "--values", str(values), "--dir", str(tmp_path)]) == 2
    assert "--dir renders manifests as written" in capsys.readouterr().err


def test_static_admission_with_values_writes_the_fences_with_the_platform_identities(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("platform: {users: [cks-node-lifecycle]}\n")
    assert main(["manifests", "--values", str(values), "--static-admission", str(tmp_path / "static")]) == 0
    printed = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    left = {d["metadata"]["name"] for d in printed if d["kind"].startswith("ValidatingAdmissionPolicy")}
    assert left == {"quorum-gang-pods-warnings"}  # a warning, no fence
    fences = (tmp_path / "static" / "quorum-fences.yaml").read_text()
    assert "'cks-node-lifecycle'" in fences and "quorum:node-lifecycle" not in fences


def test_the_scheduler_names_refuse_the_default_scheduler_and_an_empty_list() -> None:
    """Every pod has the default scheduler's name: as a coscheduler name it would make the backstop
    refuse every pod while the webhooks are down. And at least one name must be left."""
    with pytest.raises(install_values.InvalidValues, match="default-scheduler is not a coscheduler name"):
        install_values.load_values({"schedulers": {"coschedulerNames": ["default-scheduler"]}})
    with pytest.raises(install_values.InvalidValues, match="no coscheduler name is left"):
        install_values.load_values(
            {"schedulers": {"coschedulerNames": ["scheduler-plugins-scheduler"], "schedulerPlugins": True}}
        )
    with pytest.raises(ValidationError):
        WebhookSettings(coscheduler_names=("default-scheduler",))
    with pytest.raises(ValidationError):
        OperatorSettings(coscheduler_names=("default-scheduler",))


def test_volcanos_crd_comes_with_the_name_however_it_is_taken() -> None:
    """`volcano` among the names needs Volcano's PodGroups served, whether schedulers.volcano or
    coschedulerNames put it there."""
    crd = install_values.CRDS / install_values.VOLCANO_CRD
    assert crd not in install_values.sources(install_values.load_values())
    by_flag = install_values.load_values({"schedulers": {"volcano": True}})
    by_name = install_values.load_values({"schedulers": {"coschedulerNames": ["cw-coscheduler", "volcano"]}})
    assert crd in install_values.sources(by_flag) and crd in install_values.sources(by_name)
