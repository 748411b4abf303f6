"""charts/quorum and `quorum manifests --values` are one install: for each value set below,
`helm template` and `quorum manifests --values` give the same objects once what only Helm adds
(its labels, `helm.sh/resource-policy`, the hook objects) is dropped; the chart passes `helm
lint --strict`; bad values fail both with the value named; the hook identities have exactly the
rights their commands list. Helm is the pinned one (`python -m devcluster build` builds it)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic.alias_generators import to_snake

from devcluster.build import ensure_helm
from quorum import install_values
from quorum.install_values import InstallValues
from quorum.operator.settings import OperatorSettings
from quorum.webhooks import tls

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "quorum"
RELEASE_NAMESPACE = "quorum-system"
HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
)
HOOK = "helm.sh/hook"


def ca_bundle() -> str:
    return base64.b64encode(tls.issue(("quorum-webhooks.gpu-admission.svc",))[0]).decode()


# The defaults; another namespace, address blocks, platform identities and a provided Secret;
# cert-manager, the SUNK scheduler and other replicas, resources and settings.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "elsewhere-secret": {
        "namespace": {"name": "gpu-admission", "create": True},
        "networkPolicy": {"apiserverCidrs": ["10.0.0.0/24", "fd00:10::/64"]},
        "platform": {
            "users": ["system:serviceaccount:cks:node-lifecycle", "ops:quorum-system", "admin@coreweave.com"],
            "groups": ["cks:platform", "system:nodes"],
        },
        "certificates": {"mode": "secret", "secret": {"name": "my-tls", "caBundle": "CA"}},
        "image": {
            "repository": "registry.example.com/quorum",
            "tag": "1.2.3",
            "pullPolicy": "Always",
            "pullSecrets": ["regcred"],
        },
        "dashboard": {"enabled": True},
        "schedulers": {
            "coschedulerNames": ["cw-coscheduler", "gang-scheduler", "scheduler-plugins-scheduler"],
            "schedulerPlugins": True,
            "volcano": True,
            "placement": "kube-scheduler",
        },
    },
    "cert-manager-sunk": {
        "certificates": {"mode": "certManager"},
        "sunk": {
            "enabled": True,
            "slurmCidrs": ["192.168.10.0/24", "10.1.0.0/16"],
            "slurmUrl": "https://slurm.example:6820",
            "namespaces": {
                "team-a": {"partitions": ["gpu"], "accounts": ["team-a"]},
                "*": {"qos": ["normal"]},
            },
        },
        "operator": {
            "replicas": 3,
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": None},
            "settings": {
                "preemption": False,
                "starvationSeconds": 120,
                "starvationMaxShare": 0.5,
                "preemptionRetrySeconds": 2.5,
                "memberLossPolicy": "RestartGang",
                "org": "acme",
            },
        },
        "webhooks": {"replicas": 1, "resources": {"requests": {"cpu": "500m"}}},
        "crds": {"schedulerPlugins": False, "keep": False},
    },
}


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_helm()


@pytest.fixture(scope="module")
def values_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    directory = tmp_path_factory.mktemp("values")
    bundle = ca_bundle()
    files = {}
    for name, values in VALUE_SETS.items():
        text = json.dumps(values).replace('"CA"', json.dumps(bundle))
        files[name] = directory / f"{name}.yaml"
        files[name].write_text(text)
    yield files


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, cwd=REPO, timeout=120, check=False
    )


# What a cluster that serves MutatingAdmissionPolicy tells `helm install` (Kubernetes 1.36+);
# `helm template` knows only the API versions it is told.
SERVES_MAP = ("--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")


def helm_template(helm: Path, *args: str | Path, serves_map: bool = True) -> subprocess.CompletedProcess[str]:
    served = SERVES_MAP if serves_map else ()
    return run(helm, "template", "quorum", CHART, "--namespace", RELEASE_NAMESPACE, *served, *args)


def quorum_manifests(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "quorum", "manifests", *args)


Key = tuple[str, str, str]


def normalised(stream: str, from_helm: bool) -> dict[Key, dict[str, Any]]:
    """Each object by (kind, namespace, name), without what only Helm adds."""
    out: dict[Key, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(stream):
        if not doc:
            continue
        metadata = doc["metadata"]
        annotations = metadata.get("annotations") or {}
        if HOOK in annotations:
            assert from_helm, f"{doc['kind']} {metadata['name']}: quorum manifests prints no hooks"
            continue
        labels = metadata.get("labels") or {}
        for label in HELM_LABELS:
            assert (label in labels) == from_helm, f"{doc['kind']} {metadata['name']}: {label}"
            labels.pop(label, None)
        annotations.pop("helm.sh/resource-policy", None)
        for field, value in (("labels", labels), ("annotations", annotations)):
            if not value:
                metadata.pop(field, None)
        key = (doc["kind"], metadata.get("namespace", ""), metadata["name"])
        assert key not in out, f"{key} twice"
        out[key] = doc
    return out


def hooks(stream: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(stream) if d and HOOK in (d["metadata"].get("annotations") or {})]


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_helm_template_and_quorum_manifests_render_the_same_objects(
    helm: Path, values_files: dict[str, Path], name: str
) -> None:
    rendered = helm_template(helm, "--values", values_files[name])
    assert rendered.returncode == 0, rendered.stderr
    printed = quorum_manifests("--values", values_files[name])
    assert printed.returncode == 0, printed.stderr
    by_helm, by_quorum = normalised(rendered.stdout, True), normalised(printed.stdout, False)
    assert sorted(by_helm) == sorted(by_quorum)
    differ = [key for key in sorted(by_helm) if by_helm[key] != by_quorum[key]]
    assert not differ, "\n".join(
        f"{key}:\n  helm:   {json.dumps(by_helm[key], sort_keys=True)[:1500]}\n"
        f"  quorum: {json.dumps(by_quorum[key], sort_keys=True)[:1500]}"
        for key in differ
    )
    assert len(by_helm) >= 36, sorted(by_helm)


@pytest.mark.parametrize(
    ("serves_map", "value", "way"),
    [
        (True, "auto", "policies"),
        (False, "auto", "webhooks"),
        (True, "webhooks", "webhooks"),
        (False, "policies", "policies"),
    ],
)
def test_pod_admission_follows_what_the_cluster_serves_unless_a_value_says(
    helm: Path, serves_map: bool, value: str, way: str
) -> None:
    """webhooks.podAdmission auto: the MutatingAdmissionPolicy where the cluster serves it, and
    pods.mutate.quorum.dev for every pod where it does not; `quorum manifests --pod-admission`
    renders the same objects."""
    rendered = helm_template(helm, "--set", f"webhooks.podAdmission={value}", serves_map=serves_map)
    assert rendered.returncode == 0, rendered.stderr
    printed = quorum_manifests("--values", "/dev/null", "--pod-admission", way)
    assert printed.returncode == 0, printed.stderr
    by_helm, by_quorum = normalised(rendered.stdout, True), normalised(printed.stdout, False)
    assert by_helm == by_quorum
    mutating = by_helm[("MutatingWebhookConfiguration", "", "quorum-webhooks")]["webhooks"][0]
    has_map = ("MutatingAdmissionPolicy", "", "quorum-pod-defaults") in by_helm
    assert has_map == (way == "policies")
    assert ("matchConditions" in mutating) == (way == "policies")


def test_the_value_sets_change_what_they_say(helm: Path, values_files: dict[str, Path]) -> None:
    """The comparison above means something only if the values take effect."""
    objects = {
        name: normalised(quorum_manifests("--values", path).stdout, False)
        for name, path in values_files.items()
    }
    defaults, elsewhere, other = (
        objects["defaults"],
        objects["elsewhere-secret"],
        objects["cert-manager-sunk"],
    )
    assert ("Namespace", "", "quorum-system") not in defaults, "Helm users create the namespace"
    assert ("Namespace", "", "gpu-admission") in elsewhere
    assert not [k for k in elsewhere if k[1] == "quorum-system"]
    assert ("CustomResourceDefinition", "", "podgroups.scheduling.x-k8s.io") in defaults
    assert ("CustomResourceDefinition", "", "podgroups.scheduling.x-k8s.io") not in other
    assert ("PodDisruptionBudget", "quorum-system", "quorum-webhooks") not in other, "1 replica: no budget"
    assert ("Deployment", "quorum-system", "quorum-sunk-scheduler") in other
    assert ("Certificate", "quorum-system", "quorum-webhooks") in other
    webhooks = elsewhere[("ValidatingWebhookConfiguration", "", "quorum-webhooks")]
    bundle = yaml.safe_load(values_files["elsewhere-secret"].read_text())["certificates"]["secret"][
        "caBundle"
    ]
    assert {w["clientConfig"]["caBundle"] for w in webhooks["webhooks"]} == {bundle}
    assert "annotations" not in webhooks["metadata"], "no cert-manager injection without cert-manager"
    settings = yaml.safe_load(
        elsewhere[("ConfigMap", "gpu-admission", "quorum-webhooks")]["data"]["settings.yaml"]
    )
    assert settings["platform_groups"] == ["cks:platform", "system:nodes"]
    # One list of scheduler names in the webhooks', the operator's settings and every policy's CEL:
    # scheduler-plugins' left to it, volcano added.
    names = ["cw-coscheduler", "gang-scheduler", "volcano"]
    assert settings["coscheduler_names"] == names
    moved = elsewhere[("Deployment", "gpu-admission", "quorum-operator")]["spec"]["template"]["spec"]
    env_names = {e["name"]: e.get("value") for e in moved["containers"][0]["env"]}
    assert OperatorSettings(
        coscheduler_names=env_names["QUORUM_OPERATOR_COSCHEDULER_NAMES"]
    ).coscheduler_names == tuple(names)
    policies = json.dumps([v for k, v in elsewhere.items() if "Policy" in k[0] or "Webhook" in k[0]])
    assert (
        "scheduler-plugins-scheduler" not in policies
        and "'cw-coscheduler', 'gang-scheduler', 'volcano'" in policies
    )
    # placement kube-scheduler: in the webhooks' and the operator's settings and every policy's CEL.
    assert (
        settings["placement"] == "kube-scheduler"
        and env_names["QUORUM_OPERATOR_PLACEMENT"] == "kube-scheduler"
    )
    assert (
        "'quorum' == 'kube-scheduler'" not in policies and "'kube-scheduler' == 'kube-scheduler'" in policies
    )
    unchanged = json.dumps([v for k, v in defaults.items() if "Policy" in k[0] or "Webhook" in k[0]])
    assert (
        "'quorum' == 'kube-scheduler'" in unchanged
        and "'kube-scheduler' == 'kube-scheduler'" not in unchanged
    )
    assert ("CustomResourceDefinition", "", "podgroups.scheduling.volcano.sh") in elsewhere
    assert ("CustomResourceDefinition", "", "podgroups.scheduling.volcano.sh") not in defaults
    fence = json.dumps(elsewhere[("ValidatingAdmissionPolicy", "", "quorum-reserved-status")])
    assert "'admin@coreweave.com'" in fence and "g in ['cks:platform', 'system:nodes']" in fence
    policy = elsewhere[("NetworkPolicy", "gpu-admission", "quorum-webhooks")]
    assert policy["spec"]["ingress"][0]["from"][:2] == [
        {"ipBlock": {"cidr": "10.0.0.0/24"}},
        {"ipBlock": {"cidr": "fd00:10::/64"}},
    ]
    operator = other[("Deployment", "quorum-system", "quorum-operator")]
    container = operator["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["QUORUM_OPERATOR_PREEMPTION"] == "false" and env["QUORUM_OPERATOR_STARVATION_SECONDS"] == "120"
    assert env["QUORUM_OPERATOR_STARVATION_MAX_SHARE"] == "0.5" and env["QUORUM_OPERATOR_ORG"] == "acme"
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}}
    assert operator["spec"]["replicas"] == 3


def test_every_operator_setting_is_one_the_operator_reads_with_its_default_and_bounds() -> None:
    """operator.settings become QUORUM_OPERATOR_<NAME>: each must be a field of OperatorSettings,
    with the same default, and a value the chart allows must be one the operator accepts."""
    values = InstallValues().operator.settings
    fields = OperatorSettings.model_fields
    for name, value in values.model_dump().items():
        assert name in fields, f"operator.settings.{name} is no setting of quorum-operator"
        default = fields[name].default
        assert value == ("" if default is None else default), (name, default, value)
    for name, env in ((e["name"], e["value"]) for e in install_values.settings_env(values)):
        setting = name.removeprefix("QUORUM_OPERATOR_").lower()
        assert setting in fields, name
        OperatorSettings.model_validate({setting: env})
    schema = install_values.schema()["$defs"]["OperatorSettingsValues"]["properties"]
    own = OperatorSettings.model_json_schema()["properties"]
    for name in values.model_dump(by_alias=True):
        field = to_snake(name)
        for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            assert schema[name].get(bound) == own[field].get(bound), (name, bound)


def test_the_chart_passes_helm_lint_strict_with_each_value_set(
    helm: Path, values_files: dict[str, Path]
) -> None:
    for name, path in values_files.items():
        linted = run(helm, "lint", "--strict", CHART, "--namespace", RELEASE_NAMESPACE, "--values", path)
        assert linted.returncode == 0, f"{name}: {linted.stdout}{linted.stderr}"
        assert "0 chart(s) failed" in linted.stdout


def test_values_yaml_schema_and_model_are_one(tmp_path: Path) -> None:
    """values.yaml holds every value at the model's default; values.schema.json is the model's;
    the chart's version is quorum's and the manifests' image tag."""
    assert yaml.safe_load((CHART / "values.yaml").read_text()) == install_values.defaults()
    committed = json.loads((CHART / "values.schema.json").read_text())
    assert committed == install_values.schema(), (
        "charts/quorum/values.schema.json is not the model's: write it again with "
        "`python -c 'from quorum import install_values as v; print(v.schema_text(), end=\"\")' "
        "> charts/quorum/values.schema.json`"
    )
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    assert (
        f"image: {install_values.DEFAULT_IMAGE}:{version}"
        in (REPO / "manifests/50-operator-deployment.yaml").read_text()
    )


