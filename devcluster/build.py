"""Build the control plane's binaries from Go modules, once, into a cache outside the repo.

Layout of the cache (`~/.cache/quorum` unless `QUORUM_CACHE` says otherwise)::

    bin/<pins.cache_key>/       kube-apiserver kube-controller-manager kube-scheduler kubectl
                                etcd kwok, stages/*.yaml (kwok's own Stage files), .complete
    build/<pins.cache_key>/     the small Go build modules (go.mod, go.sum) and build logs
    bin/helm-<version>/helm     Helm, for quorum's chart: one per Helm pin, whatever Kubernetes runs
    build/helm-<version>/       its build log

A build holds an exclusive `flock` on `bin/<key>.lock`, so two `make` runs never race; the
second waits and then finds `.complete`. Go's own module and build caches (`go env GOMODCACHE`,
`GOCACHE`) are reused across versions.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.versions import (
    ALL_BINARIES,
    HELM_MODULE,
    HELM_VERSION,
    KUBERNETES_BINARIES,
    MIN_GO_VERSION,
    PINS,
    Pins,
)

# kwok's Stage files we run with (paths inside the sigs.k8s.io/kwok module).
KWOK_STAGE_FILES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)

ETCD_MODULES = ("api/v3", "client/pkg/v3", "client/v3", "pkg/v3")


class BuildError(RuntimeError):
    """A build step failed; the message says which and how to fix it."""


def cache_root() -> Path:
    return Path(os.environ.get("QUORUM_CACHE", Path.home() / ".cache" / "quorum"))


@dataclass(frozen=True)
class BinaryCache:
    pins: Pins = PINS
    root: Path = field(default_factory=cache_root)

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin" / self.pins.cache_key

    @property
    def build_dir(self) -> Path:
        return self.root / "build" / self.pins.cache_key

    @property
    def stages_dir(self) -> Path:
        return self.bin_dir / "stages"

    def path(self, binary: str) -> Path:
        return self.bin_dir / binary

    def is_complete(self) -> bool:
        return (self.bin_dir / ".complete").exists() and all(self.path(b).exists() for b in ALL_BINARIES)


@dataclass(frozen=True)
class HelmCache:
    """Where the pinned Helm is built: a directory of its own, independent of the Kubernetes
    release (the chart is rendered and installed the same way on each)."""

    version: str = HELM_VERSION
    root: Path = field(default_factory=cache_root)

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin" / f"helm-{self.version}"

    @property
    def build_dir(self) -> Path:
        return self.root / "build" / f"helm-{self.version}"

    @property
    def helm(self) -> Path:
        return self.bin_dir / "helm"


def parse_go_version(output: str) -> tuple[int, int, int] | None:
    """`go version go1.26.8 linux/amd64` -> (1, 26, 8); None if it cannot be read."""
    match = re.search(r"\bgo(\d+)\.(\d+)(?:\.(\d+))?", output)
    if not match:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


def check_go() -> str:
    """Return the path of a usable `go`, or raise a BuildError that says how to get one."""
    want = ".".join(map(str, MIN_GO_VERSION))
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            f"`go` was not found on PATH. quorum builds its local control plane from Go "
            f"modules and needs Go >= {want}. Install it from https://go.dev/dl/ "
            f"(tar -C /usr/local -xzf go{want}.linux-amd64.tar.gz; "
            f"export PATH=$PATH:/usr/local/go/bin)."
        )
    out = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout
    have = parse_go_version(out)
    if have is None or have < MIN_GO_VERSION:
        raise BuildError(
            f"{go} is {out.strip() or 'unreadable'}; quorum needs Go >= {want} (Kubernetes "
            f"1.36 and kwok v0.8 declare `go 1.26.0`). Install a newer Go from https://go.dev/dl/, "
            f"or let this one fetch the toolchain: export GOTOOLCHAIN=go{want}."
        )
    return go


def kubernetes_build_module(pins: Pins, staging_modules: list[str]) -> str:
    """go.mod of a module that requires k8s.io/kubernetes and pins its staging modules.

    k8s.io/kubernetes requires every staging module as v0.0.0 and replaces it with
    ./staging/src/...; replaces of a dependency are ignored, so we give our own.
    """
    replaces = "\n".join(f"\t{m} => {m} {pins.staging}" for m in sorted(staging_modules))
    return (
        "module quorum.dev/devcluster/build/kubernetes\n\n"
        "go 1.26\n\n"
        f"require k8s.io/kubernetes {pins.kubernetes}\n\n"
        f"replace (\n{replaces}\n)\n"
    )


def etcd_build_module(pins: Pins) -> str:
    """go.mod that builds etcd's server (its own go.mod replaces siblings with ../ paths)."""
    replaces = "\n".join(f"\tgo.etcd.io/etcd/{m} => go.etcd.io/etcd/{m} {pins.etcd}" for m in ETCD_MODULES)
    return (
        "module quorum.dev/devcluster/build/etcd\n\n"
        "go 1.26\n\n"
        f"require go.etcd.io/etcd/server/v3 {pins.etcd}\n\n"
        f"replace (\n{replaces}\n)\n"
    )


