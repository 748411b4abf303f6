"""The ML controllers whose gang dialects quorum reads (docs/integrations.md), built from their Go
modules and run on a local instance: `make test-integrations` and `make integrations-demo`.

Each is built as the Kueue benchmark builds Kueue: the released module is copied out of the
module cache and `go build` runs in the copy with the module's own go.mod and go.sum (a module
required from a build module of ours would lose its `replace` lines). The binary is cached
under ~/.cache/quorum/controllers/<name>-<version>/. Each runs out of cluster as the admin,
with the instance's kubeconfig, no leader election, its probes and metrics on 127.0.0.1, and,
where it has admission webhooks, a serving certificate from a CA made here and its webhook
configurations registered by URL (its kustomize patches applied: the pod webhooks' selectors).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devcluster.build import BinaryCache, BuildError, check_go, exclusive_lock
from devcluster.cluster import ClusterError, Instance, free_ports
from devcluster.config import ClusterSpec
from devcluster.demo import fresh_namespace
from devcluster.kubeconfig import probe
from devcluster.process import ProcessRecord, spawn, stop
from devcluster.webhooks import local_webhook_configurations
from quorum.core.gangs import COSCHEDULER_NAMES, VOLCANO_SCHEDULER
from quorum.pki import CertificateAuthority


@dataclass(frozen=True)
class Where:
    """Where one run of a controller listens and keeps its files."""

    health: int
    metrics: int
    webhook: int
    root: Path  # its directory: config file, certificates, log
    kubeconfig: Path  # the instance's admin kubeconfig


@dataclass(frozen=True)
class Controller:
    """One controller: where its module is, what to build, which CRDs to install, how to run it."""

    name: str
    module: str
    version: str
    package: str  # the main package, relative to the module's root
    crds: tuple[str, ...]  # CRD files or directories, relative to the module's root
    args: Callable[[Where], list[str]]  # argv after the binary
    webhooks: str | None = None  # the module's webhook manifest, if it serves admission webhooks
    webhook_patches: tuple[str, ...] = ()  # kustomize JSON patches of it (`replace /webhooks/N`)
    readiness: str = "/readyz"
    cert_dir: str = "certs"  # where it reads its serving certificate, under its directory
    env: Callable[[Where], dict[str, str]] = lambda _where: {}
    # One-line changes to the copied source, each (file, text, replacement), the text found once:
    # what an out-of-cluster run on 127.0.0.1 needs and the module cannot be told by a flag.
    source_edits: tuple[tuple[str, str, str], ...] = ()
    namespaces: tuple[str, ...] = ()  # made before it starts (a lock namespace, say)

    def binary(self, cache: BinaryCache) -> Path:
        return cache.root / "controllers" / f"{self.name}-{self.version}" / self.name

    def source(self, cache: BinaryCache) -> Path:
        return cache.root / "build" / f"{self.name}-{self.version}"


def _config_file(make: Callable[[Where], dict[str, Any]]) -> Callable[[Where], list[str]]:
    """`--config=FILE`, the file a controller-runtime Configuration made for this run."""

    def args(where: Where) -> list[str]:
        (where.root / "config.yaml").write_text(yaml.safe_dump(make(where)))
        return [f"--config={where.root / 'config.yaml'}"]

    return args


def _sigs_config(api_version: str, **extra: Any) -> Callable[[Where], list[str]]:
    """JobSet's and LeaderWorkerSet's Configuration (the same shape)."""
    return _config_file(
        lambda where: {
            "apiVersion": api_version,
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": where.webhook, "host": "127.0.0.1", "certDir": str(where.root / "certs")},
            "metrics": {"bindAddress": f"127.0.0.1:{where.metrics}"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{where.health}"},
            **extra,
        }
    )


def _trainer_config(where: Where) -> dict[str, Any]:
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
        "webhook": {"port": where.webhook, "host": "127.0.0.1"},
        "metrics": {"bindAddress": f"127.0.0.1:{where.metrics}", "secureServing": False},
        "health": {
            "healthProbeBindAddress": f"127.0.0.1:{where.health}",
            "readinessEndpointName": "readyz",
            "livenessEndpointName": "healthz",
        },
    }


KUBERAY = Controller(
    name="ray-operator",
    module="github.com/ray-project/kuberay/ray-operator",
    # v1.7.0 is listed by the Go proxy but its zip is refused (403); v1.6.0 is the newest served.
    version="v1.6.0",
    package=".",
    crds=("config/crd/bases",),
    # KubeRay's scheduler-plugins integration, as its Helm chart's batchScheduler.name sets it.
    args=lambda where: [
        "--batch-scheduler=scheduler-plugins",
        "--enable-leader-election=false",
        f"--metrics-addr=127.0.0.1:{where.metrics}",
        f"--health-probe-bind-address=127.0.0.1:{where.health}",
    ],
)
LWS = Controller(
    name="lws",
    module="sigs.k8s.io/lws",
    version="v0.9.0",  # v0.10.0 is listed but refused (403); v0.9.0 has the Volcano provider
    package="./cmd",
    crds=("config/crd/bases",),
    args=_sigs_config(
        "config.lws.x-k8s.io/v1alpha1", gangSchedulingManagement={"schedulerProvider": "volcano"}
    ),
    webhooks="config/webhook/manifests.yaml",
    webhook_patches=("config/webhook/mutating-patch.yaml", "config/webhook/validating-patch.yaml"),
)
JOBSET = Controller(
    name="jobset",
    module="sigs.k8s.io/jobset",
    version="v0.12.0",  # the first JobSet built on k8s.io/api v0.36 (knows spec.schedulingGroup)
    package=".",
    crds=("config/components/crd/bases",),
    args=_sigs_config("config.jobset.x-k8s.io/v1alpha1"),
    webhooks="config/components/webhook/manifests.yaml",
    webhook_patches=(
        "config/components/webhook/patches/mutating-patch.yaml",
        "config/components/webhook/patches/validating-patch.yaml",
    ),
)
TRAINER = Controller(
    name="trainer",
    module="github.com/kubeflow/trainer/v2",
    version="v2.3.0",
    package="./cmd/trainer-controller-manager",
    crds=("manifests/base/crds",),
    args=_config_file(_trainer_config),
    # Its webhooks are on its own kinds only; their kustomize patches rename and add selectors.
    webhooks="manifests/base/webhook/manifests.yaml",
    # Its Configuration has no certificate directory: controller-runtime's default, under $TMPDIR.
    cert_dir="k8s-webhook-server/serving-certs",
    env=lambda where: {"TMPDIR": str(where.root)},
)
MPI_OPERATOR = Controller(
    name="mpi-operator",
    module="github.com/kubeflow/mpi-operator",
    version="v0.6.0",
    package="./cmd/mpi-operator",
    crds=("manifests/base/kubeflow.org_mpijobs.yaml",),
    # Its flag for scheduler-plugins, with the name its docs use.
    args=lambda where: [
        "--gang-scheduling=scheduler-plugins-scheduler",
        "--lock-namespace=mpi-operator",
        f"--kubeConfig={where.kubeconfig}",
    ],
    readiness="/healthz",
    # Its health server listens on :8080 of every address, fixed in the source; here it listens
    # where $MPI_OPERATOR_HEALTH_ADDRESS says (127.0.0.1 and a free port).
    source_edits=(
        (
            "cmd/mpi-operator/app/server.go",
            'Addr:    fmt.Sprintf(":%d", healthCheckPort),',
            'Addr:    os.Getenv("MPI_OPERATOR_HEALTH_ADDRESS"),',
        ),
    ),
    env=lambda where: {"MPI_OPERATOR_HEALTH_ADDRESS": f"127.0.0.1:{where.health}"},
    namespaces=("mpi-operator",),  # its leader-election lock
)
CONTROLLERS = {c.name: c for c in (KUBERAY, LWS, JOBSET, TRAINER, MPI_OPERATOR)}


def ensure_built(controller: Controller, cache: BinaryCache, quiet: bool = False) -> Path:
    """Build (once, cached) and return the controller's binary."""
    out = controller.binary(cache)
    if out.exists():
        return out
    go = check_go()
    work = controller.source(cache)
    log = out.parent.parent / f"{out.parent.name}.log"
    with exclusive_lock(cache.root / "controllers" / f"{controller.name}.lock"):
        if out.exists():
            return out
        if not quiet:
            print(
                f"building {controller.name} {controller.version} (first time: a minute or two; log: {log})",
                file=sys.stderr,
                flush=True,
            )
        env = {**os.environ, "GOFLAGS": "-buildvcs=false"}
        probe_dir = cache.root / "build" / "probe"
        probe_dir.mkdir(parents=True, exist_ok=True)
        (probe_dir / "go.mod").write_text("module quorum.dev/build/probe\n\ngo 1.26\n")
        listed = subprocess.run(
            [go, "mod", "download", "-json", f"{controller.module}@{controller.version}"],
            cwd=probe_dir,
            env=env,
            capture_output=True,
            text=True,
        )
        if listed.returncode != 0:
            raise BuildError(
                f"go mod download {controller.module}@{controller.version}: {listed.stdout}{listed.stderr}"
            )
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(Path(json.loads(listed.stdout)["Dir"]), work)
        for path in [work, *work.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        for relative, text, replacement in controller.source_edits:
            edited = work / relative
            found = edited.read_text()
            if found.count(text) != 1:
                raise BuildError(
                    f"{relative} of {controller.module}@{controller.version}: expected one `{text}`"
                )
            edited.write_text(found.replace(text, replacement))
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        with log.open("w") as handle:
            built = subprocess.run(
                [go, "build", "-ldflags", "-s -w", "-o", str(partial), controller.package],
                cwd=work,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        if built.returncode != 0:
            raise BuildError(
                f"building {controller.name} failed; last lines of {log}:\n{log.read_text()[-2000:]}"
            )
        partial.rename(out)
    return out


def crd_files(source: Path, crds: tuple[str, ...]) -> list[Path]:
    """The CRD files named (a directory: its CRDs, not its kustomization.yaml)."""
    found: list[Path] = []
    for crd in crds:
        path = source / crd
        for file in sorted(path.glob("*.yaml")) if path.is_dir() else [path]:
            if (yaml.safe_load(file.read_text()) or {}).get("kind") == "CustomResourceDefinition":
                found.append(file)
    return found


def patched_webhooks(manifest: str, patches: list[str]) -> str:
    """The webhook manifest with kustomize's JSON patches applied (each `replace /webhooks/N` of
    the configuration of its kind: the mutating patch to the mutating configuration, ...)."""
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    for patch_text in patches:
        ops = yaml.safe_load(patch_text)
        for op in ops:
            index = int(op["path"].split("/")[-1])
            if op["op"] != "replace" or not op["path"].startswith("/webhooks/"):
                raise BuildError(f"a webhook patch quorum does not apply: {op['op']} {op['path']}")
            kind = "Mutating" if op["value"]["name"].startswith("m") else "Validating"
            (doc,) = [d for d in docs if d["kind"] == f"{kind}WebhookConfiguration"]
            doc["webhooks"][index] = op["value"]
    return yaml.safe_dump_all(docs)


@dataclass
class Running:
    controller: Controller
    record: ProcessRecord
    webhooks: list[str]  # kind/name of its webhook configurations, removed with it


def start(instance: Instance, controller: Controller, binary: Path) -> Running:
    """Install the controller's CRDs, run it and register its webhooks."""
    root = instance.layout.root / controller.name
    certs = root / controller.cert_dir
    certs.mkdir(parents=True, exist_ok=True)
    for namespace in controller.namespaces:
        instance.kubectl("create", "namespace", namespace, check=False)
    source = controller.source(instance.binaries)
    files = [f"--filename={f}" for f in crd_files(source, controller.crds)]
    instance.kubectl("apply", "--server-side", *files)
    instance.wait_established(*files)
    health, metrics, webhook = free_ports(3)
    where = Where(health, metrics, webhook, root, instance.kubeconfig("admin"))
    ca = CertificateAuthority.create(f"{controller.name}-dev-ca")
    serving = ca.issue(f"{controller.name}-webhook", server_names=("127.0.0.1",), client=False)
    (certs / "tls.crt").write_bytes(serving.cert_pem)
    (certs / "tls.key").write_bytes(serving.key_pem)
    argv = [str(binary), *controller.args(where)]
    env = {**os.environ, "KUBECONFIG": str(where.kubeconfig), **controller.env(where)}
    record = spawn(controller.name, argv, root / f"{controller.name}.log", root, env)
    deadline = time.monotonic() + 90
    while not probe(f"http://127.0.0.1:{where.health}{controller.readiness}"):
        if time.monotonic() > deadline:
            stop([record])
            raise ClusterError(f"{controller.name} did not get ready; see {root / controller.name}.log")
        time.sleep(0.5)
    names: list[str] = []
    if controller.webhooks is not None:
        manifest = patched_webhooks(
            (source / controller.webhooks).read_text(),
            [(source / p).read_text() for p in controller.webhook_patches],
        )
        configs = local_webhook_configurations(
            manifest, f"https://127.0.0.1:{where.webhook}", ca.pair.cert_pem
        )
        for doc in configs:
            doc["metadata"]["name"] = f"{controller.name}-{doc['metadata']['name']}"
        instance.kubectl(
            "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": configs})
        )
        names = [f"{d['kind'].lower()}/{d['metadata']['name']}" for d in configs]
    return Running(controller, record, names)


