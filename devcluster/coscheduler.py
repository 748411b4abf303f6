"""The peer to compare with: scheduler-plugins' Coscheduling, run as a second scheduler named
`cw-coscheduler` (CoreWeave's CoScheduler, seed 001, is this plugin).

scheduler-plugins has no Kubernetes 1.36 release; v0.34.7 is the newest release the Go proxy
serves (no v0.35/v0.36, and no commit lookups). Built as released, it is a kube-scheduler 1.34:
two minor versions behind a 1.36 apiserver, outside the supported skew (one). Against 1.35 or
1.36 it does not compile, because Kubernetes 1.35 moved the framework's interfaces (Handle,
PermitPlugin, SharedLister, ...) from k8s.io/kubernetes/pkg/scheduler/framework to the staging
module k8s.io/kube-scheduler/framework. So the build:

- copies the released module, and in the Coscheduling plugin's Go files (tests aside) renames
  `framework.X` to `fwk.X` for every X that now lives only in the staging package (the plugin
  already imports it as `fwk`); nothing else changes (`port_moved_framework_names`);
- builds it in a small module that requires k8s.io/kubernetes 1.36 with every staging module
  replaced by its v0.36.x release (as for Kubernetes itself), controller-runtime v0.24 (the
  v0.22 it asks for does not compile against client-go v0.36), and the copy;
- has a main package that registers only Coscheduling (upstream's registers fourteen plugins).

Its PodGroup CRD (`scheduling.x-k8s.io/v1alpha1`) comes from the same module. Not part of
`make test`: only the benchmarks use it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devcluster.build import (
    BinaryCache,
    BuildError,
    check_go,
    exclusive_lock,
    kubernetes_build_module,
    staging_modules_of,
)
from devcluster.cluster import ClusterError, Instance, free_ports
from devcluster.kubeconfig import probe
from devcluster.process import ProcessRecord, is_alive, spawn, stop, tail

SCHEDULER_PLUGINS_VERSION = "v0.34.7"  # newest release served on 2026-11-23 (no v0.35/v0.36)
# scheduler-plugins v0.34.7 asks for controller-runtime v0.22, which does not compile against
# client-go v0.36; v0.24 is controller-runtime's release for Kubernetes 1.36.
CONTROLLER_RUNTIME_VERSION = "v0.24.1"
SCHEDULER_NAME = "cw-coscheduler"
PLUGIN = "Coscheduling"
CRD_PATH = "manifests/coscheduling/crd.yaml"
# Seed 001's PodGroup example sets scheduleTimeoutSeconds: 60, scheduler-plugins' default.
PERMIT_WAITING_SECONDS = 60

PLUGIN_DIR = "pkg/coscheduling"
OLD_FRAMEWORK = "k8s.io/kubernetes/pkg/scheduler/framework"
STAGING_FRAMEWORK = "k8s.io/kube-scheduler/framework"

# scheduler-plugins' PodGroup controller, as its chart runs it beside the scheduler: it writes
# the PodGroups' status (phase, running, succeeded, ...). Upstream's main also starts the
# ElasticQuota controller (whose CRD this comparison does not install) and drops its --qps and
# --burst (it builds the manager from a fresh config); this one runs the PodGroup controller
# alone, with the client QPS/burst it is given.
CONTROLLER_NAME = "cw-coscheduler-controller"
SOURCES = Path(__file__).parent / "data" / "cw-coscheduler"  # the two main packages (Go)


@dataclass(frozen=True)
class CoschedulerBuild:
    binary: Path
    crd: Path
    controller: Path

    def exists(self) -> bool:
        return all(p.exists() for p in (self.binary, self.crd, self.controller))


def build_module(cache: BinaryCache, staging_modules: list[str]) -> str:
    """go.mod of the build module: Kubernetes' build module plus scheduler-plugins."""
    base = kubernetes_build_module(cache.pins, staging_modules)
    base = base.replace(
        "module quorum.dev/devcluster/build/kubernetes", "module quorum.dev/build/cw-coscheduler"
    )
    return base.replace(
        f"require k8s.io/kubernetes {cache.pins.kubernetes}",
        f"require (\n\tk8s.io/kubernetes {cache.pins.kubernetes}\n"
        f"\tsigs.k8s.io/controller-runtime {CONTROLLER_RUNTIME_VERSION}\n"
        f"\tsigs.k8s.io/scheduler-plugins {SCHEDULER_PLUGINS_VERSION}\n)",
    ).replace("replace (\n", "replace (\n\tsigs.k8s.io/scheduler-plugins => ./scheduler-plugins\n", 1)