@pytest.mark.parametrize(
    ("values", "where", "quorum_says"),
    [
        ({"operator": {"replicas": 0}}, "/operator/replicas", "operator.replicas: Input should be greater"),
        (
            {"certificates": {"mode": "selfsigned"}},
            "/certificates/mode",
            "certificates.mode: Input should be",
        ),
        (
            {"operator": {"replicaz": 3}},
            "additional properties 'replicaz'",
            "operator.replicaz: Extra inputs",
        ),
        (
            {"networkPolicy": {"apiserverCidrs": ["10.0.0.5"]}},
            "/networkPolicy/apiserverCidrs/0",
            "apiserverCidrs.0",
        ),
        ({"platform": {"users": ["o'brien"]}}, "/platform/users/0", "platform.users.0"),
        (
            {"certificates": {"mode": "secret"}},
            "/certificates/secret/caBundle",
            "certificates.secret.caBundle must be",
        ),
        (
            {"operator": {"settings": {"starvationMaxShare": 2}}},
            "/operator/settings/starvationMaxShare",
            "less than",
        ),
        (
            {"uninstall": {"probeNamespace": "kube-system"}},
            "uninstall.probeNamespace kube-system",
            "uninstall.probeNamespace kube-system: quorum's backstop does not apply there",
        ),
    ],
)
def test_bad_values_fail_with_the_value_named(
    helm: Path, tmp_path: Path, values: dict[str, Any], where: str, quorum_says: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(values))
    rendered = helm_template(helm, "--values", path)
    assert rendered.returncode != 0 and where in rendered.stderr, rendered.stderr
    printed = quorum_manifests("--values", path)
    assert printed.returncode == 2 and quorum_says in printed.stderr, printed.stderr


