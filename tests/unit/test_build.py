"""Pins, build modules and the Go check of the binary builder (no Go build runs here)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster.build import (
    BinaryCache,
    BuildError,
    HelmCache,
    check_go,
    etcd_build_module,
    helm_install_command,
    helm_ldflags,
    kubernetes_build_module,
    kubernetes_ldflags,
    kubernetes_minor_of,
    parse_go_version,
    staging_modules_of,
)
from devcluster.versions import HELM_MODULE, HELM_VERSION, RELEASES, Pins

KUBERNETES_GO_MOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
\tk8s.io/streaming v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/cri-streaming => ./staging/src/k8s.io/cri-streaming
\tk8s.io/streaming => ./staging/src/k8s.io/streaming
\tgithub.com/foo/bar => github.com/foo/bar v1.0.0
)
"""


def test_staging_version_follows_kubernetes_version() -> None:
    assert Pins(kubernetes="v1.36.4").staging == "v0.36.4"
    assert RELEASES["1.36"].pins.kubernetes.startswith("v1.36.")
    assert RELEASES["1.36"].pins.etcd.startswith("v3.6.")


def test_each_release_has_the_gates_of_its_minor() -> None:
    """1.37 merged GangScheduling and WorkloadAwarePreemption into GenericWorkload: an apiserver
    given a gate name it does not know does not start, so the gates go with the release."""
    assert "GangScheduling" in RELEASES["1.36"].feature_gates
    modern = RELEASES["1.37"]
    assert modern.pins.kubernetes.startswith("v1.37.") and modern.pins.etcd.startswith("v3.7.")
    assert modern.pins.staging.startswith("v0.37.")
    assert not {"GangScheduling", "WorkloadAwarePreemption"} & set(modern.feature_gates)
    assert "api/beta=true" in modern.runtime_config, "v1beta1 Workload and PodGroup are beta, off by default"


def test_the_release_is_1_37_unless_quorum_k8s_says_otherwise() -> None:
    probe = (
        "from devcluster import versions, config; "
        "print(versions.PINS.kubernetes, config.ClusterSpec().runtime, config.ClusterSpec().kubernetes)"
    )
    root = str(Path(__file__).resolve().parents[2])
    for chosen, want in (
        ("", ["v1.37.2", "api/alpha=true,api/beta=true", "1.37"]),
        ("1.36", ["v1.36.4", "api/alpha=true", "1.36"]),
    ):
        env = {**os.environ, "QUORUM_K8S": chosen, "PYTHONPATH": root}
        out = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == want


def test_cache_key_changes_with_any_pin() -> None:
    keys = {
        Pins().cache_key,
        Pins(kubernetes="v1.36.3").cache_key,
        Pins(etcd="v3.6.15").cache_key,
        Pins(kwok="v0.7.0").cache_key,
    }
    assert len(keys) == 4


def test_staging_modules_are_read_from_kubernetes_go_mod() -> None:
    assert staging_modules_of(KUBERNETES_GO_MOD) == [
        "k8s.io/api",
        "k8s.io/cri-streaming",
        "k8s.io/streaming",
    ]


def test_kubernetes_build_module_replaces_every_staging_module() -> None:
    text = kubernetes_build_module(Pins(kubernetes="v1.36.4"), staging_modules_of(KUBERNETES_GO_MOD))
    assert "require k8s.io/kubernetes v1.36.4" in text
    for module in ("k8s.io/api", "k8s.io/cri-streaming", "k8s.io/streaming"):
        assert f"\t{module} => {module} v0.36.4\n" in text
    assert "github.com/foo/bar" not in text


def test_etcd_build_module_replaces_its_sibling_modules() -> None:
    text = etcd_build_module(Pins(etcd="v3.6.16"))
    assert "require go.etcd.io/etcd/server/v3 v3.6.16" in text
    assert "go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 v3.6.16" in text
    assert "go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 v3.6.16" in text


def test_ldflags_set_the_real_version_for_servers_and_kubectl() -> None:
    flags = kubernetes_ldflags(Pins(kubernetes="v1.36.4"), "abc123", "2026-11-22T00:00:00Z")
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {pkg}.gitVersion=v1.36.4" in flags
        assert f"-X {pkg}.gitMinor=36" in flags
        assert f"-X {pkg}.gitCommit=abc123" in flags


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("go version go1.26.8 linux/amd64", (1, 26, 8)),
        ("go version go1.26 linux/amd64", (1, 26, 0)),
        ("go version go1.21.0 darwin/arm64", (1, 21, 0)),
        ("garbage", None),
    ],
)
def test_parse_go_version(output: str, expected: tuple[int, int, int] | None) -> None:
    assert parse_go_version(output) == expected


def test_missing_go_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildError, match=r"`go` was not found on PATH.*https://go.dev/dl/"):
        check_go()


def test_old_go_says_which_version_is_needed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "go"
    fake.write_text("#!/bin/sh\necho 'go version go1.20.4 linux/amd64'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")
    with pytest.raises(BuildError, match=r"go1\.20\.4.*needs Go >= 1\.26\.0.*GOTOOLCHAIN"):
        check_go()


def test_helm_is_pinned_and_built_from_its_go_module_with_its_version_and_kubernetes() -> None:
    assert HELM_MODULE == "helm.sh/helm/v3" and HELM_VERSION == "v3.22.0"
    go_mod = "module helm.sh/helm/v3\n\nrequire (\n\tk8s.io/api v0.37.0\n\tk8s.io/client-go v0.37.0\n)\n"
    assert kubernetes_minor_of(go_mod) == ("1", "37")
    with pytest.raises(BuildError, match=r"k8s\.io/client-go"):
        kubernetes_minor_of("module x\n")
    flags = helm_ldflags("v3.22.0", ("1", "37"))
    assert "-X helm.sh/helm/v3/internal/version.version=v3.22.0" in flags
    for pkg in ("lint/rules", "chartutil"):  # `helm template` and `helm lint` assume Kubernetes 1.37
        assert f"-X helm.sh/helm/v3/pkg/{pkg}.k8sVersionMinor=37" in flags
        assert f"-X helm.sh/helm/v3/pkg/{pkg}.k8sVersionMajor=1" in flags
    command = helm_install_command("/usr/bin/go", "v3.22.0", flags)
    assert command[:2] == ["/usr/bin/go", "install"] and command[-1] == "helm.sh/helm/v3/cmd/helm@v3.22.0"
    assert command[command.index("-ldflags") + 1] == flags


def test_helm_is_cached_apart_from_any_kubernetes_release(tmp_path: Path) -> None:
    helm = HelmCache(root=tmp_path)
    assert helm.helm == tmp_path / "bin" / f"helm-{HELM_VERSION}" / "helm"
    kubernetes_dirs = {BinaryCache(release.pins, tmp_path).bin_dir for release in RELEASES.values()}
    assert helm.bin_dir not in kubernetes_dirs and helm.bin_dir.parent == tmp_path / "bin"
    assert HelmCache("v3.21.0", tmp_path).bin_dir != helm.bin_dir
