"""`make demo`: bring up the local control plane with quorum-webhooks and quorum-operator (the
operator with its ServiceAccount's token), and show, acting as a CKS customer (cluster-admin by
RBAC, not system:masters), the seeds' admission policies, a gang held, then admitted whole, a
low-priority gang preempted whole by a high-priority one, and Slurm scheduling pods (the SUNK Pod
Scheduler, docs/sunk.md: the instance runs a real Slurm beside it). `--instance NAME`: another
instance."""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib.resources import files

from devcluster import slurm
from devcluster.build import BuildError
from devcluster.cluster import REPO_ROOT, ClusterError, Instance
from devcluster.config import ClusterSpec
from devcluster.nodes import TestPool

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
    demo.add_argument("--instance", default="default", help="the instance to start and show")
    demo.set_defaults(func=run)


def section(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def run(args: argparse.Namespace) -> int:
    instance = Instance(getattr(args, "instance", "default"))
    try:
        instance.up(ClusterSpec(name=instance.name, slurm=True))
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
        section(f"Kubernetes {release(instance)} Workload Aware Scheduling API")
        print(instance.kubectl("api-resources", "--api-group=scheduling.k8s.io").stdout.rstrip())
        policies(instance)
        gangs(instance)
        workloads(instance)
        preemption(instance)
        sunk(instance)
    except (BuildError, ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print("\nThe control plane keeps running. Use it with:  . .quorum/env && kubectl get nodes")
    print("Stop it with:  make down")
    return 0


NAMESPACE = "quorum-demo"


def as_customer(instance: Instance, *args: str, stdin: str | None = None) -> None:
    """Run kubectl as the customer and show the command and what it printed."""
    shown = " ".join(a if " " not in a else repr(a) for a in args)
    print(f"\n$ kubectl {shown}" + (" <<EOF ... EOF" if stdin else ""), flush=True)
    done = instance.kubectl(*args, who="customer", input_text=stdin, check=False)
    text = (done.stdout + done.stderr).rstrip()
    print("\n".join("  " + line for line in text.splitlines()), flush=True)


def fresh_namespace(instance: Instance, name: str) -> None:
    """The namespace made anew (an earlier run's is deleted first), with its default
    ServiceAccount: the ServiceAccount admission plugin refuses pods until it exists."""
    instance.kubectl(
        "delete", "namespace", name, "--ignore-not-found", "--wait", "--timeout=60s", check=False
    )
    instance.kubectl("create", "namespace", name)
    wait_for(instance, "-n", name, "get", "serviceaccount", until="default", seconds=30)


def policies(instance: Instance) -> None:
    """Seed 002 (CKS workload scheduling policies), through the real apiserver and webhooks."""
    fresh_namespace(instance, NAMESPACE)
    section("CPU pods get the is_cpu_compute toleration and run on CPU nodes (seed 002)")
    as_customer(instance, "-n", NAMESPACE, "run", "cpu-job", "--image=registry.k8s.io/pause:3.10")
    as_customer(
        instance,
        "-n",
        NAMESPACE,
        "run",
        "gpu-job",
        "--image=registry.k8s.io/pause:3.10",
        '--overrides={"spec":{"containers":[{"name":"gpu-job","image":"registry.k8s.io/pause:3.10",'
        '"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}',
    )
    instance.kubectl(
        "-n",
        NAMESPACE,
        "wait",
        "--for=condition=Ready",
        "pod/cpu-job",
        "pod/gpu-job",
        "--timeout=60s",
        check=False,
    )
    as_customer(
        instance,
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-o",
        "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,TOLERATIONS:.spec.tolerations[*].key",
    )
    section("Labels in *.coreweave.cloud / *.coreweave.com are the platform's")
    as_customer(instance, "label", "node", "gpu-h100-000", "foo.coreweave.cloud/bar=true")
    section("qos.coreweave.cloud/interruptable: only true/false; a warning where eviction hurts")
    as_customer(
        instance,
        "-n",
        NAMESPACE,
        "run",
        "maybe",
        "--image=registry.k8s.io/pause:3.10",
        "--labels=qos.coreweave.cloud/interruptable=maybe",
    )
    trainer = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "trainer"}},
            "template": {
                "metadata": {
                    "labels": {
                        "app": "trainer",
                        "pod-group.scheduling.sigs.k8s.io": "pg1",
                        "qos.coreweave.cloud/interruptable": "true",
                    }
                },
                "spec": {"containers": [{"name": "t", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    }
    as_customer(instance, "-n", NAMESPACE, "apply", "-f", "-", stdin=json.dumps(trainer))
    section("Only quorum removes its scheduling gate (a ValidatingAdmissionPolicy in the apiserver)")
    gated = {
        "apiVersion": "v1",
        "kind": "Pod",
        # A gang pod whose PodGroup does not exist (yet): quorum's webhook gates it.
        "metadata": {"name": "gated", "labels": {"pod-group.scheduling.sigs.k8s.io": "not-created-yet"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }
    instance.kubectl("-n", NAMESPACE, "apply", "-f", "-", input_text=json.dumps(gated))
    as_customer(
        instance,
        "-n",
        NAMESPACE,
        "patch",
        "pod",
        "gated",
        "--type=json",
        '-p=[{"op":"remove","path":"/spec/schedulingGates"}]',
    )


GANG_NAMESPACE = "quorum-demo-gang"


def wait_for(instance: Instance, *args: str, until: str, seconds: int = 60) -> None:
    for _ in range(seconds * 2):
        if until in instance.kubectl(*args, check=False).stdout:
            return
        time.sleep(0.5)


def gangs(instance: Instance) -> None:
    """Seed 001: PodGroup pg1 wants 4 pods; the Deployment makes 2. quorum holds both at its
    gate, and releases all 4 together once the Deployment is scaled to 4."""
    fresh_namespace(instance, GANG_NAMESPACE)
    ns = ("-n", GANG_NAMESPACE)
    section(
        "Seed 001: a PodGroup of minMember 4 and a Deployment of 2 replicas (schedulerName cw-coscheduler)"
    )
    manifest = files("devcluster").joinpath("data/seed-001-podgroup-pause.yaml").read_text()
    as_customer(instance, *ns, "apply", "-f", "-", stdin=manifest)
    wait_for(instance, *ns, "get", "gangs", until="WaitingForMembers")
    section("Both pods are held at quorum's gate; the PodGroup and the Gang say why")
    as_customer(
        instance,
        *ns,
        "get",
        "pods",
        "-o",
        "custom-columns=POD:.metadata.name,STATUS:.status.conditions[0].reason,"
        "GATES:.spec.schedulingGates[*].name,GANG:.metadata.labels.quorum\\.dev/gang,"
        "SCHEDULER:.spec.schedulerName",
    )
    as_customer(instance, *ns, "get", "podgroups.scheduling.sigs.k8s.io,gangs", "-o", "wide")
    section("Scale to 4: now the gang is whole, quorum plans it node by node and releases all 4 together")
    as_customer(instance, *ns, "scale", "deployment", "pause", "--replicas=4")
    wait_for(instance, *ns, "get", "gangs", until="Running")
    instance.kubectl(
        *ns, "wait", "--for=condition=Ready", "pod", "-l", "app=pause", "--timeout=60s", check=False
    )
    as_customer(instance, *ns, "get", "pods", "-o", "wide")
    as_customer(instance, *ns, "get", "podgroups.scheduling.sigs.k8s.io,gangs")
    as_customer(instance, *ns, "get", "events", "--field-selector=reason=Released")


WAS_NAMESPACE = "quorum-demo-workloads"
RACK = "network.topology.kubernetes.io/rack"
TOO_WIDE = """
apiVersion: scheduling.k8s.io/VERSION
kind: PodGroup
metadata: {name: wide}
spec:
  schedulingPolicy: {gang: {minCount: 5}}
  schedulingConstraints: {topology: [{key: network.topology.kubernetes.io/rack}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: wide}
spec:
  completionMode: Indexed
  completions: 5
  parallelism: 5
  template:
    metadata: {annotations: {pod-complete.stage.kwok.x-k8s.io/delay: 600s}}
    spec:
      schedulingGroup: {podGroupName: wide}
      restartPolicy: Never
      containers: [{name: c, image: registry.k8s.io/pause:3.10, resources: {limits: {nvidia.com/gpu: "8"}}}]
"""


COMPOSITE = """
apiVersion: scheduling.k8s.io/v1beta1
kind: Workload
metadata: {name: pretrain}
spec:
  compositePodGroupTemplates:
    - name: job
      schedulingPolicy: {gang: {minGroupCount: 2}}
      podGroupTemplates:
        - {name: launcher, schedulingPolicy: {gang: {minCount: 1}}}
        - {name: workers, schedulingPolicy: {gang: {minCount: 2}}}
---
apiVersion: scheduling.k8s.io/v1alpha3
kind: CompositePodGroup
metadata: {name: pretrain-job}
spec:
  workloadRef: {workloadName: pretrain, templateName: job}
  schedulingPolicy: {gang: {minGroupCount: 2}}
---
apiVersion: scheduling.k8s.io/v1beta1
kind: PodGroup
metadata: {name: pretrain-launcher}
spec:
  parentCompositePodGroupName: pretrain-job
  workloadRef: {workloadName: pretrain, templateName: launcher}
  schedulingPolicy: {gang: {minCount: 1}}
---
apiVersion: scheduling.k8s.io/v1beta1
kind: PodGroup
metadata: {name: pretrain-workers}
spec:
  parentCompositePodGroupName: pretrain-job
  workloadRef: {workloadName: pretrain, templateName: workers}
  schedulingPolicy: {gang: {minCount: 2}}
---
apiVersion: v1
kind: Pod
metadata: {name: launcher}
spec:
  schedulingGroup: {podGroupName: pretrain-launcher}
  containers: [{name: c, image: registry.k8s.io/pause:3.10, resources: {limits: {cpu: "1"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: worker-0}
spec:
  schedulingGroup: {podGroupName: pretrain-workers}
  containers: [{name: c, image: registry.k8s.io/pause:3.10, resources: {limits: {nvidia.com/gpu: "8"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: worker-1}
spec:
  schedulingGroup: {podGroupName: pretrain-workers}
  containers: [{name: c, image: registry.k8s.io/pause:3.10, resources: {limits: {nvidia.com/gpu: "8"}}}]
"""


def release(instance: Instance) -> str:
    """The Kubernetes minor the instance runs."""
    state = instance.state()
    return state.spec.kubernetes if state is not None else "?"


def workloads(instance: Instance) -> None:
    """Seed 004: a Kubernetes Workload (1.37: v1beta1) whose gang must sit in one rack; then a gang
    that fits the cluster but no single rack, held with the reason per rack."""
    fresh_namespace(instance, WAS_NAMESPACE)
    ns = ("-n", WAS_NAMESPACE)
    section(
        "Seed 004: a Workload + PodGroup (gang minCount 4, topology: one rack) + an Indexed Job of 4 x 8 GPUs"
    )
    examples = REPO_ROOT / "examples/seed-004-workload-aware"
    legacy = release(instance) == "1.36"  # 1.36 spells the API v1alpha2
    manifest = (
        examples / "kubernetes-1.36" / "topology.yaml" if legacy else examples / "topology.yaml"
    ).read_text()
    as_customer(instance, *ns, "apply", "-f", "-", stdin=manifest)
    wait_for(instance, *ns, "get", "gangs", until="Running")
    section("All 4 in one rack: the one that fits with the least room left, so emptier racks stay whole")
    pods = json.loads(instance.kubectl(*ns, "get", "pods", "-o", "json").stdout)["items"]
    nodes = json.loads(instance.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    racks = {n["metadata"]["name"]: n["metadata"]["labels"].get(RACK, "-") for n in nodes}
    print("  POD                NODE               RACK")
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        node = pod["spec"].get("nodeName") or "-"
        print(f"  {pod['metadata']['name']:<18} {node:<18} {racks.get(node, '-')}")
    as_customer(instance, *ns, "get", "gangs", "-o", "wide")
    section("The PodGroup carries quorum's conditions beside kube-scheduler's own")
    as_customer(
        instance,
        *ns,
        "get",
        "podgroups.scheduling.k8s.io",
        "ring-workers",
        "-o",
        "jsonpath={range .status.conditions[*]}{.type}={.status} ({.reason}){'\\n'}{end}",
    )
    section("A gang of 5 whole nodes in one rack: the cluster has room, but no rack of 4 can take it")
    as_customer(
        instance,
        *ns,
        "apply",
        "-f",
        "-",
        stdin=TOO_WIDE.replace("VERSION", "v1alpha2" if legacy else "v1beta1"),
    )
    wait_for(instance, *ns, "get", "gangs", until="Unschedulable")
    as_customer(
        instance,
        *ns,
        "get",
        "gang",
        "wpg-wide",
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Admitted')].message}{'\\n'}",
    )
    if not legacy:
        section(
            "Kubernetes 1.37: a CompositePodGroup (a launcher gang and a workers gang, minGroupCount 2): "
            "both gangs are released together, or neither"
        )
        as_customer(instance, *ns, "apply", "-f", "-", stdin=COMPOSITE)
        wait_for(instance, *ns, "get", "gang", "wpg-pretrain-workers", until="Running")
        as_customer(instance, *ns, "get", "compositepodgroups,podgroups.scheduling.k8s.io,gangs")
    section("Clean up")
    as_customer(instance, "delete", "namespace", GANG_NAMESPACE, NAMESPACE, WAS_NAMESPACE, "--wait=false")


PREEMPT_NAMESPACE = "quorum-demo-preemption"
PRIORITIES = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: quorum-demo-low}
value: 10
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: quorum-demo-high}
value: 1000
"""


def gang_of_whole_nodes(name: str, pods: int, priority: str, pool: TestPool) -> str:
    """A PodGroup and a Deployment of `pods` x 8 GPUs in `pool`, as JSON documents."""
    group = {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": pods},
    }
    container = {
        "name": "c",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
    }
    spec = {"schedulerName": "cw-coscheduler", "priorityClassName": priority, "containers": [container]}
    labels = {"app": name, "pod-group.scheduling.sigs.k8s.io": name}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": pods,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": labels}, "spec": {**spec, **pool.pod_spec()}},
        },
    }
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [group, deployment]})


def preemption(instance: Instance) -> None:
    """A low-priority gang fills 2 whole nodes; a high-priority gang of 2 x 8 GPUs
    arrives; quorum preempts the low gang whole, and its pods come back held at the gate."""
    fresh_namespace(instance, PREEMPT_NAMESPACE)
    ns = ("-n", PREEMPT_NAMESPACE)
    pool = TestPool("demo-preempt", 2)
    instance.kubectl("delete", "node", *pool.names, "--ignore-not-found", check=False)
    nodes = {"apiVersion": "v1", "kind": "List", "items": pool.nodes}
    instance.kubectl("create", "-f", "-", who="platform", input_text=json.dumps(nodes))
    instance.kubectl("wait", "--for=condition=Ready", "node", *pool.names, "--timeout=60s", check=False)
    section("Preemption: two nodes of 8 GPUs, full with a low-priority gang (priority 10)")
    as_customer(instance, "apply", "-f", "-", stdin=PRIORITIES)
    as_customer(
        instance, *ns, "apply", "-f", "-", stdin=gang_of_whole_nodes("low", 2, "quorum-demo-low", pool)
    )
    wait_for(instance, *ns, "get", "gang", "pg-low", until="Running")
    as_customer(instance, *ns, "get", "pods", "-o", "wide")
    section("A high-priority gang (priority 1000, 2 x 8 GPUs) arrives: quorum preempts the low gang whole")
    as_customer(
        instance, *ns, "apply", "-f", "-", stdin=gang_of_whole_nodes("high", 2, "quorum-demo-high", pool)
    )
    wait_for(instance, *ns, "get", "gang", "pg-high", until="Running")
    wait_for(instance, *ns, "get", "events", "--field-selector=reason=Preempted", until="Preempted")
    as_customer(instance, *ns, "get", "gangs")
    as_customer(
        instance,
        *ns,
        "get",
        "pods",
        "-o",
        "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase,"
        "GATES:.spec.schedulingGates[*].name",
    )
    as_customer(instance, *ns, "get", "events", "--field-selector=reason=Preempting")
    as_customer(instance, *ns, "get", "events", "--field-selector=reason=Preempted")
    as_customer(
        instance,
        *ns,
        "get",
        "gang",
        "pg-low",
        "-o",
        "jsonpath={range .status.conditions[?(@.type=='Preempted')]}"
        "{.type}={.status} ({.reason}): {.message}{'\\n'}{end}",
    )
    section("Clean up")
    as_customer(instance, "delete", "namespace", PREEMPT_NAMESPACE, "--wait=false")
    instance.kubectl("delete", "node", *pool.names, "--wait=false", check=False)


SUNK_NAMESPACE = "quorum-demo-sunk"
SUNK_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: trainer
  annotations: {sunk.coreweave.com/partition: gpu, sunk.coreweave.com/nodes: gpu-h100-014}
spec:
  schedulerName: tenant-slurm-slurm-scheduler
  terminationGracePeriodSeconds: 5
  containers:
    - name: c
      image: registry.k8s.io/pause:3.10
      resources:
        requests: {cpu: "4", memory: 16Gi, nvidia.com/gpu: "4"}
        limits: {nvidia.com/gpu: "4"}
"""
SUNK_GANG = """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata: {name: ranks}
spec: {minMember: 2}
---
apiVersion: batch/v1
kind: Job
metadata: {name: ranks}
spec:
  completions: 2
  parallelism: 2
  template:
    metadata:
      labels: {scheduling.x-k8s.io/pod-group: ranks}
      annotations:
        sunk.coreweave.com/partition: gpu
        sunk.coreweave.com/nodes: "gpu-h100-012,gpu-h100-013"
        pod-complete.stage.kwok.x-k8s.io/delay: 600s
    spec:
      schedulerName: tenant-slurm-slurm-scheduler
      terminationGracePeriodSeconds: 5
      restartPolicy: Never
      containers:
        - name: c
          image: registry.k8s.io/pause:3.10
          resources:
            requests: {cpu: "8", memory: 32Gi, nvidia.com/gpu: "8"}
            limits: {nvidia.com/gpu: "8"}
"""
SUNK_BYSTANDER = """
apiVersion: v1
kind: Pod
metadata: {name: bystander}
spec:
  nodeName: gpu-h100-015
  tolerations: [{key: is_gpu, operator: Exists}]
  containers: [{name: c, image: registry.k8s.io/pause:3.10}]
"""


def as_slurm_user(instance: Instance, *argv: str) -> str:
    """Run a Slurm command against the instance's Slurm and show it and what it printed."""
    print(f"\n$ {' '.join(argv)}", flush=True)
    done = slurm.run(instance.slurm_layout, *argv)
    text = (done.stdout + done.stderr).rstrip()
    print("\n".join("  " + line for line in text.splitlines()), flush=True)
    return done.stdout.strip()


def sunk(instance: Instance) -> None:
    """Seed 003: a pod whose schedulerName is the SUNK scheduler's runs where Slurm put it; a
    gang is one Slurm job; a Slurm batch job locks its node and the pod there that does not
    tolerate the lock is evicted (seed 002)."""
    fresh_namespace(instance, SUNK_NAMESPACE)
    ns = ("-n", SUNK_NAMESPACE)
    squeue = ("squeue", "--format=%.6i %.9P %.40j %.8T %.10M %N")
    section("SUNK (seed 003): a pod with schedulerName tenant-slurm-slurm-scheduler; Slurm places it")
    as_customer(instance, *ns, "apply", "-f", "-", stdin=SUNK_POD)
    wait_for(instance, *ns, "get", "pod", "trainer", "-o", "wide", until="gpu-h100-014", seconds=60)
    as_customer(instance, *ns, "get", "pods", "-o", "wide")
    as_slurm_user(instance, *squeue)
    as_customer(instance, *ns, "get", "events", "--field-selector=involvedObject.name=trainer")
    section("A gang through Slurm: a PodGroup of 2 pods is one Slurm job, placed all or nothing")
    as_customer(instance, *ns, "apply", "-f", "-", stdin=SUNK_GANG)
    wait_for(instance, *ns, "get", "gang", "xpg-ranks", until="Running", seconds=60)
    as_customer(instance, *ns, "get", "pods", "-l", "scheduling.x-k8s.io/pod-group=ranks", "-o", "wide")
    as_slurm_user(instance, *squeue)
    as_customer(instance, *ns, "get", "gang", "xpg-ranks", "-o", "wide")
    section("Node locking (seed 002): a Slurm batch job on gpu-h100-015 evicts the pod there that does not "
            "tolerate sunk.coreweave.com/lock")  # fmt: skip
    as_customer(instance, *ns, "apply", "-f", "-", stdin=SUNK_BYSTANDER)
    wait_for(instance, *ns, "get", "pod", "bystander", until="Running", seconds=30)
    as_customer(instance, *ns, "get", "pods", "-o", "wide")
    as_slurm_user(instance, "sbatch", "-w", "gpu-h100-015", "--gres=gpu:8", "-o", "/dev/null",
                  "--wrap", "sleep 30")  # fmt: skip
    for _ in range(120):
        if "bystander" not in instance.kubectl(*ns, "get", "pods", check=False).stdout:
            break
        time.sleep(0.5)
    as_slurm_user(instance, *squeue)
    as_customer(
        instance,
        "get",
        "node",
        "gpu-h100-015",
        "-o",
        "custom-columns=NODE:.metadata.name,LOCK:.metadata.annotations.sunk\\.coreweave\\.com/lock,"
        "TAINTS:.spec.taints[*].key",
    )
    as_customer(instance, *ns, "get", "events", "--field-selector=involvedObject.name=bystander")
    as_customer(instance, *ns, "get", "pods", "-o", "wide")
    section("Clean up: deleting the pods cancels their Slurm jobs")
    as_customer(instance, "delete", "namespace", SUNK_NAMESPACE, "--wait=false")
