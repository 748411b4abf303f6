"""`make jobset-demo`: seed 004's JobSet example end to end, on an instance of its own.

Builds the JobSet controller from the Go module `sigs.k8s.io/jobset` and runs it on 127.0.0.1
with its webhooks registered by URL (devcluster.controllers, as `make test-integrations` does),
applies `examples/seed-004-workload-aware/jobset.yaml` and shows quorum admitting the JobSet's
workers as one gang. Not part of `make test`; the build is cached like the other binaries.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from devcluster.build import BuildError
from devcluster.cluster import REPO_ROOT, ClusterError, Instance
from devcluster.controllers import JOBSET, Running, ensure_built, start, stop_all
from devcluster.demo import fresh_namespace

EXAMPLE = REPO_ROOT / "examples/seed-004-workload-aware/jobset.yaml"
NAMESPACE = "pretrain"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = subparsers.add_parser("jobset-demo", help="build JobSet and run seed 004's JobSet example")
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    instance = Instance("jobset")
    running: list[Running] = []
    try:
        binary = ensure_built(JOBSET, instance.binaries)
        instance.up()
        running.append(start(instance, JOBSET, binary))
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
        stop_all(instance, running)  # its pod webhook fails closed: never registered without it
    print("\nThe instance `jobset` keeps running (without the JobSet controller): make down NAME=jobset")
    return 0
