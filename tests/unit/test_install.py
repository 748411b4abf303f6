"""`quorum manifests --namespace X`: the one place that sets where quorum is installed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devcluster.config import admission_config
from quorum.cli import main
from quorum.core.gangs import Placer
from quorum.install import (
    DEFAULT_NAMESPACE,
    DELEGATED_TEXT,
    STATIC_SUFFIX,
    InvalidNamespace,
    operator_username,
    render,
    render_files,
    static_admission,
)


def test_every_namespace_dependent_place_follows_the_namespace() -> None:
    rendered = render_files(None, "gpu-admission")
    assert DEFAULT_NAMESPACE not in rendered
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    namespace = next(d for d in docs if d["kind"] == "Namespace")
    assert namespace["metadata"]["name"] == "gpu-admission"
    for doc in docs:
        if doc["kind"] in ("ServiceAccount", "Deployment", "Service", "ConfigMap", "Role", "RoleBinding"):
            assert doc["metadata"]["namespace"] == "gpu-admission", doc["metadata"]
    for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert all(s.get("namespace", "gpu-admission") == "gpu-admission" for s in binding["subjects"])
    webhooks = [w for d in docs if d["kind"].endswith("WebhookConfiguration") for w in d["webhooks"]]
    assert webhooks and all(w["clientConfig"]["service"]["namespace"] == "gpu-admission" for w in webhooks)
    for webhook in webhooks:
        excluded = webhook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert "gpu-admission" in excluded
    user = operator_username("gpu-admission")
    policies = yaml.safe_dump([d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"])
    assert user in policies
    settings = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["settings.yaml"]
    assert yaml.safe_load(settings)["operator_users"] == [user]


def test_only_the_namespace_token_is_replaced() -> None:
    text = (
        "namespace: quorum-system\nx: quorum-system-extra\ny: svc.quorum-system.svc\nz: 'a:quorum-system:b'"
    )
    assert render(text, "ns2") == "namespace: ns2\nx: quorum-system-extra\ny: svc.ns2.svc\nz: 'a:ns2:b'"


@pytest.mark.parametrize("bad", ["", "Quorum", "a_b", "-a", "a" * 64, "quorum system", "a\nb"])
def test_a_bad_namespace_is_refused_with_what_to_write(bad: str) -> None:
    with pytest.raises(InvalidNamespace, match="lower-case letters"):
        render("x", bad)


def test_the_optional_cert_manager_install_follows_too() -> None:
    rendered = render_files(["optional/cert-manager.yaml"], "gpu-admission")
    assert "quorum-webhooks.gpu-admission.svc" in rendered and DEFAULT_NAMESPACE not in rendered


def test_the_webhook_port_admits_any_address_of_either_family_by_default() -> None:
    policy = next(d for d in yaml.safe_load_all(render_files(["60-network-policy.yaml"], "q")))
    assert policy["spec"]["ingress"][0]["from"][:2] == [
        {"ipBlock": {"cidr": "0.0.0.0/0"}},
        {"ipBlock": {"cidr": "::/0"}},
    ]


def test_the_webhook_port_can_be_narrowed_to_the_apiserver() -> None:
    rendered = render_files(["60-network-policy.yaml"], "q", apiserver_cidrs=("10.0.0.5", "fd00::/64"))
    policy = next(d for d in yaml.safe_load_all(rendered) if d["metadata"]["name"] == "quorum-webhooks")
    sources = policy["spec"]["ingress"][0]["from"]
    assert sources[:2] == [{"ipBlock": {"cidr": "10.0.0.5/32"}}, {"ipBlock": {"cidr": "fd00::/64"}}]
    assert "cidr: 0.0.0.0/0" not in rendered and '"::/0"' not in rendered
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        render_files(["60-network-policy.yaml"], "q", apiserver_cidrs=("apiserver",))


def test_the_command_prints_the_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["manifests", "--namespace", "ml-platform"]) == 0
    out = capsys.readouterr().out
    assert "name: ml-platform" in out and DEFAULT_NAMESPACE not in out
    assert main(["manifests", "--namespace", "Bad_Name"]) == 2


def test_static_admission_writes_the_fences_for_the_apiservers_disk_and_prints_the_rest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--static-admission DIR`: quorum's self-protection and its protective policies, each
    name (and each binding's policyName) ending in .static.k8s.io as the apiserver requires,
    for the namespace; the printed manifests no longer hold those policies (only the warning
    of quorum-pod-defaults, which fences nothing, is still an API object)."""
    assert main(["manifests", "--namespace", "ml-platform", "--static-admission", str(tmp_path)]) == 0
    printed = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    left = {d["metadata"]["name"] for d in printed if d["kind"].startswith("ValidatingAdmissionPolicy")}
    assert left == {"quorum-gang-pods-warnings"}
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["quorum-fences.yaml", "quorum-self-protection.yaml"]
    docs = [d for p in tmp_path.iterdir() for d in yaml.safe_load_all(p.read_text()) if d]
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert all(n.endswith(STATIC_SUFFIX) for n in policies | {b["metadata"]["name"] for b in bindings})
    assert {b["spec"]["policyName"] for b in bindings} == policies, "each binding names a policy of the set"
    assert {"quorum-records.static.k8s.io", "quorum-install.static.k8s.io"} <= policies
    assert not any("paramKind" in d.get("spec", {}) for d in docs), "static policies take no parameters"
    text = "".join(p.read_text() for p in tmp_path.iterdir())
    assert "ml-platform" in text and "quorum-system" not in text


