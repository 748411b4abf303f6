"""`make demo`: bring up the local control plane and show what quorum will work with.

Later issues extend this with the seeds' examples (gangs admitted whole, policies at work)."""

from __future__ import annotations

import argparse
import sys

from quorum.devcluster.build import BuildError
from quorum.devcluster.cluster import ClusterError, Instance

NODE_COLUMNS = ",".join(
    (
        "node.coreweave.cloud/state",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/zone",
        "network.topology.kubernetes.io/block",
        "network.topology.kubernetes.io/rack",
    )
)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = subparsers.add_parser("demo", help="start the local control plane and show it")
    demo.set_defaults(func=run)


def section(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def run(args: argparse.Namespace) -> int:
    instance = Instance("default")
    try:
        instance.up()
        section("versions")
        print(instance.kubectl("version").stdout.strip())
        section("nodes (fake, shaped like CoreWeave CKS nodes; kwok plays the kubelets)")
        print(instance.kubectl("get", "nodes", "-L", NODE_COLUMNS).stdout.rstrip())
        section("node taints")
        print(
            instance.kubectl(
                "get",
                "nodes",
                "-o",
                "custom-columns=NODE:.metadata.name,TAINTS:.spec.taints[*].key",
            ).stdout.rstrip()
        )
        section("Kubernetes 1.36 Workload Aware Scheduling API")
        print(instance.kubectl("api-resources", "--api-group=scheduling.k8s.io").stdout.rstrip())
    except (BuildError, ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print("\nThe control plane keeps running. Use it with:  . .quorum/env && kubectl get nodes")
    print("Stop it with:  make down")
    return 0