def test_a_provided_secret_needs_a_ca_certificate_in_both(helm: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"certificates": {"mode": "secret", "secret": {"caBundle": "Zm9v"}}}))
    rendered = helm_template(helm, "--values", path)
    assert rendered.returncode != 0 and "base64 of the PEM CA certificate" in rendered.stderr, rendered.stderr
    printed = quorum_manifests("--values", path)
    assert printed.returncode == 2 and "base64 of the PEM CA certificate" in printed.stderr, printed.stderr


def test_the_release_namespace_is_quorums_unless_a_value_names_another(helm: Path) -> None:
    rendered = run(helm, "template", "quorum", CHART, "--namespace", "ml-platform")
    objects = normalised(rendered.stdout, True)
    assert {k[1] for k in objects} == {"", "ml-platform"}
    operator = objects[("ClusterRoleBinding", "", "quorum-operator")]
    assert operator["subjects"][0]["namespace"] == "ml-platform"


def _atoms(rules: list[dict[str, Any]], namespace: str | None) -> set[tuple[str, str, str, str, str | None]]:
    """Each (group, resource, verb, name, namespace) a set of RBAC rules grants ('' name: any)."""
    return {
        (group, resource, verb, name, namespace)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [""]
    }


def _hook_rights(objects: list[dict[str, Any]], account: str) -> set[tuple[str, str, str, str, str | None]]:
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in objects}
    granted: set[tuple[str, str, str, str, str | None]] = set()
    for binding in (d for d in objects if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s["name"] == account for s in binding["subjects"]):
            continue
        scope = binding["metadata"].get("namespace")
        role = roles[(binding["roleRef"]["kind"], scope, binding["roleRef"]["name"])]
        granted |= _atoms(role["rules"], scope)
    return granted


