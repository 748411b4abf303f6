"""The SUNK scheduler against a real Slurm 22.05 (munge, slurmctld, slurmrestd, one slurmd per
kwok node) on an instance of its own (`t-sunk`, pool data/pool-slurm.yaml: slurm-gpu-000..003,
slurm-cpu-000, a cordoned GPU node). Each test names the nodes it uses, so tests do not meet.
The scheduler runs under its fence (quorum-sunk-scheduler-fence, applied as the instance is up),
so every test shows the fence lets its real writes through."""

from __future__ import annotations

import re
import secrets
import subprocess
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster import slurm
from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from quorum.core.gangs import PLACED_BY_LABEL
from quorum.sunk import model
from quorum.sunk.slurm import SlurmRest
from tests.kube import api_client, create_namespace, eventually, raw_json

pytestmark = pytest.mark.cluster

POOL = Path(__file__).resolve().parents[2] / "devcluster" / "data" / "pool-slurm.yaml"
SCHEDULER = "tenant-slurm-slurm-scheduler"
FENCE = "ValidatingAdmissionPolicy 'quorum-sunk-scheduler-fence'"


@pytest.fixture(scope="module")
def sunk() -> Iterator[Instance]:
    instance = Instance("t-sunk")
    instance.up(ClusterSpec(name=instance.name, pool_file=POOL, slurm=True))
    try:
        yield instance
    finally:
        instance.down(quiet=True)


@pytest.fixture
async def api(sunk: Instance) -> AsyncIterator[client.ApiClient]:
    api = await api_client(sunk.kubeconfig("admin"))
    async with api:
        yield api


@pytest.fixture
async def ns(api: client.ApiClient) -> AsyncIterator[str]:
    name = f"sunk-{secrets.token_hex(3)}"
    await create_namespace(api, name)
    yield name
    await client.CoreV1Api(api).delete_namespace(name, propagation_policy="Background")


def run(sunk: Instance, *argv: str) -> str:
    proc = slurm.run(sunk.slurm_layout, *argv)
    assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stderr}"
    return proc.stdout.strip()


def job_states(sunk: Instance) -> dict[int, tuple[str, str, str]]:
    """{job id: (state, nodes, comment)} of every job slurmctld still knows."""
    out = run(
        sunk, "squeue", "--noheader", "--states=all", "--format=%A|%T|%N|%k"
    )  # %A: hetjob components too
    found = {}
    for line in out.splitlines():
        job, state, nodes, comment = line.split("|", 3)
        if job.isdigit():
            found[int(job)] = (state, nodes, comment)
    return found


def jobs_of(sunk: Instance, pod_name: str) -> dict[int, tuple[str, str, str]]:
    return {j: s for j, s in job_states(sunk).items() if f"/{pod_name}/" in s[2]}


async def job_ended(sunk: Instance, job: int) -> bool:
    """Slurm no longer runs the job (or has forgotten it)."""
    state = job_states(sunk).get(job, ("GONE",))[0]
    return state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")


def pod(name: str, gpus: int = 2, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    requests = {"cpu": "2", "memory": "4Gi"}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "schedulerName": SCHEDULER,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": requests,
                        "limits": {k: v for k, v in requests.items() if "/" in k},
                    },
                }
            ],
            **spec,
        },
    }


async def read_pod(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] = await raw_json(
        client.CoreV1Api(api).read_namespaced_pod(name, ns, _preload_content=False)
    )
    # Unparsed answers are not checked by the client: a 404 arrives as a Status object.
    return None if found.get("kind") == "Status" else found


async def bound(api: client.ApiClient, ns: str, name: str) -> str | None:
    found = await read_pod(api, ns, name)
    node: str | None = (found or {}).get("spec", {}).get("nodeName")
    return node


async def events(api: client.ApiClient, ns: str, name: str) -> list[tuple[str, str]]:
    listing = await raw_json(client.CoreV1Api(api).list_namespaced_event(ns, _preload_content=False))
    return [(e["reason"], e["message"]) for e in listing["items"] if e["involvedObject"]["name"] == name]


async def node_lock(api: client.ApiClient, name: str) -> str:
    node = await raw_json(client.CoreV1Api(api).read_node(name, _preload_content=False))
    return str((node["metadata"].get("annotations") or {}).get(model.LOCK, "false"))


