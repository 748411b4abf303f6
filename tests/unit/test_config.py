"""Rendering a ClusterSpec into each component's flags."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from devcluster.cluster import STAGES, kwok_stages
from devcluster.config import (
    COMPONENTS,
    ClusterSpec,
    Layout,
    Ports,
    component_args,
    scheduler_config,
    spec_from_json,
)

PORTS = Ports(2379, 2380, 6443, 10257, 10259, 10247, 8443, 8080)
LAYOUT = Layout(Path("/tmp/q/default"))


def args(component: str, spec: ClusterSpec) -> list[str]:
    return component_args(
        component,
        spec,
        PORTS,
        LAYOUT,
        Path(f"/bin/{component}"),
        [Path("/s/a.yaml"), Path("/s/b.yaml")],
    )


def flag(argv: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    assert len(values) == 1, (name, values)
    return values[0]


def test_same_feature_gates_for_apiserver_scheduler_and_controller_manager() -> None:
    for release, want in (
        (
            "1.36",
            "GangScheduling=true,GenericWorkload=true,TopologyAwareWorkloadScheduling=true,WorkloadAwarePreemption=true",
        ),
        (
            "1.37",
            "CompositePodGroup=true,DRAWorkloadResourceClaims=true,GenericWorkload=true,"
            "PodGroupPreemptionPolicy=true,TopologyAwareWorkloadScheduling=true,WorkloadWithJob=true",
        ),
    ):
        spec = ClusterSpec(kubernetes=release)
        gates = {
            flag(args(c, spec), "feature-gates")
            for c in ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
        }
        assert gates == {want}


def test_other_gates_and_runtime_config() -> None:
    spec = ClusterSpec(feature_gates={"GenericWorkload": False}, runtime_config="api/alpha=false")
    apiserver = args("kube-apiserver", spec)
    assert flag(apiserver, "feature-gates") == "GenericWorkload=false"
    assert flag(apiserver, "runtime-config") == "api/alpha=false"


def test_apiserver_is_local_rbac_and_signs_service_account_tokens() -> None:
    apiserver = args("kube-apiserver", ClusterSpec())
    assert flag(apiserver, "bind-address") == "127.0.0.1"
    assert flag(apiserver, "secure-port") == "6443"
    assert flag(apiserver, "authorization-mode") == "RBAC"
    assert flag(apiserver, "etcd-servers") == "http://127.0.0.1:2379"
    assert flag(apiserver, "service-account-signing-key-file").endswith("pki/sa.key")


def test_client_qps_and_burst_are_set_in_one_place() -> None:
    spec = ClusterSpec(client_qps=500, client_burst=1000)
    kcm = args("kube-controller-manager", spec)
    assert flag(kcm, "kube-api-qps") == "500"
    assert flag(kcm, "kube-api-burst") == "1000"
    config = yaml.safe_load(scheduler_config(spec, Path("/k")))
    assert config["clientConnection"] == {"kubeconfig": "/k", "qps": 500, "burst": 1000}


def test_scheduler_profiles_are_passed_through() -> None:
    profiles = [
        {
            "schedulerName": "default-scheduler",
            "plugins": {"multiPoint": {"disabled": [{"name": "GangScheduling"}]}},
        }
    ]
    config = yaml.safe_load(scheduler_config(ClusterSpec(scheduler_profiles=profiles), Path("/k")))
    assert config["profiles"] == profiles
    assert "profiles" not in yaml.safe_load(scheduler_config(ClusterSpec(), Path("/k")))


def test_kwok_gets_every_stage_and_manages_only_fake_nodes() -> None:
    kwok = args("kwok", ClusterSpec())
    assert [a for a in kwok if a.startswith("--config=")] == [
        "--config=/s/a.yaml",
        "--config=/s/b.yaml",
    ]
    assert flag(kwok, "manage-nodes-with-annotation-selector") == "kwok.x-k8s.io/node=fake"


def test_extra_args_go_last_to_their_component_only() -> None:
    spec = ClusterSpec(extra_args={"kube-apiserver": ("--v=4",)})
    assert args("kube-apiserver", spec)[-1] == "--v=4"
    assert all("--v=4" not in args(c, spec) for c in COMPONENTS if c != "kube-apiserver")


@given(
    st.builds(
        ClusterSpec,
        name=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
        feature_gates=st.dictionaries(st.sampled_from(["GenericWorkload", "GangScheduling"]), st.booleans()),
        client_qps=st.floats(min_value=1, max_value=1e4),
        client_burst=st.integers(min_value=1, max_value=10**5),
        pool_size=st.none() | st.integers(min_value=3, max_value=10**4),
    )
)
def test_spec_survives_state_json(spec: ClusterSpec) -> None:
    assert spec_from_json(spec.to_json()) == spec


def test_kwok_gets_quorums_stages_and_its_own_where_quorum_has_none(tmp_path: Path) -> None:
    for name in ("pod-ready.yaml", "pod-complete.yaml"):
        (tmp_path / name).write_text("kind: Stage\n")
    stages = kwok_stages(tmp_path)
    assert tmp_path / "pod-ready.yaml" in stages
    assert STAGES / "pod-complete.yaml" in stages and tmp_path / "pod-complete.yaml" not in stages
    assert STAGES / "pod-complete-bare.yaml" in stages  # bare pods that run for a set time