def _command_rights(rules: list[Any]) -> set[tuple[str, str, str, str, str | None]]:
    return {
        (r.group, r.resource, verb, name, r.namespace)
        for r in rules
        for verb in r.verbs
        for name in r.names or ("",)
    }


def test_the_hook_identities_have_exactly_what_their_commands_list_and_only_during_the_hook(
    helm: Path,
) -> None:
    from quorum.commands import certs_ensure
    from quorum.core import removal

    rendered = helm_template(helm, "--set", "uninstall.probeNamespace=probes")
    assert rendered.returncode == 0, rendered.stderr
    objects = hooks(rendered.stdout)
    certs = [d for d in objects if "post-install" in d["metadata"]["annotations"][HOOK]]
    uninstall = [d for d in objects if d["metadata"]["annotations"][HOOK] == "pre-delete"]
    assert _hook_rights(certs, "quorum-certs-hook") == _command_rights(certs_ensure.rules(RELEASE_NAMESPACE))
    needed = removal.rights(
        removal.removal_plan(RELEASE_NAMESPACE, admission_only=True), RELEASE_NAMESPACE, "probes"
    )
    assert _hook_rights(uninstall, "quorum-uninstall-hook") == _command_rights(needed)
    for doc in objects:
        annotations = doc["metadata"]["annotations"]
        policy = set(annotations["helm.sh/hook-delete-policy"].split(","))
        if doc["kind"] == "Job":
            assert {"before-hook-creation", "hook-succeeded"} <= policy  # kept after a failure: its log
            assert doc["spec"]["template"]["spec"]["containers"][0]["command"][0] == "quorum"
        else:  # the identity and its rights: gone when the hook ends, however it ends
            assert policy == {"before-hook-creation", "hook-succeeded", "hook-failed"}, doc["metadata"][
                "name"
            ]
            assert int(annotations["helm.sh/hook-weight"]) < 0, "made before the Job"
    jobs = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["command"]
        for d in objects
        if d["kind"] == "Job"
    }
    assert jobs == {
        "quorum-certs-hook": ["quorum", "certs", "ensure", "--namespace", RELEASE_NAMESPACE, "--absent-ok"],
        "quorum-uninstall-hook": [
            "quorum",
            "uninstall",
            "--admission-only",
            "--namespace",
            RELEASE_NAMESPACE,
            "--probe-namespace",
            "probes",
        ],
    }
    # The certificate hook runs before each install and upgrade (the Secret, ahead of the
    # Deployment whose pods mount it: `helm --wait` and GitOps tools finish a first install) and
    # after (the caBundle of the configurations Helm has just made); its identity exists at each.
    assert {d["metadata"]["annotations"][HOOK] for d in certs} == {
        "pre-install,pre-upgrade,post-install,post-upgrade"
    }
    own_namespace = helm_template(
        helm, "--set", "namespace.create=true", "--set", "namespace.name=ml-platform"
    )
    assert {d["metadata"]["annotations"][HOOK] for d in hooks(own_namespace.stdout)} == {
        "pre-upgrade,post-install,post-upgrade",
        "pre-delete",
    }, "the namespace the release makes does not exist before its first install: no pre-install run"
    for job in (d for d in objects if d["kind"] == "Job"):
        template = job["spec"]["template"]
        # kwok's pod-complete Stage leaves such pods to the local plane's hook kubelet
        # (devcluster/helm.py), which runs their command; on a cluster it is only a label.
        assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "helm-hook"
        # Not system-cluster-critical: a pre-install hook runs before the ResourceQuota that
        # lets quorum's namespace use it, and 1.37's WorkloadWithJob refuses a Job's PodGroup
        # above 1000000000.
        assert "priorityClassName" not in template["spec"]
    for mode in ("certManager", "secret"):
        other = helm_template(
            helm, "--set", f"certificates.mode={mode}", "--set", "certificates.secret.caBundle=" + ca_bundle()
        )
        assert not [d for d in hooks(other.stdout) if "post-install" in d["metadata"]["annotations"][HOOK]], (
            mode
        )


