"""Kueue (sigs.k8s.io/kueue) admitting plain pod groups: the `kueue` and `kueue-tas` ways of
`make bench-peers`.

Kueue gates pods the way quorum does: its pod webhook adds the scheduling gate
`kueue.x-k8s.io/admission` to every pod that names a LocalQueue, its pod controller makes one
Workload per pod group (label `kueue.x-k8s.io/pod-group-name`, annotation
`kueue.x-k8s.io/pod-group-total-count`), and once the Workload fits the ClusterQueue's quota it
is admitted whole and its pods are ungated for kube-scheduler. The gang is all-or-nothing in
quota, not in placement: kube-scheduler places the pods one by one. With topology-aware
scheduling (a flavor with a Topology: `cluster_queue_objects(..., topology_nodes=...)`), Kueue
also finds every pod of the group a node before it admits it, and ungates it with that node in
its node selector.

v0.17.0 is the newest release the Go proxy serves; it is built with its own go.mod
(Kubernetes libraries 0.35, controller-runtime 0.23) and runs as a separate process against
the 1.36 apiserver (one minor version of skew, which client-go supports). The build:

- copies the released module and changes one line of cmd/kueue/main.go: the directory of the
  metrics server's certificate, hard-coded to /etc/kueue/metrics/certs when Kueue does not
  manage its own certificates, comes from $KUEUE_METRICS_CERT_DIR when that is set
  (`patch_metrics_cert_dir`); nothing else changes;
- `go build ./cmd/kueue` in the copy, with its go.sum.

Kueue runs out of cluster, as the admin, with a kubeconfig: no internal certificate management
(its rotator expects a Service and a Secret in kueue-system), a serving certificate from a CA
made here for 127.0.0.1, and its webhook configurations rewritten to URL clientConfig with that
CA (only the webhooks of the pod integration and of Kueue's own kinds: the others' paths are not
served when their integrations are off). Not part of `make test`: only the benchmarks use it.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devcluster.build import BinaryCache, BuildError, check_go, exclusive_lock
from devcluster.cluster import ClusterError, Instance, free_ports
from devcluster.kubeconfig import probe
from devcluster.nodes import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL, ZONE_LABEL
from devcluster.process import ProcessRecord, is_alive, spawn, stop, tail
from quorum.core.gangs import KUEUE_ADMISSION_GATE
from quorum.core.quantity import parse_quantity
from quorum.pki import CertificateAuthority

KUEUE_VERSION = "v0.17.0"  # newest release the Go proxy serves on 2026-11-26 (Kubernetes libraries 0.35)
MODULE = "sigs.k8s.io/kueue"
MANAGER_NAME = "kueue"
GROUP = "kueue.x-k8s.io"
QUEUE_LABEL = f"{GROUP}/queue-name"
POD_GROUP_LABEL = f"{GROUP}/pod-group-name"
POD_GROUP_COUNT = f"{GROUP}/pod-group-total-count"
ADMISSION_GATE = KUEUE_ADMISSION_GATE
KUEUE_NAMESPACE = "kueue-system"
CRD_DIR = "config/components/crd/bases"
WEBHOOKS = "config/components/webhook/manifests.yaml"
METRICS_CERT_LINE = 'metricsCertPath := "/etc/kueue/metrics/certs"'
METRICS_CERT_ENV = "KUEUE_METRICS_CERT_DIR"
# The webhooks of the pod integration (group "") and of Kueue's own kinds; the rest belong to
# integrations this setup leaves off (Jobs, Deployments, JobSets, Kubeflow, Ray, ...).
SERVED_GROUPS = frozenset({"", GROUP})
# Kueue's integrations (its Configuration's `integrations.frameworks`) and the API group of the
# kind each manages, whose webhooks Kueue then serves.
POD_FRAMEWORK = "pod"
JOB_FRAMEWORK = "batch/job"
JOBSET_FRAMEWORK = "jobset.x-k8s.io/jobset"
FRAMEWORK_GROUPS = {POD_FRAMEWORK: "", JOB_FRAMEWORK: "batch", JOBSET_FRAMEWORK: "jobset.x-k8s.io"}
# What upstream's kustomization adds to the pod webhooks: Kueue leaves these namespaces alone.
SYSTEM_NAMESPACES = ("kube-system", KUEUE_NAMESPACE)
RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
QUEUE = "bench"  # the ClusterQueue and the LocalQueue
FLAVOR = "default"
# Topology-aware scheduling: the pool's levels, widest first, down to the node (Kueue then
# assigns every pod its node, and kube-scheduler binds it there).
TOPOLOGY = "default"
TOPOLOGY_LEVELS = (ZONE_LABEL, BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL)
PREFERRED_TOPOLOGY = f"{GROUP}/podset-preferred-topology"


@dataclass(frozen=True)
class KueueBuild:
    binary: Path
    crds: Path
    webhooks: Path

    def exists(self) -> bool:
        return all(p.exists() for p in (self.binary, self.crds, self.webhooks))


def patch_metrics_cert_dir(main_go: str) -> str:
    """cmd/kueue/main.go with the metrics certificate's directory taken from the environment
    when set (upstream's path otherwise)."""
    if main_go.count(METRICS_CERT_LINE) != 1:
        raise BuildError(f"cmd/kueue/main.go: expected one `{METRICS_CERT_LINE}`")
    return main_go.replace(
        METRICS_CERT_LINE,
        'metricsCertPath := "/etc/kueue/metrics/certs"\n'
        f'\t\tif dir := os.Getenv("{METRICS_CERT_ENV}"); dir != "" {{\n'
        "\t\t\tmetricsCertPath = dir\n"
        "\t\t}",
    )


def ensure_kueue(cache: BinaryCache, quiet: bool = False) -> KueueBuild:
    """Build (once, cached beside the other binaries) and return Kueue, its CRDs and webhooks."""
    out = cache.root / "kueue" / KUEUE_VERSION
    done = KueueBuild(out / MANAGER_NAME, out / "crds.yaml", out / "webhooks.yaml")
    if done.exists():
        return done
    go = check_go()
    # One package at a time: the machine is shared, and the build is a one-off.
    env = {**os.environ, "GOFLAGS": "-buildvcs=false -p=1"}
    work = cache.root / "build" / f"kueue-{KUEUE_VERSION}"
    log = work / "build.log"

    def go_run(cwd: Path, *args: str) -> str:
        with log.open("a") as handle:
            handle.write(f"\n$ go {' '.join(args)}\n")
            handle.flush()
            proc = subprocess.run(
                [go, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=handle, text=True
            )
        if proc.returncode != 0:
            last = "\n".join(log.read_text().splitlines()[-25:])
            raise BuildError(
                f"`go {' '.join(args)}` failed (exit {proc.returncode}); last lines of {log}:\n{last}"
            )
        return proc.stdout

    with exclusive_lock(cache.root / "kueue" / "build.lock"):
        if done.exists():
            return done
        work.mkdir(parents=True, exist_ok=True)
        if not quiet:
            print(
                f"building Kueue {KUEUE_VERSION} (first time: a few minutes; log: {log}) ...",
                file=sys.stderr,
                flush=True,
            )
        (work / "go.mod").write_text("module quorum.dev/build/probe\n\ngo 1.25\n")
        released = Path(
            json.loads(go_run(work, "mod", "download", "-json", f"{MODULE}@{KUEUE_VERSION}"))["Dir"]
        )
        source = work / "kueue"
        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(released, source)
        for path in [source, *source.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        main_go = source / "cmd" / "kueue" / "main.go"
        main_go.write_text(patch_metrics_cert_dir(main_go.read_text()))
        out.mkdir(parents=True, exist_ok=True)
        partial = done.binary.with_suffix(".partial")
        go_run(source, "build", "-ldflags", "-s -w", "-o", str(partial), "./cmd/kueue")
        crds = sorted((released / CRD_DIR).glob("*.yaml"))
        done.crds.write_text("".join("---\n" + p.read_text() for p in crds))
        done.webhooks.write_text((released / WEBHOOKS).read_text())
        partial.rename(done.binary)
    return done


def served_groups(frameworks: tuple[str, ...]) -> frozenset[str]:
    """The API groups whose webhooks Kueue serves with these integrations on: its own, and
    each framework's."""
    return frozenset({GROUP, *(FRAMEWORK_GROUPS[f] for f in frameworks)})


def local_webhooks(
    manifest: str, base_url: str, ca_pem: bytes, groups: frozenset[str] = SERVED_GROUPS
) -> list[dict[str, Any]]:
    """Kueue's webhook configurations for a local apiserver: only the webhooks it serves here
    (those of `groups`: by default the pod integration's and its own kinds'), each pointed at
    `base_url` with `ca_pem`, the pod webhooks leaving the system namespaces alone as upstream's
    kustomization makes them, and the configurations named for Kueue (upstream's names come
    from kustomize's prefix)."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in yaml.safe_load_all(manifest):
        if not doc or doc.get("kind") not in (
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ):
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": f"kueue-{doc['metadata']['name']}"}
        kept = []
        for webhook in doc["webhooks"]:
            its_groups = {g for rule in webhook.get("rules", []) for g in rule.get("apiGroups", [])}
            if not its_groups <= groups:
                continue
            path = webhook["clientConfig"]["service"].get("path", "/")
            webhook["clientConfig"] = {"url": base_url.rstrip("/") + path, "caBundle": ca_bundle}
            if "pods" in {r for rule in webhook.get("rules", []) for r in rule.get("resources", [])}:
                webhook["namespaceSelector"] = {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": list(SYSTEM_NAMESPACES),
                        }
                    ]
                }
            kept.append(webhook)
        doc["webhooks"] = kept
        out.append(doc)
    return out


def manager_config(
    *,
    qps: float,
    burst: int,
    webhook_port: int,
    health_port: int,
    cert_dir: Path,
    frameworks: tuple[str, ...] = (POD_FRAMEWORK,),
    wait_for_pods_ready: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Kueue's Configuration: the integrations `frameworks` (the pod integration only by
    default), no leader election, no metrics or visibility servers, no internal certificate
    management (the certificate is given), the instance's client QPS/burst and upstream's
    controller concurrency. `wait_for_pods_ready` is its `waitForPodsReady` as Kueue's v1beta2
    Configuration writes it (`timeout`, `requeuingStrategy`, ...): present, it is on; absent
    (the default here and in v1beta2), it is off."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": qps, "burst": burst},
        "controller": {
            "groupKindConcurrency": {
                "Pod": 5,
                "Workload.kueue.x-k8s.io": 5,
                "LocalQueue.kueue.x-k8s.io": 1,
                "Cohort.kueue.x-k8s.io": 1,
                "ClusterQueue.kueue.x-k8s.io": 1,
                "ResourceFlavor.kueue.x-k8s.io": 1,
            }
        },
        "integrations": {"frameworks": list(frameworks)},
        "featureGates": {"VisibilityOnDemand": False},
    }
    if wait_for_pods_ready is not None:
        config["waitForPodsReady"] = copy.deepcopy(wait_for_pods_ready)
    return config


def cluster_queue_objects(
    quota: dict[str, str], queue: str = QUEUE, topology_nodes: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """One ResourceFlavor and a ClusterQueue whose nominal quota is `quota` (the capacity the
    flavor stands for), open to every namespace. The flavor is every node; or, topology-aware,
    the nodes labelled `topology_nodes` (Kueue asks for node labels there), with a Topology of
    the pool's levels."""
    flavor: dict[str, Any] = {
        "apiVersion": f"{GROUP}/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": FLAVOR},
    }
    objects = [flavor]
    if topology_nodes is not None:
        flavor["spec"] = {"nodeLabels": topology_nodes, "topologyName": TOPOLOGY}
        levels = [{"nodeLabel": label} for label in TOPOLOGY_LEVELS]
        topology = {"apiVersion": f"{GROUP}/v1beta2", "kind": "Topology", "metadata": {"name": TOPOLOGY}}
        objects.insert(0, topology | {"spec": {"levels": levels}})
    return [
        *objects,
        {
            "apiVersion": f"{GROUP}/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": list(quota),
                        "flavors": [
                            {
                                "name": FLAVOR,
                                "resources": [{"name": r, "nominalQuota": q} for r, q in quota.items()],
                            }
                        ],
                    }
                ],
            },
        },
    ]