def passes(sunk: Instance) -> float:
    state = sunk.state()
    assert state is not None
    text = urllib.request.urlopen(f"http://127.0.0.1:{state.ports.sunk}/metrics", timeout=5).read().decode()
    return sum(float(v) for v in re.findall(r'^quorum_sunk_passes_total\{result="ok"\} (\S+)$', text, re.M))


async def test_a_pod_runs_where_slurm_put_it_and_its_deletion_cancels_the_job(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(ns, pod("p1", annotations={model.NODES: "slurm-gpu-000"}))
    node = await eventually(lambda: bound(api, ns, "p1"), timeout=60, what="p1 bound")
    (job, (state, slurm_node, comment)), *_ = jobs_of(sunk, "p1").items()
    assert (node, slurm_node, state) == ("slurm-gpu-000", "slurm-gpu-000", "RUNNING")
    assert comment.endswith(model.STARTED)
    assert await node_lock(api, node) == "locked_strict"
    reasons = [r for r, _ in await events(api, ns, "p1")]
    assert "SlurmJobSubmitted" in reasons and "Scheduled" in reasons
    found = await read_pod(api, ns, "p1")
    assert found is not None and model.tolerates_lock(found)
    assert found["metadata"]["annotations"][model.JOB_ID] == str(job), "the Binding recorded the job"
    # The secret alone does not stop a job that runs: Slurm is not ending it.
    token = sunk.slurm_layout.hook_token.read_text().strip()
    status, text = call_hook(sunk, f"/hooks/stop?job={job}", token)
    assert (status, text.strip().split(":")[0]) == (403, f"job {job} is RUNNING in Slurm, not stopping")
    assert await bound(api, ns, "p1") == node and jobs_of(sunk, "p1")[job][0] == "RUNNING"

    await core.delete_namespaced_pod("p1", ns)
    await eventually(lambda: job_ended(sunk, job), timeout=60, what=f"job {job} cancelled")

    async def unlocked() -> bool:
        return await node_lock(api, node) == "false"

    await eventually(unlocked, timeout=30, what=f"{node} unlocked by the epilog")


async def test_a_pod_that_slurm_cannot_take_gets_an_event_and_no_job_until_it_changes(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    bad = pod("bad", gpus=0)
    bad["spec"]["terminationGracePeriodSeconds"] = 30
    del bad["spec"]["containers"][0]["resources"]["requests"]["memory"]
    bad["metadata"]["annotations"] = {model.EXCLUSIVE: "sometimes"}
    await client.CoreV1Api(api).create_namespaced_pod(ns, bad)

    async def refused() -> str | None:
        return next((m for r, m in await events(api, ns, "bad") if r == "FailedValidation"), None)

    message = await eventually(refused, timeout=30, what="a FailedValidation Event")
    assert "memory" in message and "terminationGracePeriodSeconds is 30" in message and "exclusive" in message
    seen = passes(sunk)

    async def later() -> bool:
        return passes(sunk) >= seen + 3

    await eventually(later, timeout=30, what="three more scheduler passes")
    assert jobs_of(sunk, "bad") == {}
    assert [r for r, _ in await events(api, ns, "bad")].count("FailedValidation") == 1
    assert await bound(api, ns, "bad") is None


async def test_cancelling_the_job_in_slurm_deletes_the_pod_and_says_why(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    await client.CoreV1Api(api).create_namespaced_pod(
        ns, pod("p2", annotations={model.NODES: "slurm-gpu-001"})
    )
    await eventually(lambda: bound(api, ns, "p2"), timeout=60, what="p2 bound")
    (job,) = jobs_of(sunk, "p2")
    run(sunk, "scancel", str(job))

    async def gone() -> bool:
        return await read_pod(api, ns, "p2") is None

    await eventually(gone, timeout=60, what="p2 deleted")
    messages = dict(await events(api, ns, "p2"))
    assert "SlurmJobCancelled" in messages, messages
    assert f"Slurm job {job} was cancelled" in messages["SlurmJobCancelled"]


async def test_a_slurm_batch_job_locks_its_node_and_evicts_pods_that_do_not_tolerate_the_lock(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    tolerations = [{"key": "is_gpu", "operator": "Exists"}]
    plain: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {
            "nodeName": "slurm-gpu-003",
            "tolerations": tolerations,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    # A DaemonSet's pod tolerates the lock (seed 002): only pods the DaemonSet controller creates
    # may (the policy quorum-reserved-tolerations); pinned to the node by its nodeSelector.
    selector = {"app": "daemon"}
    daemon_spec = {
        "nodeSelector": {"kubernetes.io/hostname": "slurm-gpu-003"},
        "tolerations": [*tolerations, model.LOCK_TOLERATION],
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
    }
    daemonset = {
        "metadata": {"name": "daemon"},
        "spec": {
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": selector}, "spec": daemon_spec},
        },
    }
    await core.create_namespaced_pod(ns, plain)
    await client.AppsV1Api(api).create_namespaced_daemon_set(ns, daemonset)

    async def running(name: str) -> bool:
        found = await read_pod(api, ns, name)
        return found is not None and found["status"].get("phase") == "Running"

    async def daemon_pod() -> str | None:
        found = (await core.list_namespaced_pod(ns, label_selector="app=daemon")).items
        return found[0].metadata.name if found else None

    daemon = await eventually(daemon_pod, timeout=30, what="the DaemonSet's pod")
    await eventually(lambda: running("plain"), timeout=30, what="plain running")
    await eventually(lambda: running(daemon), timeout=30, what="the DaemonSet's pod running")
    out = run(
        sunk,
        "sbatch",
        "--parsable",
        "-w",
        "slurm-gpu-003",
        "--gres=gpu:8",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 5",
    )
    job = int(out.split(";")[0])

    async def evicted() -> bool:
        return await read_pod(api, ns, "plain") is None

    await eventually(evicted, timeout=60, what="plain evicted by the lock taint")
    await eventually(lambda: job_ended(sunk, job), timeout=60, what=f"batch job {job} done")
    assert job_states(sunk)[job][0] == "COMPLETED"
    assert await running(daemon), "a pod that tolerates the lock stays"

    async def unlocked() -> bool:
        return await node_lock(api, "slurm-gpu-003") == "false"

    await eventually(unlocked, timeout=30, what="slurm-gpu-003 unlocked")


async def test_preemption_both_ways_by_partition_priority(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    # A Slurm job in the high partition preempts a pod's placeholder: the pod is deleted.
    await core.create_namespaced_pod(ns, pod("low", gpus=8, annotations={model.NODES: "slurm-gpu-002"}))
    await eventually(lambda: bound(api, ns, "low"), timeout=60, what="low bound")
    high = run(sunk, "sbatch", "--parsable", "-p", "gpu-high", "-w", "slurm-gpu-002", "--gres=gpu:8",
               "-o", "/dev/null", "--wrap", "sleep 3")  # fmt: skip

    async def low_gone() -> bool:
        return await read_pod(api, ns, "low") is None

    await eventually(low_gone, timeout=90, what="the preempted pod deleted")
    messages = dict(await events(api, ns, "low"))
    assert "SlurmJobPreempted" in messages, messages
    await eventually(lambda: job_ended(sunk, int(high)), timeout=60, what="the high job done")

    # A pod in the high partition preempts a Slurm batch job.
    batch = int(run(sunk, "sbatch", "--parsable", "-p", "gpu", "-w", "slurm-gpu-002", "--gres=gpu:8",
                    "-o", "/dev/null", "--wrap", "sleep 600"))  # fmt: skip

    async def batch_running() -> bool:
        return job_states(sunk).get(batch, ("",))[0] == "RUNNING"

    await eventually(batch_running, timeout=60, what="the batch job running")
    urgent = pod("urgent", gpus=8, annotations={model.NODES: "slurm-gpu-002", model.PARTITION: "gpu-high"})
    await core.create_namespaced_pod(ns, urgent)
    node = await eventually(lambda: bound(api, ns, "urgent"), timeout=90, what="urgent bound")
    assert node == "slurm-gpu-002"
    assert job_states(sunk)[batch][0] == "PREEMPTED"
    await core.delete_namespaced_pod("urgent", ns)


async def test_a_restarted_scheduler_leaves_no_orphan_and_a_pod_left_at_killwait_drains_its_node(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(ns, pod("a", annotations={model.NODES: "slurm-gpu-000"}))
    await core.create_namespaced_pod(ns, pod("b", annotations={model.NODES: "slurm-gpu-001"}))
    await eventually(lambda: bound(api, ns, "a"), timeout=60, what="a bound")
    await eventually(lambda: bound(api, ns, "b"), timeout=60, what="b bound")
    (job_a,), (job_b,) = jobs_of(sunk, "a"), jobs_of(sunk, "b")

    sunk.stop_component("quorum-sunk-scheduler")
    try:
        await core.delete_namespaced_pod("a", ns, grace_period_seconds=0)
        run(sunk, "scancel", str(job_b))  # its script cannot reach the scheduler: it drains the node

        def drained() -> str | None:
            line = run(sunk, "sinfo", "--noheader", "--Node", "--nodes=slurm-gpu-001", "--format=%T|%E")
            return line if line.startswith("drain") else None

        async def drained_async() -> str | None:
            return drained()

        line = await eventually(drained_async, timeout=60, what="slurm-gpu-001 drained at KillWait")
        assert f"pods of job {job_b} still running at KillWait" in line
        assert job_states(sunk)[job_a][0] == "RUNNING", (
            "nobody cancelled a's job while the scheduler was down"
        )
    finally:
        sunk.start_component("quorum-sunk-scheduler")

    await eventually(lambda: job_ended(sunk, job_a), timeout=60, what="a's orphan job cancelled")

    async def b_gone() -> bool:
        return await read_pod(api, ns, "b") is None

    await eventually(b_gone, timeout=60, what="b, whose job was cancelled, deleted")
    run(sunk, "scontrol", "update", "NodeName=slurm-gpu-001", "State=RESUME")


async def test_a_cordoned_kubernetes_node_is_drained_in_slurm_and_resumed_when_uncordoned(
    sunk: Instance, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    name = "slurm-cpu-000"

    def state() -> str:
        return run(sunk, "sinfo", "--noheader", "--Node", f"--nodes={name}", "--format=%T|%E")

    async def drained() -> str | None:
        line = state()
        return line if line.startswith("drain") else None

    async def resumed() -> str | None:
        line = state()
        return line if line.startswith("idle") else None

    await core.patch_node(name, {"spec": {"unschedulable": True}})
    try:
        line = await eventually(drained, timeout=30, what=f"{name} drained in Slurm")
        assert "cordoned" in line
    finally:
        await core.patch_node(name, {"spec": {"unschedulable": False}})
    await eventually(resumed, timeout=30, what=f"{name} resumed in Slurm")
    assert "drain" in run(
        sunk, "sinfo", "--noheader", "--Node", "--nodes=slurm-gpu-cordoned-000", "--format=%T"
    )


async def test_a_node_drained_in_slurm_by_an_admin_shows_on_its_kubernetes_node_until_resumed(
    sunk: Instance, api: client.ApiClient
) -> None:
    """SUNK's way back: a drain made in Slurm is left alone, and shows on the Kubernetes node as
    the `sunk.coreweave.com/drain` annotation and the `SlurmCordon` condition."""
    name = "slurm-cpu-000"

    async def node() -> dict[str, Any]:
        found: dict[str, Any] = await raw_json(client.CoreV1Api(api).read_node(name, _preload_content=False))
        return found

    def cordon(found: dict[str, Any]) -> dict[str, Any]:
        conditions = found["status"].get("conditions") or []
        return next((c for c in conditions if c["type"] == model.SLURM_CORDON), {})

    async def shown() -> dict[str, Any] | None:
        found = await node()
        drained = (found["metadata"].get("annotations") or {}).get(model.DRAIN_ANNOTATION) == "bad DIMM"
        return found if drained and cordon(found).get("status") == "True" else None

    async def cleared() -> dict[str, Any] | None:
        found = await node()
        gone = model.DRAIN_ANNOTATION not in (found["metadata"].get("annotations") or {})
        return found if gone and cordon(found).get("status") == "False" else None

    run(sunk, "scontrol", "update", f"NodeName={name}", "State=DRAIN", "Reason=bad DIMM")
    try:
        found = await eventually(shown, timeout=30, what=f"{name}'s Slurm drain shown on the node")
        assert (cordon(found)["reason"], cordon(found)["message"]) == ("SlurmDrain", "bad DIMM")
        assert not found["spec"].get("unschedulable"), "the Kubernetes side is told, not cordoned"
        assert {c["type"] for c in found["status"]["conditions"]} >= {"Ready", model.SLURM_CORDON}
        line = run(sunk, "sinfo", "--noheader", "--Node", f"--nodes={name}", "--format=%T|%E")
        assert line.startswith("drain") and "bad DIMM" in line, f"someone else's drain is not undone: {line}"
    finally:
        run(sunk, "scontrol", "update", f"NodeName={name}", "State=RESUME")
    found = await eventually(cleared, timeout=30, what=f"{name}'s SlurmCordon False once resumed")
    assert cordon(found)["reason"] == "SlurmAvailable"


async def read_gang(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] = await raw_json(
        client.CustomObjectsApi(api).get_namespaced_custom_object(
            "quorum.dev", "v1alpha1", ns, "gangs", name, _preload_content=False
        )
    )
    return None if found.get("kind") == "Status" else found


def condition(gang: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    conditions = ((gang or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


async def test_a_gang_is_one_slurm_job_placed_all_or_nothing_and_its_gang_tells_the_story(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    # Slurm's gpu partition has four GPU nodes; a batch job takes one of them.
    blocker = int(run(sunk, "sbatch", "--parsable", "-p", "gpu", "-w", "slurm-gpu-003", "--gres=gpu:8",
                      "-o", "/dev/null", "--wrap", "sleep 600"))  # fmt: skip
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", ns, "podgroups",
        {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "train"},
         "spec": {"minMember": 4}},
    )  # fmt: skip
    names = [f"worker-{i}" for i in range(4)]
    for name in names:
        member = pod(name, gpus=8, annotations={model.PARTITION: "gpu"})
        member["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "train"}
        await core.create_namespaced_pod(ns, member)

    async def held_for_room() -> dict[str, Any] | None:
        gang = await read_gang(api, ns, "xpg-train")
        return gang if condition(gang, "Unschedulable").get("reason") == "SlurmResources" else None

    # Slurm decided: the whole gang waits for room, and no pod of it has a node.
    gang = await eventually(held_for_room, timeout=90, what="the Gang held by Slurm for room")
    assert gang["metadata"]["labels"][PLACED_BY_LABEL] == "slurm"
    # By the operator's rules: Pending, not admitted, for the reason Slurm gives.
    assert gang["status"]["phase"] == "Pending" and gang["status"]["members"] == 4
    assert condition(gang, "Admitted")["status"] == "False"
    assert condition(gang, "Admitted")["reason"] == "SlurmResources"
    job = gang["status"]["slurm"]["jobId"]
    assert job_states(sunk)[job][0] == "PENDING"
    assert [await bound(api, ns, n) for n in names] == [None] * 4
    assert len([j for j, s in job_states(sunk).items() if "gang/" + ns + "/xpg-train" in s[2]]) == 1

    run(sunk, "scancel", str(blocker))

    async def running() -> dict[str, Any] | None:
        gang = await read_gang(api, ns, "xpg-train")
        return gang if (gang or {}).get("status", {}).get("phase") == "Running" else None

    gang = await eventually(running, timeout=90, what="the whole gang bound")
    nodes = [await bound(api, ns, n) for n in names]
    assert sorted(n or "" for n in nodes) == [f"slurm-gpu-00{i}" for i in range(4)]
    assert condition(gang, "Admitted")["reason"] == "Released"
    assert (gang["status"]["released"], gang["status"]["slurm"]["state"]) == (4, "RUNNING")
    assert gang["status"]["bound"] == 4 and gang["spec"]["minMember"] == 4
    assert gang["metadata"]["ownerReferences"][0]["name"] == "train"

    for name in names:
        await core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    await eventually(lambda: job_ended(sunk, job), timeout=60, what=f"gang job {job} cancelled")


async def test_a_gang_of_two_shapes_is_a_heterogeneous_job_submitted_once_all_its_pods_exist(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    labels = {
        "pod-group.scheduling.sigs.k8s.io/name": "mpi",
        "pod-group.scheduling.sigs.k8s.io/min-available": "3",
    }
    launcher = pod("launcher", gpus=0, annotations={model.PARTITION: "cpu"})
    workers = [pod(f"w{i}", gpus=4, annotations={model.PARTITION: "gpu"}) for i in range(2)]
    for member in (launcher, *workers):
        member["metadata"]["labels"] = labels
    await core.create_namespaced_pod(ns, launcher)
    await core.create_namespaced_pod(ns, workers[0])

    async def waiting() -> dict[str, Any] | None:
        # The Gang may first be written when only the launcher is seen: wait for both pods.
        admitted = condition(await read_gang(api, ns, "lbl-mpi"), "Admitted")
        if admitted.get("reason") != "WaitingForMembers":
            return None
        return admitted if "2 of 3 pods exist" in admitted.get("message", "") else None

    await eventually(waiting, timeout=60, what="the Gang waiting for its third pod, 2 of 3 seen")
    assert not [s for s in job_states(sunk).values() if f"gang/{ns}/lbl-mpi" in s[2]]

    await core.create_namespaced_pod(ns, workers[1])

    async def running() -> dict[str, Any] | None:
        gang = await read_gang(api, ns, "lbl-mpi")
        return gang if (gang or {}).get("status", {}).get("phase") == "Running" else None

    await eventually(running, timeout=90, what="the mixed gang bound")
    assert await bound(api, ns, "launcher") == "slurm-cpu-000"
    worker_nodes = {await bound(api, ns, "w0"), await bound(api, ns, "w1")}
    assert worker_nodes <= {f"slurm-gpu-00{i}" for i in range(4)}
    components = [s for s in job_states(sunk).values() if f"gang/{ns}/lbl-mpi" in s[2]]
    assert len(components) == 2, components  # one heterogeneous job: a component per shape

    for name in ("launcher", "w0", "w1"):
        await core.delete_namespaced_pod(name, ns, grace_period_seconds=0)

    async def gang_deleted() -> bool:
        return await read_gang(api, ns, "lbl-mpi") is None

    await eventually(gang_deleted, timeout=60, what="the label gang's Gang deleted with its pods")


async def test_a_pod_that_runs_to_its_end_gives_back_its_allocation_and_is_kept(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    annotations = {model.NODES: "slurm-gpu-001", "pod-complete.stage.kwok.x-k8s.io/delay": "3s"}
    await client.CoreV1Api(api).create_namespaced_pod(ns, pod("done", annotations=annotations))
    await eventually(lambda: bound(api, ns, "done"), timeout=60, what="done bound")
    (job,) = jobs_of(sunk, "done")

    async def succeeded() -> bool:
        phase = ((await read_pod(api, ns, "done")) or {}).get("status", {}).get("phase")
        return bool(phase == "Succeeded")

    await eventually(succeeded, timeout=60, what="the pod completed")
    await eventually(lambda: job_ended(sunk, job), timeout=60, what=f"job {job} ended with its pod")
    assert await read_pod(api, ns, "done") is not None, "a finished pod is its owner's to delete"
    assert "SlurmJobCancelled" not in dict(await events(api, ns, "done"))


async def test_a_gang_whose_pods_name_two_schedulers_is_refused_in_words(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    labels = {
        "pod-group.scheduling.sigs.k8s.io/name": "mixed",
        "pod-group.scheduling.sigs.k8s.io/min-available": "2",
    }
    ours = pod("by-slurm", gpus=1)
    theirs = pod("by-quorum", gpus=1)
    del theirs["spec"]["schedulerName"]
    for member in (ours, theirs):
        member["metadata"]["labels"] = labels
    await core.create_namespaced_pod(ns, theirs)
    await core.create_namespaced_pod(ns, ours)

    async def refused() -> str | None:
        return next((m for r, m in await events(api, ns, "by-slurm") if r == "MixedSchedulers"), None)

    message = await eventually(refused, timeout=30, what="a MixedSchedulers Event")
    assert "default-scheduler" in message and SCHEDULER in message
    assert not [s for s in job_states(sunk).values() if f"gang/{ns}/lbl-mixed" in s[2]]


def call_hook(sunk: Instance, path: str, token: str | None) -> tuple[int, str]:
    state = sunk.state()
    assert state is not None
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(
        f"http://127.0.0.1:{state.ports.sunk}{path}", data=b"", headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def test_the_hook_api_answers_only_slurm_for_the_nodes_of_the_job(
    sunk: Instance, api: client.ApiClient
) -> None:
    token = sunk.slurm_layout.hook_token.read_text().strip()
    job = int(
        run(sunk, "sbatch", "--parsable", "-w", "slurm-gpu-002", "--gres=gpu:1", "-o", "/dev/null",
            "--wrap", "sleep 300").split(";")[0]
    )  # fmt: skip

    async def locked() -> bool:  # the real prolog, with the token from its file
        return await node_lock(api, "slurm-gpu-002") == "locked"

    await eventually(locked, timeout=60, what="slurm-gpu-002 locked by the prolog of a batch job")

    for given in (None, "", "not-the-token", token + "x"):
        status, text = call_hook(sunk, f"/hooks/epilog?job={job}&node=slurm-gpu-002", given)
        assert status == 401 and "Authorization: Bearer" in text, (given, status, text)
    status, _ = call_hook(sunk, f"/hooks/stop?job={job}", None)
    assert status == 401

    status, text = call_hook(sunk, f"/hooks/prolog?job={job}&node=slurm-gpu-001", token)
    assert (status, text.strip()) == (403, f"job {job} was not given node slurm-gpu-001")
    assert await node_lock(api, "slurm-gpu-001") == "false"
    status, text = call_hook(sunk, f"/hooks/epilog?job={job}&node=slurm-gpu-002", token)
    assert (status, text.strip()) == (403, f"job {job} still runs; its epilog comes after it ends")
    status, text = call_hook(sunk, "/hooks/prolog?job=999999&node=slurm-gpu-002", token)
    assert (status, text.strip()) == (403, "Slurm knows no job 999999")
    assert await node_lock(api, "slurm-gpu-002") == "locked", "no refused call changed the lock"
    status, text = call_hook(sunk, f"/hooks/stop?job={job}", token)  # a batch job, not a placeholder
    assert status == 403 and f"job {job} is not a placeholder job of quorum-sunk-scheduler" in text, text
    status, text = call_hook(sunk, "/hooks/stop?job=999999", token)
    assert (status, text.strip()) == (404, "Slurm knows no job 999999")

    run(sunk, "scancel", str(job))

    async def unlocked() -> bool:  # the real epilog, with the token from its file
        return await node_lock(api, "slurm-gpu-002") == "false"

    await eventually(unlocked, timeout=60, what="slurm-gpu-002 unlocked by the epilog")


ATTACKER = "quorum-mallory"  # a Slurm user of the cluster who is not the SUNK scheduler's


def ensure_unix_user(name: str) -> None:
    """Slurm resolves a job's user on the controller: a second local user stands for another
    Slurm user of the cluster (created once, as Debian's `useradd --system` does)."""
    if subprocess.run(["id", name], capture_output=True, check=False).returncode != 0:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True
        )


async def test_a_job_another_slurm_user_gave_a_quorum_comment_is_not_taken_for_ours(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    """Any Slurm user can put quorum's comment on a job. A running decoy job of another user,
    commented as the gang's, neither keeps the gang from being submitted nor gets its pods
    bound, and cancelling it deletes nothing."""
    ensure_unix_user(ATTACKER)
    state = sunk.state()
    assert state is not None
    attacker = SlurmRest(
        f"http://127.0.0.1:{state.ports.slurmrestd}", sunk.slurm_layout.jwt_key.read_bytes(), ATTACKER
    )
    key = f"gang/{ns}/lbl-decoy"
    decoy_job = {
        "name": "decoy", "comment": f"quorum-sunk {key}{model.STARTED}", "tasks": 1, "partition": "cpu",
        "current_working_directory": "/tmp", "standard_output": "/dev/null", "standard_error": "/dev/null",
        "environment": {"PATH": "/usr/bin:/bin"},
    }  # fmt: skip
    try:
        decoy = await attacker.submit({"script": "#!/bin/sh\nsleep 120\n", "job": decoy_job})
    finally:
        await attacker.close()

    async def decoy_running() -> bool:
        return job_states(sunk).get(decoy, ("",))[0] == "RUNNING"

    await eventually(decoy_running, timeout=60, what=f"the decoy job {decoy} running")
    member = pod("decoy-0", gpus=8, annotations={model.PARTITION: "gpu"})  # the decoy holds a CPU node
    member["metadata"]["labels"] = {
        "pod-group.scheduling.sigs.k8s.io/name": "decoy",
        "pod-group.scheduling.sigs.k8s.io/min-available": "1",
    }
    await client.CoreV1Api(api).create_namespaced_pod(ns, member)

    async def ours() -> list[int]:
        return [j for j, s in job_states(sunk).items() if key in s[2] and j != decoy]

    (placeholder,) = await eventually(ours, timeout=60, what="the gang's own placeholder job")
    node = await eventually(lambda: bound(api, ns, "decoy-0"), timeout=60, what="decoy-0 bound")
    assert node in job_states(sunk)[placeholder][1], "bound where the gang's own job runs"
    run(sunk, "scancel", str(decoy))
    await eventually(lambda: job_ended(sunk, decoy), timeout=60, what="the decoy cancelled")
    target = passes(sunk) + 2

    async def looked_again() -> bool:
        return passes(sunk) >= target

    await eventually(looked_again, timeout=30, what="two passes after the decoy ended")
    assert await read_pod(api, ns, "decoy-0") is not None, "deleted for another user's job"
    await client.CoreV1Api(api).delete_namespaced_pod("decoy-0", ns, grace_period_seconds=0)


async def test_a_pod_asking_for_what_its_namespace_may_not_use_is_told_and_not_submitted(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    """The local cluster lets every namespace name its partitions, and no account (its
    QUORUM_SUNK_NAMESPACES, devcluster/slurm.py)."""
    await client.CoreV1Api(api).create_namespaced_pod(
        ns, pod("billed", annotations={model.PARTITION: "gpu", model.ACCOUNT: "physics"})
    )

    async def refused() -> str | None:
        return next((m for r, m in await events(api, ns, "billed") if r == "SlurmNotAllowed"), None)

    message = await eventually(refused, timeout=30, what="a SlurmNotAllowed Event")
    assert (
        f"namespace {ns} may not use what pod billed asks of Slurm (sunk.coreweave.com/account=physics)"
        in (message)
    )
    assert "accounts none but Slurm's default" in message
    target = passes(sunk) + 2

    async def looked_again() -> bool:
        return passes(sunk) >= target

    await eventually(looked_again, timeout=30, what="two more scheduler passes")
    assert jobs_of(sunk, "billed") == {}
    assert [r for r, _ in await events(api, ns, "billed")].count("SlurmNotAllowed") == 1


async def test_the_fence_refuses_the_schedulers_identity_what_its_code_never_writes(
    sunk: Instance, api: client.ApiClient, ns: str
) -> None:
    """With the scheduler's own ServiceAccount token, writes its RBAC allows but its code never
    makes are refused by the apiserver, each saying what; the fence type-checks against the
    apiserver's schemas (a CEL error would make it refuse the scheduler's real writes too)."""
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "theirs"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        },
    )
    await core.create_namespaced_pod(ns, pod("ours", annotations={model.NODES: "slurm-gpu-000"}))
    await eventually(lambda: bound(api, ns, "ours"), timeout=60, what="ours bound")
    scheduler = await api_client(sunk.kubeconfig("quorum-sunk-scheduler"))
    async with scheduler:
        as_it = client.CoreV1Api(scheduler)

        async def refused(call: Any) -> str | None:
            try:
                await call
            except ApiException as err:
                if err.status == 403 and FENCE in str(err.body):
                    return str(err.body)
                raise
            return None

        deletion = await eventually(
            lambda: refused(as_it.delete_namespaced_pod("theirs", ns)), timeout=30, what="the fence in force"
        )
        assert "may change and delete only the pods it schedules" in deletion, deletion
        assert "has schedulerName default-scheduler" in deletion, deletion
        label = await refused(as_it.patch_namespaced_pod("ours", ns, {"metadata": {"labels": {"team": "x"}}}))
        assert label is not None and "may not change the labels of Pod" in label, label
        taint = {"spec": {"taints": [{"key": "evil", "effect": "NoExecute"}]}}
        tainted = await refused(as_it.patch_node("slurm-gpu-000", taint))
        assert tainted is not None and "only in its sunk.coreweave.com/lock" in tainted, tainted
    assert await read_pod(api, ns, "theirs") is not None
    node = await raw_json(core.read_node("slurm-gpu-000", _preload_content=False))
    assert all(t["key"] != "evil" for t in node["spec"].get("taints") or [])
    policy = await raw_json(
        client.AdmissionregistrationV1Api(api).read_validating_admission_policy(
            "quorum-sunk-scheduler-fence", _preload_content=False
        )
    )
    assert (policy.get("status") or {}).get("typeChecking", {}).get("expressionWarnings") in (None, []), (
        policy["status"]
    )
    await core.delete_namespaced_pod("ours", ns, grace_period_seconds=0)