def test_quorums_crds_are_kept_by_helm_uninstall_unless_asked(helm: Path) -> None:
    kept = [
        d
        for d in yaml.safe_load_all(helm_template(helm).stdout)
        if d and d["kind"] == "CustomResourceDefinition"
    ]
    assert {d["metadata"]["name"] for d in kept} == {
        "gangs.quorum.dev",
        "podgroups.scheduling.sigs.k8s.io",
        "podgroups.scheduling.x-k8s.io",
    }
    assert all(d["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for d in kept)
    # crds.keep=false: test_a_podgroup_crd_is_always_kept_and_crds_keep_is_the_gang_crds


def test_the_packaged_chart_holds_the_files_it_links_to(helm: Path, tmp_path: Path) -> None:
    """files/ links to manifests/, crds/ and dashboards/; `helm package` copies them in, so the
    packaged chart renders what the checkout does."""
    packaged = run(helm, "package", CHART, "--destination", tmp_path)
    assert packaged.returncode == 0, packaged.stderr
    (archive,) = tmp_path.glob("quorum-*.tgz")
    args = (
        "--set",
        "dashboard.enabled=true",
        "--set",
        "sunk.enabled=true",
        "--set",
        "certificates.mode=certManager",
    )
    from_archive = run(
        helm, "template", "quorum", archive, "--namespace", RELEASE_NAMESPACE, *SERVES_MAP, *args
    )
    assert from_archive.returncode == 0, from_archive.stderr
    assert from_archive.stdout == helm_template(helm, *args).stdout


@pytest.mark.parametrize("keep", [True, False])
def test_a_podgroup_crd_is_always_kept_and_crds_keep_is_the_gang_crds(helm: Path, keep: bool) -> None:
    """Helm deletes a CRD it no longer renders or uninstalls, and every object of it with it: a
    PodGroup CRD holds tenants' PodGroups, so it is kept whatever the values; the Gang CRD (quorum's
    records) follows crds.keep."""
    rendered = helm_template(helm, "--set", f"crds.keep={str(keep).lower()}")
    assert rendered.returncode == 0, rendered.stderr
    policies = {
        doc["metadata"]["name"]: (doc["metadata"].get("annotations") or {}).get("helm.sh/resource-policy")
        for doc in yaml.safe_load_all(rendered.stdout)
        if doc and doc["kind"] == "CustomResourceDefinition"
    }
    assert policies == {
        "gangs.quorum.dev": "keep" if keep else None,
        "podgroups.scheduling.sigs.k8s.io": "keep",
        "podgroups.scheduling.x-k8s.io": "keep",
    }