def test_the_local_plane_names_the_static_policies_in_its_admission_config(tmp_path: Path) -> None:
    config = yaml.safe_load(admission_config(tmp_path))
    (plugin,) = [p for p in config["plugins"] if p["name"] == "ValidatingAdmissionPolicy"]
    assert plugin["configuration"]["staticManifestsDir"] == str(tmp_path)
    assert [p["name"] for p in yaml.safe_load(admission_config())["plugins"]] == ["ResourceQuota"]
    assert static_admission("off", "quorum-system") == {}
    with pytest.raises(ValueError, match="one of off, protect, all"):
        static_admission("some", "quorum-system")


def test_without_a_checkout_it_says_so_instead_of_printing_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wheel and the image hold no manifests/: `quorum manifests` fails and says what to do."""
    from quorum import install

    monkeypatch.setattr(install, "MANIFESTS", tmp_path / "manifests")
    for argv in (["manifests"], ["manifests", "--values", str(tmp_path / "v.yaml")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "renders a checkout's manifests/ and crds/" in err and "Helm chart" in err, err


def test_placement_kube_scheduler_turns_every_placement_test_and_setting_and_nothing_else(
    capsys: pytest.CaptureFixture[str],
) -> None:
    default = render_files(None, DEFAULT_NAMESPACE)
    delegated = render_files(None, DEFAULT_NAMESPACE, placement=Placer.KUBE_SCHEDULER)
    tests = default.count(DELEGATED_TEXT)
    assert tests >= 5, "the MAP, its patch, the fallback condition, the backstop and quorum-gang-pods"
    assert DELEGATED_TEXT not in delegated
    assert delegated.count("'kube-scheduler' == 'kube-scheduler'") == tests
    changed = [(a, b) for a, b in zip(default.splitlines(), delegated.splitlines(), strict=True) if a != b]
    assert len(changed) == tests + 2  # and the two settings
    settings = {b.strip() for a, b in changed if DELEGATED_TEXT not in a}
    assert settings == {
        "placement: kube-scheduler",
        "- {name: QUORUM_OPERATOR_PLACEMENT, value: kube-scheduler}",
    }
    assert main(["manifests", "--placement", "kube-scheduler"]) == 0
    assert capsys.readouterr().out == delegated
