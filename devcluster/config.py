"""What a local cluster instance is started with: one spec, rendered into each component's flags.

Everything a test or benchmark may change (feature gates, runtime-config, a scheduler profile,
client QPS/burst, extra flags, the node pool) is a field of `ClusterSpec`; `component_args()`
is a pure function of the spec, the ports and the instance's file layout, so it is unit-tested
without starting anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devcluster.versions import DEFAULT_RELEASE, RELEASES, Release
from quorum.core.gangs import COSCHEDULER_NAMES
from quorum.install import DEFAULT_NAMESPACE

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.64.0.0/10"  # kwok assigns pod IPs from here; large enough for benchmarks

COMPONENTS = (
    "quorum-operator",
    "etcd",
    "kube-apiserver",
    "quorum-webhooks",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
)


@dataclass(frozen=True)
class ClusterSpec:
    """How to start one named instance. Defaults are what `make up` uses."""

    name: str = "default"
    kubernetes: str = DEFAULT_RELEASE  # the minor it runs: a key of versions.RELEASES
    feature_gates: Mapping[str, bool] | None = None  # None: the release's
    runtime_config: str | None = None  # None: the release's
    static_admission: str | None = None  # None: the release's (off | protect | all; quorum.install)
    # KubeSchedulerConfiguration `profiles`; None keeps the scheduler's default profile.
    scheduler_profiles: list[dict[str, Any]] | None = None
    # Client QPS/burst of kube-scheduler and kube-controller-manager (benchmarks raise them).
    client_qps: float = 100.0
    client_burst: int = 200
    pool_file: Path | None = None  # None: the default CKS-like pool
    pool_size: int | None = None  # scale the pool to about this many nodes
    install_manifests: bool = True  # apply manifests/ (namespace, ServiceAccounts, RBAC, policies)
    webhooks: bool = True  # run quorum-webhooks and register it (off: a cluster without quorum)
    operator: bool = True  # run quorum-operator with its ServiceAccount's token
    extra_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    namespace: str = DEFAULT_NAMESPACE  # where quorum is installed (`quorum manifests --namespace`)
    slurm: bool = False  # a real Slurm cluster beside it and quorum-sunk-scheduler (docs/sunk.md)
    pod_admission: str = "policies"  # policies | webhooks (quorum.install.POD_ADMISSION_WAYS)
    # The scheduler names quorum takes besides the default scheduler's (chart values `schedulers`);
    # with `volcano`, Volcano's PodGroup CRD is created where absent, as the chart does.
    coschedulers: tuple[str, ...] = COSCHEDULER_NAMES
    placement: str = "quorum"  # quorum | kube-scheduler (quorum.core.gangs.Placer; docs/placement.md)

    @property
    def release(self) -> Release:
        return RELEASES[self.kubernetes]

    @property
    def gates(self) -> Mapping[str, bool]:
        return self.release.feature_gates if self.feature_gates is None else self.feature_gates

    @property
    def runtime(self) -> str:
        return self.release.runtime_config if self.runtime_config is None else self.runtime_config

    @property
    def static(self) -> str:
        return self.release.static_admission if self.static_admission is None else self.static_admission

    def feature_gates_flag(self) -> str:
        gates = dict(self.gates)
        if self.static != "off" and self.kubernetes == "1.36":
            gates.setdefault("ManifestBasedAdmissionControlConfig", True)  # alpha in 1.36
        return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kubernetes": self.kubernetes,
            "feature_gates": None if self.feature_gates is None else dict(self.feature_gates),
            "runtime_config": self.runtime_config,
            "static_admission": self.static_admission,
            "scheduler_profiles": self.scheduler_profiles,
            "client_qps": self.client_qps,
            "client_burst": self.client_burst,
            "pool_file": str(self.pool_file) if self.pool_file else None,
            "pool_size": self.pool_size,
            "install_manifests": self.install_manifests,
            "webhooks": self.webhooks,
            "operator": self.operator,
            "extra_args": {k: list(v) for k, v in self.extra_args.items()},
            "namespace": self.namespace,
            "slurm": self.slurm,
            "pod_admission": self.pod_admission,
            "coschedulers": list(self.coschedulers),
            "placement": self.placement,
        }


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int
    webhooks: int
    operator: int
    slurmctld: int = 0  # with `slurm`: slurmctld, slurmrestd, the SUNK scheduler's hook API
    slurmrestd: int = 0
    sunk: int = 0

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Layout:
    """Where an instance keeps its files: `.quorum/<name>/`."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def static_admission(self) -> Path:
        """The ValidatingAdmissionPolicy plugin's staticManifestsDir."""
        return self.root / "admission" / "policies"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    def kubeconfig(self, who: str) -> Path:
        return self.root / f"{who}.kubeconfig"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"


def scheduler_config(spec: ClusterSpec, kubeconfig: Path) -> str:
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {
            "kubeconfig": str(kubeconfig),
            "qps": spec.client_qps,
            "burst": spec.client_burst,
        },
        "leaderElection": {"leaderElect": False},
    }
    if spec.scheduler_profiles is not None:
        config["profiles"] = spec.scheduler_profiles
    return yaml.safe_dump(config, sort_keys=False)


# The PriorityClasses a namespace may give its pods only if a ResourceQuota there names them
# (docs/preemption.md, "Who may use which priority"): quorum orders work by priority and never
# preempts the system classes, so a tenant must not simply take one.
LIMITED_PRIORITY_CLASSES = ("system-cluster-critical", "system-node-critical")