def exported_names(go_sources: list[str]) -> set[str]:
    """Exported top-level names (types, funcs, consts, vars) declared in these Go files."""
    names: set[str] = set()
    for text in go_sources:
        names |= set(re.findall(r"^(?:type|func|const|var) ([A-Z]\w*)", text, re.M))
        names |= set(re.findall(r"^\t([A-Z]\w*)\b[^(\n]*$", text, re.M))  # in const/var/type blocks
    return names


def port_moved_framework_names(source: str, moved: set[str]) -> str:
    """`framework.X` -> `fwk.X` for the names that moved to the staging framework package, and
    the old import dropped when nothing uses it any more."""
    ported = re.sub(r"\bframework\.([A-Z]\w*)", lambda m: f"fwk.{m[1]}" if m[1] in moved else m[0], source)
    if not re.search(r"\bframework\.", ported):
        ported = re.sub(rf'^\s*"{re.escape(OLD_FRAMEWORK)}"\n', "", ported, flags=re.M)
    return ported


def go_files(directory: Path) -> list[Path]:
    return [p for p in sorted(directory.rglob("*.go")) if not p.name.endswith("_test.go")]


def port_plugin(module: Path, kubernetes: Path, kube_scheduler: Path, into: Path) -> None:
    """Copy the scheduler-plugins module to `into` and port its Coscheduling plugin."""
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(module, into)
    into.chmod(0o755)
    for path in into.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    staging = exported_names([p.read_text() for p in go_files(kube_scheduler / "framework")])
    remaining = exported_names(
        [
            p.read_text()
            for p in (kubernetes / "pkg/scheduler/framework").glob("*.go")
            if "_test" not in p.name
        ]
    )
    for path in go_files(into / PLUGIN_DIR):
        path.write_text(port_moved_framework_names(path.read_text(), staging - remaining))


def ensure_coscheduler(cache: BinaryCache, quiet: bool = False) -> CoschedulerBuild:
    """Build (once, cached beside the other binaries) and return the binary and its CRD."""
    out = cache.root / "scheduler-plugins" / f"{SCHEDULER_PLUGINS_VERSION}_{cache.pins.cache_key}"
    done = CoschedulerBuild(out / SCHEDULER_NAME, out / "crd.yaml", out / CONTROLLER_NAME)
    if done.exists():
        return done
    go = check_go()
    env = {**os.environ, "GOFLAGS": "-buildvcs=false -mod=mod"}
    work = cache.root / "build" / f"scheduler-plugins-{SCHEDULER_PLUGINS_VERSION}"
    log = work / "build.log"

    def go_run(*args: str) -> str:
        with log.open("a") as handle:
            handle.write(f"\n$ go {' '.join(args)}\n")
            handle.flush()
            proc = subprocess.run(
                [go, *args], cwd=work, env=env, stdout=subprocess.PIPE, stderr=handle, text=True
            )
        if proc.returncode != 0:
            last = "\n".join(log.read_text().splitlines()[-25:])
            raise BuildError(
                f"`go {' '.join(args)}` failed (exit {proc.returncode}); last lines of {log}:\n{last}"
            )
        return proc.stdout

    with exclusive_lock(cache.root / "scheduler-plugins" / "build.lock"):
        if done.exists():
            return done
        work.mkdir(parents=True, exist_ok=True)
        if not quiet:
            print(
                f"building scheduler-plugins {SCHEDULER_PLUGINS_VERSION} against Kubernetes "
                f"{cache.pins.kubernetes} (first time: a few minutes; log: {log}) ...",
                file=sys.stderr,
                flush=True,
            )
        (work / "go.mod").write_text("module quorum.dev/build/probe\n\ngo 1.26\n")
        info = json.loads(go_run("mod", "download", "-json", f"k8s.io/kubernetes@{cache.pins.kubernetes}"))
        staging = staging_modules_of(Path(info["GoMod"]).read_text())
        kube_scheduler = json.loads(
            go_run("mod", "download", "-json", f"k8s.io/kube-scheduler@{cache.pins.staging}")
        )
        released = json.loads(
            go_run("mod", "download", "-json", f"sigs.k8s.io/scheduler-plugins@{SCHEDULER_PLUGINS_VERSION}")
        )
        port_plugin(
            Path(released["Dir"]),
            Path(info["Dir"]),
            Path(kube_scheduler["Dir"]),
            work / "scheduler-plugins",
        )
        (work / "go.mod").write_text(build_module(cache, staging))
        (work / "main.go").write_text((SOURCES / "scheduler.go").read_text())
        (work / "controller").mkdir(exist_ok=True)
        (work / "controller" / "main.go").write_text((SOURCES / "controller.go").read_text())
        go_run("mod", "tidy")
        out.mkdir(parents=True, exist_ok=True)
        for binary, package in ((done.controller, "./controller"), (done.binary, ".")):
            go_run("build", "-ldflags", "-s -w", "-o", str(binary.with_suffix(".partial")), package)
        done.crd.write_text((Path(released["Dir"]) / CRD_PATH).read_text())
        done.controller.with_suffix(".partial").rename(done.controller)
        done.binary.with_suffix(".partial").rename(done.binary)
    return done


