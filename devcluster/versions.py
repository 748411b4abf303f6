"""The one place that pins every binary of the local control plane.

Kubernetes: the newest 1.36 patch whose module the Go proxy serves *and* the checksum database
(sum.golang.org) knows. On 2026-11-22 the proxy answered for k8s.io/kubernetes v1.36.5 but
sum.golang.org did not (404), so Go refuses to verify it; v1.36.4 is the newest verifiable one.
The staging modules (k8s.io/api, k8s.io/client-go, ...) are released as v0.<minor>.<patch>.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

KUBERNETES_VERSION = "v1.36.4"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
# Helm, for quorum's chart (charts/quorum): built from its Go module like the rest and cached in a
# directory of its own, whatever Kubernetes release runs. v3, not v4: Helm 4 installs the charts
# Helm 3 does (apiVersion v2), not always the other way round, and v3 is what most platforms'
# tooling still runs, so testing with it keeps the chart good for both.
HELM_MODULE = "helm.sh/helm/v3"
HELM_VERSION = "v3.22.0"

# kwok v0.8 and k8s.io/kubernetes v1.36 and v1.37 all declare `go 1.26.0`.
MIN_GO_VERSION = (1, 26, 0)

KUBERNETES_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
ALL_BINARIES = (*KUBERNETES_BINARIES, "etcd", "kwok")


@dataclass(frozen=True)
class Pins:
    kubernetes: str = KUBERNETES_VERSION
    etcd: str = ETCD_VERSION
    kwok: str = KWOK_VERSION

    @property
    def staging(self) -> str:
        """The staging modules' version that goes with `kubernetes` (v1.36.4 -> v0.36.4)."""
        major, minor, patch = self.kubernetes.lstrip("v").split(".")
        assert major == "1", self.kubernetes
        return f"v0.{minor}.{patch}"

    @property
    def cache_key(self) -> str:
        """Directory name under the binary cache: readable, and unique per set of pins."""
        text = f"k8s-{self.kubernetes}_etcd-{self.etcd}_kwok-{self.kwok}"
        return f"{text}_{hashlib.sha256(text.encode()).hexdigest()[:6]}"


@dataclass(frozen=True)
class Release:
    """One Kubernetes minor the local control plane can run: its pins, and the feature gates and
    runtime-config that apiserver, controller-manager and scheduler all get for Workload Aware
    Scheduling (docs/architecture.md, "The local control plane")."""

    pins: Pins
    feature_gates: dict[str, bool]
    runtime_config: str
    # quorum's policies the apiserver loads from its disk (manifest-based admission, beta in 1.37):
    # off | protect (quorum's self-protection) | all (its protective policies too).
    static_admission: str = "off"


RELEASES: dict[str, Release] = {
    "1.36": Release(
        Pins(),
        {
            "GenericWorkload": True,
            "GangScheduling": True,
            "TopologyAwareWorkloadScheduling": True,
            "WorkloadAwarePreemption": True,
        },
        "api/alpha=true",
    ),
    # 1.37 merged GangScheduling and WorkloadAwarePreemption into GenericWorkload; Workload and
    # PodGroup are served at v1beta1 (beta, off by default) and v1alpha3 (with the alpha
    # CompositePodGroup), no longer at v1alpha2.
    "1.37": Release(
        Pins("v1.37.2", "v3.7.3", "v0.8.0"),
        {
            "GenericWorkload": True,
            "TopologyAwareWorkloadScheduling": True,
            "CompositePodGroup": True,
            "PodGroupPreemptionPolicy": True,
            "WorkloadWithJob": True,
            "DRAWorkloadResourceClaims": True,  # beta, off by default: PodGroup.spec.resourceClaims
        },
        "api/alpha=true,api/beta=true",
        "protect",
    ),
}
LATEST = "1.37"
# `make up K8S=1.36` (QUORUM_K8S) runs another minor; the default is the latest.
DEFAULT_RELEASE = os.environ.get("QUORUM_K8S") or LATEST
if DEFAULT_RELEASE not in RELEASES:
    raise SystemExit(
        f"QUORUM_K8S={DEFAULT_RELEASE}: the local control plane runs one of {', '.join(RELEASES)}"
    )
PINS = RELEASES[DEFAULT_RELEASE].pins