def local_queue(namespace: str, queue: str = QUEUE) -> dict[str, Any]:
    """The LocalQueue `queue` of `namespace`, feeding the ClusterQueue of the same name."""
    return {
        "apiVersion": f"{GROUP}/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": queue, "namespace": namespace},
        "spec": {"clusterQueue": queue},
    }


def pool_quota(nodes: list[dict[str, Any]], labels: dict[str, str] | None = None) -> dict[str, str]:
    """The sum of the schedulable nodes' (those with `labels`, if given) allocatable cpu, memory
    and GPUs, as quantities."""
    totals = {r: 0.0 for r in RESOURCES}
    for node in nodes:
        if node.get("spec", {}).get("unschedulable"):
            continue
        if not (labels or {}).items() <= node.get("metadata", {}).get("labels", {}).items():
            continue
        allocatable = node.get("status", {}).get("allocatable", {})
        for r in RESOURCES:
            totals[r] += float(parse_quantity(allocatable.get(r, "0")))
    return {r: str(int(v)) for r, v in totals.items()}


def start_kueue(
    instance: Instance,
    built: KueueBuild,
    quota: dict[str, str],
    topology_nodes: dict[str, str] | None = None,
    *,
    frameworks: tuple[str, ...] = (POD_FRAMEWORK,),
    wait_for_pods_ready: dict[str, Any] | None = None,
) -> ProcessRecord:
    """Install Kueue's CRDs, run its manager as the admin with the instance's client QPS/burst
    (its integrations `frameworks` and `wait_for_pods_ready`: see `manager_config`), register
    the webhooks it then serves, and create its flavor and ClusterQueue
    (`cluster_queue_objects`); the LocalQueue (`local_queue`) is for whoever creates the
    namespace."""
    state = instance.state()
    if state is None:
        raise ClusterError(f"instance {instance.name!r} is not up")
    instance.kubectl("apply", "--server-side", "-f", str(built.crds))
    instance.wait_established("-f", str(built.crds))
    instance.kubectl("create", "namespace", KUEUE_NAMESPACE, check=False)
    root = instance.layout.root / MANAGER_NAME
    certs = root / "certs"
    ca = CertificateAuthority.create("kueue-webhook-ca")
    ca.issue("kueue-webhook", server_names=("127.0.0.1", "localhost"), client=False).write(certs, "tls")
    webhook_port, health_port = free_ports(2)
    config = manager_config(
        qps=state.spec.client_qps,
        burst=state.spec.client_burst,
        webhook_port=webhook_port,
        health_port=health_port,
        cert_dir=certs,
        frameworks=frameworks,
        wait_for_pods_ready=wait_for_pods_ready,
    )
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [str(built.binary), f"--config={root / 'config.yaml'}", "--zap-log-level=info"]
    env = {**os.environ, "KUBECONFIG": str(instance.kubeconfig("admin")), METRICS_CERT_ENV: str(certs)}
    log = instance.layout.log(MANAGER_NAME)
    record = spawn(MANAGER_NAME, argv, log, root, env)
    deadline = time.monotonic() + 90
    while not probe(f"http://127.0.0.1:{health_port}/readyz"):
        if not is_alive(record) or time.monotonic() > deadline:
            stop([record])
            raise ClusterError(f"{MANAGER_NAME} did not get ready; last lines of {log}:\n{tail(log, 25)}")
        time.sleep(0.2)
    instance.adopt(record)
    hooks = local_webhooks(
        built.webhooks.read_text(),
        f"https://127.0.0.1:{webhook_port}",
        ca.pair.cert_pem,
        served_groups(frameworks),
    )
    instance.kubectl(
        "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": hooks})
    )
    items = json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": cluster_queue_objects(quota, QUEUE, topology_nodes)}
    )
    # The webhooks are registered just now: the first answers may not use them yet.
    for _ in range(50):
        applied = instance.kubectl("apply", "-f", "-", check=False, input_text=items)
        if applied.returncode == 0:
            return record
        time.sleep(0.2)
    raise ClusterError(f"Kueue's ClusterQueue was not created: {applied.stderr.strip()}")


def stop_kueue(instance: Instance, record: ProcessRecord) -> None:
    """Stop Kueue's manager and delete its webhook configurations: left registered with no
    server behind them, they would refuse the pods, Jobs and JobSets of whatever runs next."""
    instance.kubectl(
        "delete",
        "mutatingwebhookconfiguration/kueue-mutating-webhook-configuration",
        "validatingwebhookconfiguration/kueue-validating-webhook-configuration",
        "--ignore-not-found",
        check=False,
    )
    stop([record])