def staging_modules_of(kubernetes_go_mod: str) -> list[str]:
    """The `k8s.io/<x>` modules that k8s.io/kubernetes's go.mod replaces with ./staging."""
    return sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", kubernetes_go_mod, re.M)))


def kubernetes_ldflags(pins: Pins, commit: str, build_date: str) -> str:
    """The -X flags that hack/lib/version.sh sets, so `kubectl version` tells the truth."""
    major, minor, _ = pins.kubernetes.lstrip("v").split(".")
    values = {
        "gitVersion": pins.kubernetes,
        "gitMajor": major,
        "gitMinor": minor,
        "gitCommit": commit,
        "gitTreeState": "clean",
        "buildDate": build_date,
    }
    flags = [
        f"-X {pkg}.{key}={value}"
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for key, value in values.items()
    ]
    return " ".join(["-s", "-w", *flags])


def kubernetes_minor_of(go_mod: str) -> tuple[str, str]:
    """The Kubernetes release a Go module is built against, from its k8s.io/client-go
    requirement (v0.37.0 -> ("1", "37")), as Helm's Makefile reads it."""
    match = re.search(r"^\s*k8s\.io/client-go v0\.(\d+)\.", go_mod, re.M)
    if not match:
        raise BuildError("the Helm module requires no k8s.io/client-go v0.x: its Kubernetes is unknown")
    return "1", match[1]


def helm_ldflags(version: str, kubernetes: tuple[str, str]) -> str:
    """What Helm's Makefile sets: its version (`helm version`), and the Kubernetes version that
    `helm template` and `helm lint` assume without a cluster (else v1.20, older than any chart's
    kubeVersion here)."""
    major, minor = kubernetes
    flags = [
        f"-X {HELM_MODULE}/internal/version.version={version}",
        f"-X {HELM_MODULE}/internal/version.gitTreeState=clean",
        *(
            f"-X {HELM_MODULE}/pkg/{pkg}.k8sVersion{part}={value}"
            for pkg in ("lint/rules", "chartutil")
            for part, value in (("Major", major), ("Minor", minor))
        ),
    ]
    return " ".join(["-s", "-w", *flags])


def helm_install_command(go: str, version: str, ldflags: str) -> list[str]:
    return [go, "install", "-trimpath", "-ldflags", ldflags, f"{HELM_MODULE}/cmd/helm@{version}"]