def admission_config(static_policies: Path | None = None) -> str:
    """The apiserver's AdmissionConfiguration: pods of the limited PriorityClasses are admitted
    only where a ResourceQuota covers them; with `static_policies`, the admission policies in
    that directory are loaded from disk (manifest-based admission configuration)."""
    quota = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "ResourceQuotaConfiguration",
        "limitedResources": [
            {
                "resource": "pods",
                "matchScopes": [
                    {"scopeName": "PriorityClass", "operator": "In", "values": list(LIMITED_PRIORITY_CLASSES)}
                ],
            }
        ],
    }
    plugins: list[dict[str, Any]] = [{"name": "ResourceQuota", "configuration": quota}]
    config = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": plugins,
    }
    if static_policies is not None:
        policies = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyConfiguration",
            "staticManifestsDir": str(static_policies),
        }
        plugins.append({"name": "ValidatingAdmissionPolicy", "configuration": policies})
    return yaml.safe_dump(config, sort_keys=False)


def component_args(
    component: str,
    spec: ClusterSpec,
    ports: Ports,
    layout: Layout,
    binary: Path,
    stages: list[Path],
) -> list[str]:
    """argv of one component."""
    pki = layout.pki
    gates = spec.feature_gates_flag()
    args: list[str]
    if component == "etcd":
        peer = f"http://127.0.0.1:{ports.etcd_peer}"
        client = f"http://127.0.0.1:{ports.etcd_client}"
        args = [
            f"--name={spec.name}",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={spec.name}={peer}",
            "--unsafe-no-fsync",  # test data only: no durability needed, much faster on a VM
            "--quota-backend-bytes=8589934592",
            "--log-level=warn",
        ]
    elif component == "kube-apiserver":
        args = [
            f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            # Front-proxy (aggregation) identity: its own CA, so no client cert of the cluster
            # CA can claim to be the proxy.
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            f"--admission-control-config-file={layout.root / 'admission-config.yaml'}",
            "--allow-privileged=true",
            f"--runtime-config={spec.runtime}",
            f"--feature-gates={gates}",
            # The `kubernetes` Service's endpoint would be 127.0.0.1, which Endpoints reject.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
        ]
    elif component == "kube-controller-manager":
        kubeconfig = layout.kubeconfig("controller-manager")
        args = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            f"--feature-gates={gates}",
            f"--kube-api-qps={spec.client_qps:g}",
            f"--kube-api-burst={spec.client_burst}",
            "--profiling=false",
        ]
    elif component == "kube-scheduler":
        kubeconfig = layout.kubeconfig("scheduler")
        args = [
            f"--config={layout.root / 'scheduler-config.yaml'}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.scheduler}",
            f"--feature-gates={gates}",
            "--profiling=false",
        ]
    elif component == "kwok":
        args = [
            f"--kubeconfig={layout.kubeconfig('kwok')}",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{ports.kwok}",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            *[f"--config={s}" for s in stages],
        ]
    elif component == "quorum-webhooks":
        # `binary` is the Python interpreter; the server makes its own CA in webhooks-pki/.
        return [
            str(binary),
            "-m",
            "quorum.webhooks.main",
            "--host=127.0.0.1",
            f"--port={ports.webhooks}",
            f"--dev-certs={layout.root / 'webhooks-pki'}",
            "--log-level=WARNING",
            *spec.extra_args.get(component, ()),
        ]
    elif component == "quorum-sunk-scheduler":
        return [
            str(binary),
            "-m",
            "quorum.sunk.main",
            f"--kubeconfig={layout.kubeconfig('quorum-sunk-scheduler')}",
            f"--address=127.0.0.1:{ports.sunk}",
            *spec.extra_args.get(component, ()),
        ]
    elif component == "quorum-operator":
        return [
            str(binary),
            "-m",
            "quorum.operator.main",
            f"--kubeconfig={layout.kubeconfig('quorum-operator')}",
            f"--health-address=127.0.0.1:{ports.operator}",
            *spec.extra_args.get(component, ()),
        ]
    else:
        raise ValueError(f"unknown component {component!r}")
    return [str(binary), *args, *spec.extra_args.get(component, ())]


def spec_from_json(data: Mapping[str, Any]) -> ClusterSpec:
    """Inverse of `ClusterSpec.to_json` (what state.json records)."""
    return ClusterSpec(
        name=data["name"],
        kubernetes=data.get("kubernetes", "1.36"),
        feature_gates=None if data["feature_gates"] is None else dict(data["feature_gates"]),
        runtime_config=data["runtime_config"],
        static_admission=data.get("static_admission"),
        scheduler_profiles=data["scheduler_profiles"],
        client_qps=data["client_qps"],
        client_burst=data["client_burst"],
        pool_file=Path(data["pool_file"]) if data["pool_file"] else None,
        pool_size=data["pool_size"],
        install_manifests=data["install_manifests"],
        webhooks=data.get("webhooks", True),
        operator=data.get("operator", True),
        extra_args={k: tuple(v) for k, v in data["extra_args"].items()},
        namespace=data.get("namespace", DEFAULT_NAMESPACE),
        slurm=data.get("slurm", False),
        pod_admission=data.get("pod_admission", "policies"),
        coschedulers=tuple(data.get("coschedulers", COSCHEDULER_NAMES)),
        placement=data.get("placement", "quorum"),
    )


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