def scheduler_config(kubeconfig: Path, qps: float, burst: int, permit_seconds: int) -> dict[str, Any]:
    """A profile named cw-coscheduler with Coscheduling at every extension point it has and as
    the queue sort (scheduler-plugins' manifests/coscheduling/scheduler-config.yaml)."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": qps, "burst": burst},
        "leaderElection": {"leaderElect": False},
        "profiles": [
            {
                "schedulerName": SCHEDULER_NAME,
                "plugins": {
                    "multiPoint": {"enabled": [{"name": PLUGIN}]},
                    "queueSort": {"enabled": [{"name": PLUGIN}], "disabled": [{"name": "*"}]},
                },
                "pluginConfig": [{"name": PLUGIN, "args": {"permitWaitingTimeSeconds": permit_seconds}}],
            }
        ],
    }


def start_coscheduler(
    instance: Instance,
    built: CoschedulerBuild,
    permit_seconds: int = PERMIT_WAITING_SECONDS,
    verbosity: int = 2,
    own_gates: bool = True,
) -> ProcessRecord:
    """Install the CRD and run cw-coscheduler beside kube-scheduler, with the instance's client
    QPS/burst and (`own_gates`) feature gates; without them, a build for an older release than the
    instance's (it would refuse gates it does not know). It reads PodGroups, so it runs as the
    admin."""
    state = instance.state()
    if state is None:
        raise ClusterError(f"instance {instance.name!r} is not up")
    instance.kubectl("apply", "--server-side", "-f", str(built.crd))
    instance.wait_established("-f", str(built.crd))
    root = instance.layout.root / SCHEDULER_NAME
    root.mkdir(parents=True, exist_ok=True)
    kubeconfig = instance.kubeconfig("admin")
    config = scheduler_config(kubeconfig, state.spec.client_qps, state.spec.client_burst, permit_seconds)
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (port,) = free_ports(1)
    argv = [
        str(built.binary),
        f"--config={root / 'config.yaml'}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        *((f"--feature-gates={state.spec.feature_gates_flag()}",) if own_gates else ()),
        f"--v={verbosity}",
    ]
    return run_until_healthy(instance, SCHEDULER_NAME, argv, root, f"https://127.0.0.1:{port}/healthz")


def start_podgroup_controller(instance: Instance, built: CoschedulerBuild, workers: int = 1) -> ProcessRecord:
    """Run scheduler-plugins' PodGroup controller as its chart does (one worker by default), with
    the instance's client QPS/burst, as the admin."""
    state = instance.state()
    if state is None:
        raise ClusterError(f"instance {instance.name!r} is not up")
    root = instance.layout.root / CONTROLLER_NAME
    root.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    argv = [
        str(built.controller),
        f"--kubeconfig={instance.kubeconfig('admin')}",
        f"--qps={state.spec.client_qps}",
        f"--burst={state.spec.client_burst}",
        f"--workers={workers}",
        f"--health-probe-bind-address=127.0.0.1:{port}",
    ]
    return run_until_healthy(instance, CONTROLLER_NAME, argv, root, f"http://127.0.0.1:{port}/healthz")


def run_until_healthy(
    instance: Instance, name: str, argv: list[str], root: Path, health: str
) -> ProcessRecord:
    """Start a process of the instance and wait (up to a minute) until its health URL answers."""
    log = instance.layout.log(name)
    record = spawn(name, argv, log, root, dict(os.environ))
    deadline = time.monotonic() + 60
    while not probe(health):
        if not is_alive(record) or time.monotonic() > deadline:
            stop([record])
            raise ClusterError(f"{name} did not get healthy; last lines of {log}:\n{tail(log, 25)}")
        time.sleep(0.2)
    instance.adopt(record)
    return record