def stop_all(instance: Instance, running: list[Running]) -> None:
    """Remove the webhook configurations first (a pod webhook that fails closed must never stay
    registered without its server), then stop the processes."""
    names = [n for r in running for n in r.webhooks]
    if names:
        instance.kubectl("delete", "--ignore-not-found", *names, check=False)
    stop([r.record for r in running])


# -- make integrations-demo ---------------------------------------------------------------------

DEMO_INSTANCE = "integrations"
DEMO_NAMESPACE = "ml"
KUBERAY_SAMPLE = "config/samples/ray-cluster.scheduler-plugins.yaml"
LWS_SAMPLE = "docs/examples/sample/gang-scheduling/lws-sample-volcano.yaml"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = subparsers.add_parser(
        "integrations-demo", help="build KubeRay and LeaderWorkerSet and run their own gang samples"
    )
    demo.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    """KubeRay's and LeaderWorkerSet's own samples, as the customer applies them, on an instance
    where quorum takes scheduler-plugins' name and Volcano's dialect."""
    instance = Instance(DEMO_INSTANCE)
    running: list[Running] = []
    try:
        binaries = {c.name: ensure_built(c, instance.binaries) for c in (KUBERAY, LWS)}
        instance.up(ClusterSpec(name=DEMO_INSTANCE, coschedulers=(*COSCHEDULER_NAMES, VOLCANO_SCHEDULER)))
        for controller in (KUBERAY, LWS):
            running.append(start(instance, controller, binaries[controller.name]))
        fresh_namespace(instance, DEMO_NAMESPACE)
        for controller, sample in ((KUBERAY, KUBERAY_SAMPLE), (LWS, LWS_SAMPLE)):
            path = controller.source(instance.binaries) / sample
            print(f"\n$ kubectl -n {DEMO_NAMESPACE} apply -f {controller.module}/{sample}", flush=True)
            applied = instance.kubectl("-n", DEMO_NAMESPACE, "apply", "-f", str(path), who="customer")
            print(applied.stdout.rstrip())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = json.loads(
                instance.kubectl(
                    "-n", DEMO_NAMESPACE, "get", "rayclusters,leaderworkersets", "-o", "json"
                ).stdout
            )["items"]
            states = [(o.get("status") or {}) for o in got]
            gangs = json.loads(instance.kubectl("-n", DEMO_NAMESPACE, "get", "gangs", "-o", "json").stdout)[
                "items"
            ]
            gangs_running = len(gangs) == 3 and all(
                (g.get("status") or {}).get("phase") == "Running" for g in gangs
            )
            ready = (
                len(got) == 2 and states[0].get("state") == "ready" and states[1].get("readyReplicas") == 2
            )
            if ready and gangs_running:  # and quorum's status written: the PodGroups' phases shown
                time.sleep(1)
                break
            time.sleep(1)
        else:
            print("error: the RayCluster and the LeaderWorkerSet were not ready after 120 s", file=sys.stderr)
            return 1
        for what in (
            ("get", "rayclusters,leaderworkersets"),
            ("get", "podgroups.scheduling.x-k8s.io,podgroups.scheduling.volcano.sh"),
            ("get", "gangs", "-o", "wide"),
            ("get", "pods", "-o", "wide"),
        ):
            print(f"\n$ kubectl -n {DEMO_NAMESPACE} {' '.join(what)}")
            print(instance.kubectl("-n", DEMO_NAMESPACE, *what).stdout.rstrip())
        print(
            "\nquorum released the RayCluster (head + 2 workers) and each LeaderWorkerSet group (leader + 3 "
            "workers) in one decision each; the pods asked for scheduler-plugins-scheduler and volcano."
        )
    except (BuildError, ClusterError, subprocess.CalledProcessError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        stop_all(instance, running)
    print(
        f"\nThe instance `{DEMO_INSTANCE}` keeps running (without the controllers): "
        f"make down NAME={DEMO_INSTANCE}"
    )
    return 0
