"""Pods scheduled through Slurm (the SUNK scheduler, docs/sunk.md) beside quorum's own gang path.

An instance of its own (`b-sunk`, the Slurm pool devcluster/data/pool-slurm.yaml: 4 GPU
nodes x 8 GPUs, each a real slurmd of a real Slurm 22.05). The same workloads run twice, first
with `schedulerName: tenant-slurm-slurm-scheduler` (a placeholder Slurm job per pod or per gang,
bound when Slurm has run its prolog and script) and then through quorum (PodGroup pods held at
quorum's gate, released whole by quorum-operator, bound by kube-scheduler):

- burst: BURST pods of 1 GPU (no group) created at once -> pods bound per second (first
  create to last bind) and each pod's create -> bind;
- gang-1: ROUNDS gangs of 1 pod, one after another -> create -> bind;
- gang-16: ROUNDS gangs of 16 pods x 1 GPU (2 nodes' worth), one after another -> last pod
  created -> all 16 bound, and each pod's create -> bind.
Each round's pods are deleted, and (through Slurm) their jobs gone, before the next one.

Times are this process's: a pod watch sees the pod first (created) and with a nodeName (bound).
Bounded: every wait at most WAIT s; about 4 minutes on 2 cores plus the instance's start.
Writes bench/results/<date>-sunk.{json,md}.

    make bench-sunk
    python -m tests.bench.sunk --reuse   # an instance `b-sunk` already up: kept up
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from devcluster import slurm
from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from quorum.k8s.watch import watch_objects
from quorum.sunk import model
from tests.bench.preemption import describe
from tests.kube import api_client, create_namespace, create_podgroup, eventually

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
POOL = Path(__file__).resolve().parents[2] / "devcluster" / "data" / "pool-slurm.yaml"
SUNK_SCHEDULER = "tenant-slurm-slurm-scheduler"
GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"
BURST, ROUNDS, GANG = 24, 8, 16
WAIT = 120.0


@dataclass
class Seen:
    created: float
    bound: float | None = None


@dataclass
class PodLog:
    """When the watch first saw each pod of the namespace, and first saw it bound."""

    pods: dict[str, Seen] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)

    def upsert(self, raw: dict[str, Any]) -> None:
        name, now = raw["metadata"]["name"], time.monotonic()
        seen = self.pods.setdefault(name, Seen(now))
        if (raw.get("spec") or {}).get("nodeName") and seen.bound is None:
            seen.bound = now

    def delete(self, raw: dict[str, Any]) -> None:
        self.gone.add(raw["metadata"]["name"])

    def replace_all(self, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            self.upsert(pod)


def pod(name: str, scheduler: str, group: str | None) -> dict[str, Any]:
    requests = {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
    labels = {GROUP_LABEL: group} if group else {}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "c",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": requests, "limits": {"nvidia.com/gpu": "1"}},
            }
        ],
    }
    annotations = {}
    if scheduler == SUNK_SCHEDULER:
        spec["schedulerName"] = scheduler
        annotations = {model.PARTITION: "gpu"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
    }


class Run:
    def __init__(self, instance: Instance, api: client.ApiClient, namespace: str, scheduler: str) -> None:
        self.instance, self.api, self.namespace, self.scheduler = instance, api, namespace, scheduler
        self.log = PodLog()

    async def create(self, names: list[str], group: str | None) -> None:
        core = client.CoreV1Api(self.api)
        if group:
            await create_podgroup(self.api, self.namespace, group, len(names))
        await asyncio.gather(
            *(core.create_namespaced_pod(self.namespace, pod(n, self.scheduler, group)) for n in names)
        )

    async def all_bound(self, names: list[str], what: str) -> None:
        async def probe() -> bool:
            return all(n in self.log.pods and self.log.pods[n].bound for n in names)

        await eventually(probe, timeout=WAIT, interval=0.02, what=what)

    async def clean(self, names: list[str], group: str | None) -> None:
        core = client.CoreV1Api(self.api)
        await asyncio.gather(
            *(core.delete_namespaced_pod(n, self.namespace, grace_period_seconds=0) for n in names)
        )
        if group:
            await client.CustomObjectsApi(self.api).delete_namespaced_custom_object(
                "scheduling.sigs.k8s.io", "v1alpha1", self.namespace, "podgroups", group
            )

        async def done() -> bool:
            if not set(names) <= self.log.gone:
                return False
            if self.scheduler != SUNK_SCHEDULER:
                return True
            proc = slurm.run(self.instance.slurm_layout, "squeue", "--noheader", "--format=%A")
            return proc.returncode == 0 and not proc.stdout.strip()

        await eventually(done, timeout=WAIT, interval=0.1, what=f"{names[0]}... gone")

    async def burst(self) -> dict[str, Any]:
        names = [f"burst-{i}" for i in range(BURST)]
        start = time.monotonic()
        await self.create(names, None)
        await self.all_bound(names, "the burst bound")
        seconds = max(self.log.pods[n].bound or 0 for n in names) - start
        each = [((self.log.pods[n].bound or 0) - self.log.pods[n].created) * 1000 for n in names]
        await self.clean(names, None)
        return {
            "pods": BURST,
            "pods_per_second": round(BURST / seconds, 2),
            "create_to_bind_ms": describe(each),
        }

    async def gangs(self, size: int) -> dict[str, Any]:
        whole: list[float] = []
        each: list[float] = []
        for r in range(ROUNDS):
            group = f"g{size}-{r}"
            names = [f"{group}-{i}" for i in range(size)]
            await self.create(names, group)
            await self.all_bound(names, f"gang {group} bound")
            seen = [self.log.pods[n] for n in names]
            whole.append((max(s.bound or 0 for s in seen) - max(s.created for s in seen)) * 1000)
            each += [((s.bound or 0) - s.created) * 1000 for s in seen]
            await self.clean(names, group)
        return {"gangs": ROUNDS, "pods": size, "last_created_to_all_bound_ms": describe(whole),
                "create_to_bind_ms": describe(each)}  # fmt: skip

    async def all(self) -> dict[str, Any]:
        listing = functools.partial(client.CoreV1Api(self.api).list_namespaced_pod, self.namespace)
        watch = asyncio.create_task(watch_objects(listing, [self.log], asyncio.Event(), lambda: None))
        try:
            return {
                "burst": await self.burst(),
                "gang_1": await self.gangs(1),
                "gang_16": await self.gangs(GANG),
            }
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)


async def workload(instance: Instance) -> dict[str, Any]:
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        results = {}
        for path, scheduler in (("slurm", SUNK_SCHEDULER), ("quorum", "default-scheduler")):
            namespace = f"bench-sunk-{path}-{int(time.time()) % 100000}"
            await create_namespace(api, namespace)
            try:
                results[path] = await Run(instance, api, namespace, scheduler).all()
            finally:
                await client.CoreV1Api(api).delete_namespace(namespace)
        return results


def markdown(stamp: str, r: dict[str, Any]) -> str:
    def row(what: str, key: str, figure: str) -> str:
        s, q = r["slurm"][key][figure], r["quorum"][key][figure]
        return f"| {what} | {s['p50']} | {s['p99']} | {q['p50']} | {q['p99']} |"

    return "\n".join(
        [
            f"# SUNK scheduler benchmark, {stamp}",
            "",
            "`make bench-sunk`: 4 GPU nodes x 8 GPUs, each a slurmd of a real Slurm 22.05; the same pods "
            "through Slurm (quorum-sunk-scheduler) and through quorum's gang path (quorum-operator + "
            f"kube-scheduler). Pods of 1 GPU; {ROUNDS} gangs of each size one after another.",
            "",
            "| figure | Slurm p50 | Slurm p99 | quorum p50 | quorum p99 |",
            "|---|---|---|---|---|",
            f"| pods bound per second, a burst of {BURST} pods | {r['slurm']['burst']['pods_per_second']} "
            f"| | {r['quorum']['burst']['pods_per_second']} | |",
            row(f"burst of {BURST}: pod create -> bind (ms)", "burst", "create_to_bind_ms"),
            row("gang of 1: pod create -> bind (ms)", "gang_1", "create_to_bind_ms"),
            row(f"gang of {GANG}: pod create -> bind (ms)", "gang_16", "create_to_bind_ms"),
            row(
                f"gang of {GANG}: last pod created -> all bound (ms)",
                "gang_16",
                "last_created_to_all_bound_ms",
            ),
            "",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instance", default="b-sunk")
    parser.add_argument("--reuse", action="store_true", help="use the instance already up; leave it up")
    args = parser.parse_args()
    instance = Instance(args.instance)
    if not args.reuse:
        instance.down(quiet=True)
        instance.up(ClusterSpec(name=args.instance, pool_file=POOL, slurm=True), log=lambda _: None)
    try:
        result = asyncio.run(asyncio.wait_for(workload(instance), timeout=20 * WAIT))
    finally:
        if not args.reuse:
            instance.down(quiet=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out = RESULTS / f"{stamp}-sunk.json"
    out.write_text(json.dumps({"date": stamp, **result}, indent=2) + "\n")
    text = markdown(stamp, result)
    out.with_suffix(".md").write_text(text)
    print(text)
    print(f"written to {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
