"""`make jobset-demo`: seed 004's JobSet example end to end, on an instance of its own.

Builds the JobSet controller from the Go module `sigs.k8s.io/jobset` (a small build module, as
for Kubernetes: the module proxy refuses `go install sigs.k8s.io/jobset@…`, whose version list
it does not serve), runs it on 127.0.0.1 with its webhooks registered by URL and a certificate
from a CA made here, applies `examples/seed-004-workload-aware/jobset.yaml` and shows quorum
admitting the JobSet's workers as one gang. Not part of `make test` (the first build takes
minutes); cached like the other binaries.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from devcluster.build import BinaryCache, BuildError, check_go
from devcluster.cluster import REPO_ROOT, ClusterError, Instance, free_ports
from devcluster.demo import fresh_namespace
from devcluster.kubeconfig import probe
from devcluster.process import ProcessRecord, spawn, stop
from devcluster.webhooks import local_webhook_configurations
from quorum.pki import CertificateAuthority

JOBSET_VERSION = "v0.12.0"  # the first JobSet built on k8s.io/api v0.36 (knows spec.schedulingGroup)
EXAMPLE = REPO_ROOT / "examples/seed-004-workload-aware/jobset.yaml"
NAMESPACE = "pretrain"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = subparsers.add_parser("jobset-demo", help="build JobSet and run seed 004's JobSet example")
    demo.set_defaults(func=run)


def build(cache: BinaryCache) -> tuple[Path, Path]:
    """The jobset binary and the module's source directory (CRDs, webhook manifests)."""
    go = check_go()
    work = cache.root / "build" / f"jobset-{JOBSET_VERSION}"
    out = cache.root / "jobset" / JOBSET_VERSION / "jobset"
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(
        f"module quorum.dev/build/jobset\n\ngo 1.26\n\nrequire sigs.k8s.io/jobset {JOBSET_VERSION}\n"
    )
    env = {**os.environ, "GOFLAGS": "-buildvcs=false -mod=mod"}
    if not out.exists():
        print(
            f"building JobSet {JOBSET_VERSION} (first time: a few minutes) ...", file=sys.stderr, flush=True
        )
        done = subprocess.run(
            [go, "build", "-o", str(out), "sigs.k8s.io/jobset"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise BuildError(f"building JobSet failed: {done.stderr[-2000:]}")
    listed = subprocess.run(
        [go, "list", "-m", "-json", "sigs.k8s.io/jobset"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out, Path(json.loads(listed.stdout)["Dir"])


def start_jobset(instance: Instance, binary: Path, source: Path) -> tuple[ProcessRecord, list[str]]:
    """Run the controller with its webhooks on 127.0.0.1 and register them; its process record
    and the names of its webhook configurations (to remove with it)."""
    root = instance.layout.root / "jobset"
    certs = root / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority.create("jobset-dev-ca")
    serving = ca.issue("jobset-webhook", server_names=("127.0.0.1",), client=False)
    (certs / "tls.crt").write_bytes(serving.cert_pem)
    (certs / "tls.key").write_bytes(serving.key_pem)
    webhook_port, health_port = free_ports(2)
    config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    instance.kubectl("apply", "--server-side", "-f", str(source / "config/components/crd/bases"))
    established = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
    for _ in range(120):
        if (
            instance.kubectl("get", "crd/jobsets.jobset.x-k8s.io", "-o", established, check=False).stdout
            == "True"
        ):
            break
        time.sleep(0.5)
    manifest = (source / "config/components/webhook/manifests.yaml").read_text()
    configs = local_webhook_configurations(manifest, f"https://127.0.0.1:{webhook_port}", ca.pair.cert_pem)
    for doc in configs:
        doc["metadata"]["name"] = "jobset-" + doc["metadata"]["name"]
    env = {**os.environ, "KUBECONFIG": str(instance.kubeconfig("admin"))}
    record = spawn(
        "jobset", [str(binary), f"--config={root / 'config.yaml'}"], root / "jobset.log", root, env
    )
    deadline = time.monotonic() + 60
    while not probe(f"http://127.0.0.1:{health_port}/readyz"):
        if time.monotonic() > deadline:
            stop([record])
            raise ClusterError(f"the JobSet controller did not get ready; see {root / 'jobset.log'}")
        time.sleep(0.5)
    instance.kubectl(
        "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": configs})
    )
    return record, [f"{d['kind'].lower()}/{d['metadata']['name']}" for d in configs]


def run(args: argparse.Namespace) -> int:
    instance = Instance("jobset")
    record: ProcessRecord | None = None
    webhooks: list[str] = []
    try:
        binary, source = build(instance.binaries)
        instance.up()
        record, webhooks = start_jobset(instance, binary, source)
        fresh_namespace(instance, NAMESPACE)
        print(f"\n$ kubectl -n {NAMESPACE} apply -f {EXAMPLE.relative_to(REPO_ROOT)}", flush=True)
        print(instance.kubectl("-n", NAMESPACE, "apply", "-f", str(EXAMPLE), who="customer").stdout.rstrip())
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            pods = json.loads(instance.kubectl("-n", NAMESPACE, "get", "pods", "-o", "json").stdout)["items"]
            if len(pods) == 4 and all(p["status"].get("phase") == "Running" for p in pods):
                break
            time.sleep(1)
        else:
            print("error: the JobSet's 4 workers were not all running after 90 s", file=sys.stderr)
            return 1
        for what in (("get", "jobsets,jobs,pods", "-o", "wide"), ("get", "gangs", "-o", "wide")):
            print(f"\n$ kubectl -n {NAMESPACE} {' '.join(what)}")
            print(instance.kubectl("-n", NAMESPACE, *what).stdout.rstrip())
        gang = json.loads(
            instance.kubectl("-n", NAMESPACE, "get", "gang", "wpg-pretrain-workers", "-o", "json").stdout
        )
        admission = gang["status"]["admission"]
        count, attempt = len(admission["placement"]), admission["attempt"]
        print(f"\nquorum released the JobSet's {count} workers in one decision (attempt {attempt})")
    except (BuildError, ClusterError, subprocess.CalledProcessError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        if webhooks:  # its pod webhook fails closed: never leave it registered without the server
            instance.kubectl("delete", "--ignore-not-found", *webhooks, check=False)
        if record is not None:
            stop([record])
    print("\nThe instance `jobset` keeps running (without the JobSet controller): make down NAME=jobset")
    return 0