class Builder:
    def __init__(self, cache: BinaryCache, log: Path | None = None) -> None:
        self.cache = cache
        self.go = check_go()
        self.env = {**os.environ, "GOFLAGS": "-buildvcs=false -mod=mod"}
        self.log = log or cache.build_dir / "build.log"

    def run(self, args: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> str:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as log:
            log.write(f"\n$ (cd {cwd}) {' '.join(args)}\n")
            log.flush()
            proc = subprocess.run(
                args,
                cwd=cwd,
                env={**self.env, **(extra_env or {})},
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                check=False,
            )
        if proc.returncode != 0:
            tail = "\n".join(self.log.read_text().splitlines()[-25:])
            raise BuildError(
                f"`{' '.join(args)}` failed (exit {proc.returncode}); last lines of {self.log}:\n{tail}"
            )
        return proc.stdout

    def module_info(self, module: str, cwd: Path) -> dict[str, object]:
        info: dict[str, object] = json.loads(self.run([self.go, "mod", "download", "-json", module], cwd))
        return info

    def build_kubernetes(self, out: Path) -> None:
        pins = self.cache.pins
        work = self.cache.build_dir / "kubernetes"
        work.mkdir(parents=True, exist_ok=True)
        info = self.module_info(f"k8s.io/kubernetes@{pins.kubernetes}", work)
        go_mod = Path(str(info["GoMod"])).read_text()
        (work / "go.mod").write_text(kubernetes_build_module(pins, staging_modules_of(go_mod)))
        origin = info.get("Origin")
        commit = str(origin.get("Hash", "")) if isinstance(origin, dict) else ""
        build_date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ldflags = kubernetes_ldflags(pins, commit or "unknown", build_date)
        packages = [f"k8s.io/kubernetes/cmd/{b}" for b in KUBERNETES_BINARIES]
        self.run([self.go, "build", "-ldflags", ldflags, "-o", f"{out}/", *packages], work)

    def build_etcd(self, out: Path) -> None:
        work = self.cache.build_dir / "etcd"
        work.mkdir(parents=True, exist_ok=True)
        (work / "go.mod").write_text(etcd_build_module(self.cache.pins))
        self.run(
            [
                self.go,
                "build",
                "-ldflags",
                "-s -w",
                "-o",
                str(out / "etcd"),
                "go.etcd.io/etcd/server/v3",
            ],
            work,
        )

    def build_kwok(self, out: Path) -> None:
        pins = self.cache.pins
        work = self.cache.build_dir / "kwok"
        work.mkdir(parents=True, exist_ok=True)
        ldflags = f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={pins.kwok.lstrip('v')}"
        self.run(
            [self.go, "install", "-ldflags", ldflags, f"sigs.k8s.io/kwok/cmd/kwok@{pins.kwok}"],
            work,
            {"GOBIN": str(out), "GOFLAGS": "-buildvcs=false"},
        )
        info = self.module_info(f"sigs.k8s.io/kwok@{pins.kwok}", work)
        stages = out / "stages"
        stages.mkdir(exist_ok=True)
        for rel in KWOK_STAGE_FILES:
            shutil.copyfile(Path(str(info["Dir"])) / rel, stages / Path(rel).name)

    def build_helm(self, out: Path, version: str) -> None:
        work = self.log.parent
        work.mkdir(parents=True, exist_ok=True)
        info = self.module_info(f"{HELM_MODULE}@{version}", work)
        ldflags = helm_ldflags(version, kubernetes_minor_of(Path(str(info["GoMod"])).read_text()))
        self.run(
            helm_install_command(self.go, version, ldflags),
            work,
            {"GOBIN": str(out), "GOFLAGS": "-buildvcs=false"},
        )


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another build holding {path}", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_binaries(cache: BinaryCache | None = None, quiet: bool = False) -> BinaryCache:
    """Build every pinned binary unless the cache already has them; return the cache."""
    cache = cache or BinaryCache()
    if cache.is_complete():
        return cache
    with exclusive_lock(cache.root / "bin" / f"{cache.pins.cache_key}.lock"):
        if cache.is_complete():  # another process built them while we waited
            return cache
        staging = cache.bin_dir.with_name(cache.bin_dir.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        # The three builds at once, each with its own log: one build's module downloads and
        # single-threaded link overlap another's compilation (docs/devcluster.md has the times).
        # Go's module and build caches are safe to share between concurrent builds.
        steps = {
            "etcd": Builder.build_etcd,
            "kwok": Builder.build_kwok,
            "kubernetes": Builder.build_kubernetes,
        }

        def build(what: str) -> None:
            builder = Builder(cache, cache.build_dir / f"{what}.log")
            started = time.monotonic()
            if not quiet:  # one write per line: the three threads print at once
                print(f"building {what} (log: {builder.log}) ...\n", end="", file=sys.stderr, flush=True)
            steps[what](builder, staging)
            if not quiet:
                print(f"  {what}: {time.monotonic() - started:.0f}s\n", end="", file=sys.stderr, flush=True)

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(steps)) as pool:
            for done in [pool.submit(build, what) for what in steps]:
                done.result()  # the first failure, with its log's last lines
        (staging / ".complete").write_text(json.dumps(cache.pins.__dict__) + "\n")
        shutil.rmtree(cache.bin_dir, ignore_errors=True)
        staging.rename(cache.bin_dir)
    return cache


def ensure_helm(cache: HelmCache | None = None, quiet: bool = False) -> Path:
    """Build the pinned Helm unless the cache has it; return the path of `helm`."""
    cache = cache or HelmCache()
    if cache.helm.exists():
        return cache.helm
    with exclusive_lock(cache.root / "bin" / f"helm-{cache.version}.lock"):
        if cache.helm.exists():
            return cache.helm
        builder = Builder(BinaryCache(root=cache.root), log=cache.build_dir / "build.log")
        staging = cache.bin_dir.with_name(cache.bin_dir.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        started = time.monotonic()
        if not quiet:
            print(f"building helm {cache.version} (log: {builder.log}) ...", file=sys.stderr, flush=True)
        builder.build_helm(staging, cache.version)
        if not quiet:
            print(f"  helm: {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
        shutil.rmtree(cache.bin_dir, ignore_errors=True)
        staging.rename(cache.bin_dir)
    return cache.helm
