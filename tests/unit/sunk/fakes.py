"""Stateful fakes of what quorum-sunk-scheduler talks to: the apiserver (`FakeSunkApi`, its
`SunkApi`) and Slurm (`FakeSlurm`, its `Slurm`). Both keep what a real one would (pods, nodes,
PodGroups, Gangs, Events; jobs with their states and allocations), record every call in order,
and can fail any call on demand."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

import jsonpatch
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.gangs import PLACED_BY_LABEL, PLACED_BY_SLURM
from quorum.sunk import api, model
from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.slurm import Job, JobResources, JobResourcesNode, Node, SlurmUnavailable

JSON = dict[str, Any]


class FakeSunkApi:
    """The apiserver as the SUNK scheduler sees it. `calls` lists (call, object name) in order;
    a call whose (call, name) or (call, "*") is in `failing` raises a 500 as etcd timing out
    would."""

    def __init__(self) -> None:
        self.pods: dict[str, JSON] = {}  # uid -> pod
        self.nodes: dict[str, JSON] = {}
        self.groups: dict[tuple[str, str, str], JSON] = {}  # (api group, ns, name)
        self.gangs: dict[tuple[str, str], JSON] = {}
        self.events: list[tuple[str, str, str, bool]] = []  # (object name, reason, message, warning)
        self.calls: list[tuple[str, str]] = []
        self.failing: set[tuple[str, str]] = set()
        self.uids = itertools.count(1)
        self.watcher: SunkScheduler | None = None  # kept in sync after each write, as its watch would

    def watch(self, scheduler: SunkScheduler) -> None:
        """Deliver the pods and nodes to `scheduler` now and after every write (its watches)."""
        self.watcher = scheduler
        self.sync(scheduler)

    def changed(self) -> None:
        if self.watcher is not None:
            self.sync(self.watcher)

    def call(self, name: str, target: str) -> None:
        if (name, target) in self.failing or (name, "*") in self.failing:
            raise ApiException(status=500, reason="etcdserver: request timed out")
        self.calls.append((name, target))

    def sync(self, scheduler: SunkScheduler) -> None:
        """What the scheduler's watches deliver: the pods and nodes as they are now."""
        scheduler.pods.replace_all([copy.deepcopy(p) for p in self.pods.values()])
        scheduler.nodes.replace_all([copy.deepcopy(n) for n in self.nodes.values()])

    # -- test set-up ---------------------------------------------------------------------------

    def add_pod(self, pod: JSON) -> JSON:
        pod["metadata"].setdefault("uid", f"pod-uid-{next(self.uids)}")
        pod["metadata"].setdefault("resourceVersion", "1")
        self.pods[pod["metadata"]["uid"]] = pod
        return pod

    def pod(self, name: str) -> JSON | None:
        return next((p for p in self.pods.values() if p["metadata"]["name"] == name), None)

    def add_group(self, api_group: str, version: str, group: JSON) -> None:
        meta = group["metadata"]
        meta.setdefault("uid", f"group-uid-{next(self.uids)}")
        group.setdefault("apiVersion", f"{api_group}/{version}")
        group.setdefault("kind", "PodGroup")
        self.groups[(api_group, meta["namespace"], meta["name"])] = group

    # -- SunkApi -------------------------------------------------------------------------------

    async def read_group(self, group: str, version: str, namespace: str, name: str) -> JSON | None:
        self.call("read_group", name)
        found = self.groups.get((group, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def create_gang(self, namespace: str, name: str, spec: JSON, owner: JSON | None) -> JSON:
        self.call("create_gang", name)
        if (namespace, name) not in self.gangs:
            meta: JSON = {"name": name, "namespace": namespace, "labels": {PLACED_BY_LABEL: PLACED_BY_SLURM}}
            if owner is not None:
                meta["ownerReferences"] = [owner]
            self.gangs[(namespace, name)] = {"apiVersion": "quorum.dev/v1alpha1", "kind": "Gang",
                                             "metadata": meta, "spec": spec}  # fmt: skip
        return copy.deepcopy(self.gangs[(namespace, name)])

    async def delete_gang(self, namespace: str, name: str) -> None:
        self.call("delete_gang", name)
        self.gangs.pop((namespace, name), None)

    async def patch_gang_status(self, namespace: str, name: str, status: JSON) -> str | None:
        self.call("patch_gang_status", name)
        gang = self.gangs.get((namespace, name))
        if gang is None:
            return None
        gang["status"] = {**(gang.get("status") or {}), **copy.deepcopy(status)}
        return "0"  # versions not modelled here

    async def post_event(self, obj: JSON, reason: str, message: str, warning: bool = False) -> None:
        self.call("post_event", obj["metadata"]["name"])
        self.events.append((obj["metadata"]["name"], reason, message, warning))

    def same_pod(self, pod: JSON) -> JSON | None:
        return self.pods.get(pod["metadata"]["uid"])

    async def delete_pod(self, pod: JSON) -> bool:
        self.call("delete_pod", pod["metadata"]["name"])
        gone = self.pods.pop(pod["metadata"]["uid"], None) is not None
        self.changed()
        return gone

    async def bind_pod(self, pod: JSON, node: str, job_id: int) -> bool:
        """As the apiserver binds: nodeName set, the Binding's annotations copied onto the pod."""
        self.call("bind_pod", pod["metadata"]["name"])
        found = self.same_pod(pod)
        if found is None or found["spec"].get("nodeName"):
            return False
        found["spec"]["nodeName"] = node
        found["metadata"].setdefault("annotations", {}).update(
            api.binding(pod, node, job_id)["metadata"]["annotations"]
        )
        self.changed()
        return True

    async def add_toleration(self, pod: JSON, toleration: JSON) -> bool:
        self.call("add_toleration", pod["metadata"]["name"])
        found = self.same_pod(pod)
        if found is None:
            return False
        tolerations = found["spec"].setdefault("tolerations", [])
        if toleration not in tolerations:
            tolerations.append(toleration)
        return True

    async def read_node(self, name: str) -> JSON | None:
        self.call("read_node", name)
        found = self.nodes.get(name)
        return copy.deepcopy(found) if found is not None else None

    async def patch_node(self, node: JSON, ops: list[JSON]) -> bool:
        """A JSON patch (kopf's jsonpatch applies it); False if the node is gone or a `test` op
        fails, as the apiserver's 404 and 422 would be."""
        name = node["metadata"]["name"]
        self.call("patch_node", name)
        if name not in self.nodes:
            return False
        try:
            self.nodes[name] = jsonpatch.apply_patch(self.nodes[name], ops)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
            return False
        return True

    async def set_node_condition(self, name: str, condition: JSON) -> bool:
        self.call("set_node_condition", name)
        found = self.nodes.get(name)
        if found is None:
            return False
        conditions = [
            c for c in found.setdefault("status", {}).get("conditions", []) if c["type"] != condition["type"]
        ]
        found["status"]["conditions"] = [*conditions, condition]
        return True


def allocated_cores(cpus: int) -> dict[str, str]:
    return {str(core): "allocated" for core in range(cpus)}


class FakeSlurm:
    """slurmctld behind slurmrestd: submitted jobs wait PENDING until the test starts or ends
    them. `down` makes every call fail as an unreachable slurmrestd; `refusals` are raised by
    the next submissions, one each."""

    def __init__(self, *nodes: Node) -> None:
        self.components: dict[int, list[Job]] = {}  # group id -> its jobs (one per hetjob component)
        self.bodies: list[Mapping[str, Any]] = []
        self.listed_nodes = list(nodes)
        self.refusals: list[BaseException] = []
        self.cancelled: list[int] = []
        self.down = False
        self.user = "root"  # whom Slurm authenticates the submissions as
        self.ids = itertools.count(100)

    def answer(self) -> None:
        if self.down:
            raise SlurmUnavailable("slurmrestd GET /jobs: ClientConnectorError: connection refused")

    async def submit(self, body: Mapping[str, Any]) -> int:
        self.answer()
        if self.refusals:
            raise self.refusals.pop(0)
        self.bodies.append(body)
        group = next(self.ids)
        parts = [body["job"]] if "job" in body else list(body["jobs"])
        jobs = []
        for offset, part in enumerate(parts):
            job_id = group if offset == 0 else next(self.ids)
            jobs.append(
                Job(
                    job_id=job_id,
                    job_state="PENDING",
                    state_reason="Resources",
                    comment=part["comment"],
                    partition=part.get("partition", "gpu"),
                    het_job_id=group if len(parts) > 1 else 0,
                    het_job_offset=offset,
                    user_name=self.user,
                )
            )
        self.components[group] = jobs
        return group

    async def jobs(self) -> list[Job]:
        self.answer()
        return [j.model_copy() for jobs in self.components.values() for j in jobs]

    async def job(self, job_id: int) -> list[Job]:
        self.answer()
        return [j.model_copy() for j in self.components.get(job_id, [])]

    async def cancel(self, job_id: int) -> None:
        self.answer()
        self.cancelled.append(job_id)
        self.end(job_id, "CANCELLED")

    async def nodes(self) -> list[Node]:
        self.answer()
        return list(self.listed_nodes)

    # -- what slurmctld does -------------------------------------------------------------------

    def sbatch(self, user: str, comment: str, state: str = "PENDING") -> int:
        """Another Slurm user's batch job, with a comment of its choosing."""
        job_id = next(self.ids)
        self.components[job_id] = [
            Job(job_id=job_id, job_state=state, comment=comment, partition="gpu", user_name=user)
        ]
        return job_id

    def start(self, group: int, *allocations: list[tuple[str, int, int]]) -> None:
        """The job runs, each component on its (node, CPUs, GPUs), and its script has marked the
        comment started."""
        for job, allocation in zip(self.components[group], allocations, strict=True):
            job.job_state, job.state_reason = "RUNNING", "None"
            job.comment = (job.comment or "") + model.STARTED
            job.nodes = ",".join(node for node, _, _ in allocation)
            job.job_resources = JobResources(
                nodes=job.nodes,
                allocated_nodes=[
                    JobResourcesNode(nodename=node, sockets={"0": {"cores": allocated_cores(cpus)}})
                    for node, cpus, _ in allocation
                ],
            )
            job.gres_detail = [f"gpu:{gpus}(IDX:0-{gpus - 1})" for _, _, gpus in allocation]

    def end(self, group: int, state: str, end_time: int = 1, reason: str | None = None) -> None:
        for job in self.components[group]:
            job.job_state, job.state_reason, job.end_time = state, reason, end_time

    def stopping(self, group: int, preempted: bool = False) -> None:
        """Slurm is ending the job (scancel, preemption): COMPLETING while its script has SIGTERM
        and KillWait runs; a preempted job has its preempt_time set."""
        for job in self.components[group]:
            job.job_state = "COMPLETING"
            job.preempt_time = 1 if preempted else 0
