"""Model test: quorum-sunk-scheduler deletes a pod only when Slurm ended the job that stands for it.

A hypothesis state machine drives the real `SunkScheduler` (its reconcile passes and its
`/hooks/stop` handler, `stop_job`, concurrently, as in the process) over the stateful fakes of
`tests/unit/sunk/fakes.py`, extended here: the apiserver's pod watch lags (its events are
delivered late, in order, a few at a time), a bound pod's delete is graceful (the kubelet removes
it later), any call can fail before it acts or lose its answer after it acted, and Slurm starts,
ends (cancel, time limit, node failure, preemption, with or without a grace time) and forgets
nothing of quorum's jobs while another Slurm user submits jobs with a copied comment. Its rules
interleave pods and gangs of two (of one shape or two: a heterogeneous job) arriving, members
made again under their names, users deleting pods, pods running and finishing, passes (whole, or
cut into steps), stop calls for any job id, faults, the scheduler restarting (a new process over
the same apiserver and Slurm: its memory lost, its watch relisted, its calls in flight cut off)
and time passing (one virtual clock for the event loop, the pods' creation times and Slurm's).

The rule it holds (docs/lifecycle.md, "When quorum removes a pod", row (d); docs/sunk.md), checked
by the fakes at the moment of every call, against what they hold then:

- a pass deletes a pod only if a Slurm job of quorum's Slurm user that stands for it (its pod or
  gang key) has ended (left Slurm's live states), the pod was made before that job ended, and no
  job of quorum's stands for it live;
- `/hooks/stop?job=` deletes only a pod bound to that job (the Binding's job-id record), of a job
  of quorum's user that Slurm is ending (the model began its end);
- every such delete comes after an Event on that pod that names the ended job and why
  (`SlurmJobCancelled`, `SlurmJobPreempted`, `SlurmJobTimeLimit`, `SlurmNodeFailed`);
- quorum cancels (scancel) only a job it submitted, and only once the pods it was submitted for
  and the pods bound to it are all gone, finishing or finished;
- quorum binds a pod only to a job of quorum's that stands for it, has started and was given the
  node, and a stop answers "pods gone" only when no pod bound to the job is left.

And after a quiet spell (faults healed, watches caught up, Slurm's ends finished, a few passes):
every act was told by an Event, no pod outlives an ended job it was made before, no job of
quorum's lives on without pods, and every stop call has answered.

The stop hook is called as `quorum.sunk.hooks.stop` calls it (`stop_job`; the HTTP layer, its
token and its status codes are tested in test_stop_hook.py). The default run (unit tests) is
bounded, with a fixed seed (200 examples of 50 steps, a few seconds); QUORUM_SOAK=1 runs it long,
with random seeds; QUORUM_MODEL_EXAMPLES sets the number of examples, QUORUM_MODEL_SKIP leaves
checks out (to explore).

Three bugs it found are fixed and held by it: a pod made in the second its gang's job ended was
deleted with that job ("same-second"); a running job of two shapes was cancelled when one member
went before it was bound ("hetjob-member-lost"); the stop hook answered "pods gone" while a
Binding to the job was in flight or its answer lost ("bind-in-flight").
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import math
import os
import re
import selectors
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.times import iso
from quorum.sunk import model
from quorum.sunk import scheduler as scheduler_module
from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.settings import SunkSettings
from quorum.sunk.slurm import Job, JobResources, JobResourcesNode, SlurmError, SlurmUnavailable
from tests.unit.sunk.fakes import FakeSlurm, FakeSunkApi, allocated_cores
from tests.unit.sunk.test_reconcile import ALLOWED, pod, podgroup

JSON = dict[str, Any]
SOAK = os.environ.get("QUORUM_SOAK") == "1"
EPOCH = 1_800_000_000.0  # the virtual clock's start, in epoch seconds
NS = "ns"
NODES = ("n0", "n1", "n2")
MAX_SETS = 6  # pods and gangs
MAX_PODS = 16
GPU = "nvidia.com/gpu"
# How the model ends a job -> (the end state Slurm shows, the Event reason that must tell it).
ENDS = {
    "cancel": ("CANCELLED", "SlurmJobCancelled"),
    "quorum": ("CANCELLED", "SlurmJobCancelled"),  # quorum's own scancel
    "timeout": ("TIMEOUT", "SlurmJobTimeLimit"),
    "preempt": ("PREEMPTED", "SlurmJobPreempted"),
    "node_fail": ("NODE_FAIL", "SlurmNodeFailed"),
}
API_CALLS = ("delete_pod", "post_event", "bind_pod", "add_toleration", "read_group", "patch_gang_status")
SLURM_CALLS = ("jobs", "job", "submit", "cancel")
JOB_NAMED = re.compile(r"Slurm job (\d+) ")

# Who is calling the fakes: ("pass", 0) or ("stop", job id); each task sets its own.
ACTING: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar("acting")


# -- one virtual clock ---------------------------------------------------------------------------


class VirtualSelector(selectors.SelectSelector):
    """Never waits: a wait for the next timer moves the clock to it instead."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("the event loop would wait forever: a task waits for nothing the model does")
        if timeout > 0:
            self.now += timeout
        return super().select(0)


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: `asyncio.sleep` and the stop hook's deadline cost nothing."""

    def __init__(self) -> None:
        self.clock = VirtualSelector()
        super().__init__(self.clock)

    def time(self) -> float:
        return self.clock.now


# -- what the model knows --------------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    """A job quorum submitted: the key its comment names, and the pods it was submitted for
    (those of the key the scheduler's watch had shown and the apiserver held)."""

    key: str
    pods: frozenset[str]


@dataclass(frozen=True)
class Told:
    seq: int
    uid: str
    reason: str
    job: int | None  # the job its message names


@dataclass(frozen=True)
class Act:
    seq: int
    uid: str
    name: str
    by: str  # "pass" | "stop <job>"


@dataclass
class StopCall:
    job: int
    task: asyncio.Task[str]


@dataclass
class Gang:
    name: str
    mixed: bool  # its two pods ask for different GPUs: a heterogeneous job of two components
    members: dict[int, str] = field(default_factory=dict)  # index -> uid of its current pod


class World:
    """The fakes, their clock, and what the checks need: when each pod was made and each job
    ended (in the order things happened), the Events, the acts and the violations."""

    def __init__(self) -> None:
        self.loop = VirtualLoop()
        self.seq = 0
        self.violations: list[str] = []
        self.made: dict[str, int] = {}  # pod uid -> seq of its creation
        self.made_at: dict[str, float] = {}  # pod uid -> when it was made
        self.key_of: dict[str, str] = {}  # pod uid -> its pod or gang key
        self.told: list[Told] = []
        self.acts: list[Act] = []
        self.skip = set(os.environ.get("QUORUM_MODEL_SKIP", "").split(","))  # checks left out, to explore
        self.api = ModelApi(self)
        self.slurm = ModelSlurm(self)

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    def now(self) -> float:
        return EPOCH + self.loop.time()

    def violate(self, message: str, check: str) -> None:
        if check not in self.skip:
            self.violations.append(message)

    def acting(self) -> tuple[str, int] | None:
        return ACTING.get(None)

    # -- the rule, checked as the scheduler acts ---------------------------------------------

    def check_delete(self, target: JSON) -> None:
        uid, name = target["metadata"]["uid"], target["metadata"]["name"]
        acting = self.acting()
        if acting is None:
            self.violate(f"pod {name} deleted outside a pass or a stop", "who")
        elif acting[0] == "pass":
            self.check_pass_delete(target)
        else:
            self.check_stop_delete(target, acting[1])
        by = "pass" if acting is None or acting[0] == "pass" else f"stop {acting[1]}"
        self.acts.append(Act(self.tick(), uid, name, by))

    def check_pass_delete(self, target: JSON) -> None:
        """(a): a job of quorum's that stands for the pod ended after the pod was made, none
        lives, and an Event on the pod named that job and why before this delete."""
        uid, name = target["metadata"]["uid"], target["metadata"]["name"]
        key, made = self.key_of[uid], self.made[uid]
        slurm = self.slurm
        ours = sorted(g for g, s in slurm.submitted.items() if s.key == key)
        live = [g for g in ours if slurm.alive(g)]
        if live:
            self.violate(
                f"a pass deleted pod {name} ({key}) while quorum's job {live[0]} for it is live", "live"
            )
        bound = (target["metadata"].get("annotations") or {}).get(model.JOB_ID)
        if bound and bound.isdigit() and int(bound) in slurm.components and slurm.alive(int(bound)):
            self.violate(f"a pass deleted pod {name}, bound to job {bound}, which is live", "live")
        why = [g for g in ours if g in slurm.ended_seq and made < slurm.ended_seq[g]]
        if not why:
            decoys = [g for g in slurm.components if g not in slurm.submitted and slurm.key(g) == key]
            after = [g for g in ours if g in slurm.ended_seq]
            # Made after the job ended, in the second Slurm records as its end (creationTimestamp
            # and end_time are whole seconds, and the pass deletes a pod made "not after" it).
            same_second = [g for g in after if math.floor(self.made_at[uid]) == slurm.end_time(g)]
            self.violate(
                f"a pass deleted pod {name} ({key}) though no job of quorum's that stands for it ended after "
                f"it was made (quorum's ended jobs of the key: {after}, all ended before it was made"
                + (f", in the same second: {same_second}" if same_second else "")
                + f"; other users' jobs with its comment: {decoys})",
                "same-second" if same_second else "ended",
            )
            event("made after its job ended, in the same second" if same_second else "violation: pass delete")
            return
        told = [t for t in self.told if t.uid == uid and t.job in why and t.reason == slurm.reason(t.job)]
        if not told:
            said = [(t.reason, t.job) for t in self.told if t.uid == uid]
            self.violate(
                f"a pass deleted pod {name} ({key}) before an Event naming its ended job {why} and why "
                f"(its Events so far: {said})",
                "told",
            )
        event(f"pass deletes ({slurm.reason(why[-1])})")

    def check_stop_delete(self, target: JSON, job: int) -> None:
        """(b): the job is quorum's, Slurm is ending it, the pod is bound to it, and an Event on
        the pod named it and why before this delete."""
        uid, name = target["metadata"]["uid"], target["metadata"]["name"]
        slurm = self.slurm
        submitted = slurm.submitted.get(job)
        if submitted is None:
            user = slurm.components[job][0].user_name if job in slurm.components else "-"
            self.violate(f"the stop of job {job} (user {user}, not quorum's) deleted pod {name}", "ours")
        elif submitted.key != self.key_of[uid]:
            self.violate(
                f"the stop of job {job} ({submitted.key}) deleted pod {name} of another key", "bound"
            )
        if job not in slurm.cause:
            self.violate(
                f"the stop of job {job} deleted pod {name} while Slurm is not ending the job", "ending"
            )
        annotations = target["metadata"].get("annotations") or {}
        if annotations.get(model.JOB_ID) != str(job) or not target["spec"].get("nodeName"):
            self.violate(
                f"the stop of job {job} deleted pod {name}, which is not bound to it "
                f"(job-id {annotations.get(model.JOB_ID)}, node {target['spec'].get('nodeName')})",
                "bound",
            )
        if job in slurm.cause and not any(
            t.uid == uid and t.job == job and t.reason == slurm.reason(job) for t in self.told
        ):
            self.violate(
                f"the stop of job {job} deleted pod {name} before an Event naming the job and why", "told"
            )
        event("stop deletes")

    def check_cancel(self, group: int) -> None:
        slurm = self.slurm
        submitted = slurm.submitted.get(group)
        if submitted is None:
            user = slurm.components[group][0].user_name if group in slurm.components else "-"
            self.violate(f"quorum cancelled job {group} (user {user}), which it did not submit", "cancel")
            return
        if not slurm.alive(group):
            return
        bound = {
            uid for uid, p in self.api.pods.items()
            if (p["metadata"].get("annotations") or {}).get(model.JOB_ID) == str(group)
        }  # fmt: skip
        left = sorted(
            self.api.pods[uid]["metadata"]["name"]
            for uid in submitted.pods | bound
            if uid in self.api.pods and present(self.api.pods[uid])
        )
        if left:
            # A heterogeneous job (a component per shape) whose gang lacks a shape for a moment
            # (a member deleted before it was bound, not yet made again) is cancelled by `bind`.
            shapes = {
                gpus_of(p) for p in self.api.view.values()
                if self.key_of[p["metadata"]["uid"]] == submitted.key and present(p)
            }  # fmt: skip
            lost = len(slurm.components[group]) > 1 and len(shapes) != len(slurm.components[group])
            self.violate(
                f"quorum cancelled job {group} ({submitted.key}) while its pods {left} are there"
                + (
                    f" (a job of {len(slurm.components[group])} components, its pods of {len(shapes)} shapes)"
                    if lost
                    else ""
                ),
                "hetjob-member-lost" if lost else "cancel",
            )
        event("quorum cancels")

    def check_bind(self, target: JSON, node: str, job: int) -> None:
        uid, name = target["metadata"]["uid"], target["metadata"]["name"]
        submitted = self.slurm.submitted.get(job)
        if submitted is None or submitted.key != self.key_of[uid]:
            self.violate(
                f"pod {name} ({self.key_of[uid]}) bound to job {job}, which does not stand for it", "bind"
            )
        elif job not in self.slurm.marked:
            self.violate(f"pod {name} bound to job {job}, whose script has not started", "bind")
        elif node not in self.slurm.allocated.get(job, set()):
            self.violate(f"pod {name} bound to {node}, which job {job} was not given", "bind")
        event("quorum binds")


def gpus_of(p: JSON) -> str:
    return str(p["spec"]["containers"][0]["resources"]["requests"].get(GPU, "0"))


def present(p: JSON) -> bool:
    """Neither finished nor being deleted."""
    return not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") not in (
        "Succeeded",
        "Failed",
    )


class ModelApi(FakeSunkApi):
    """The apiserver: its pod watch lags (events queued, delivered when the model says), a bound
    pod's delete is graceful, any call can fail (`fail_next`) or lose its answer after it acted
    (`lose_next`), and the destructive calls are checked against the rule as they act."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world
        self.queue: list[tuple[str, JSON]] = []  # the pod watch's events not yet delivered
        self.view: dict[str, JSON] = {}  # what the watch has delivered (the scheduler's index)
        self.scheduler: SunkScheduler | None = None
        self.fail_next: dict[str, int] = {}
        self.lose_next: dict[str, int] = {}
        self.unanswered: set[str] = set()  # pods bound whose Binding's answer the scheduler has not had

    def call(self, name: str, target: str) -> None:
        if self.fail_next.get(name):
            self.fail_next[name] -= 1
            raise ApiException(status=500, reason="etcdserver: request timed out")
        super().call(name, target)

    def answered(self, name: str) -> None:
        """The call acted; its answer may still be lost on the way back."""
        if self.lose_next.get(name):
            self.lose_next[name] -= 1
            raise ApiException(status=504, reason="Timeout: the answer was lost")

    # -- the watch -----------------------------------------------------------------------------

    def emit(self, uid: str) -> None:
        found = self.pods.get(uid)
        self.queue.append(
            ("DELETED", {"metadata": {"uid": uid}}) if found is None else ("MODIFIED", copy.deepcopy(found))
        )

    def deliver(self, n: int) -> None:
        for kind, obj in self.queue[:n]:
            uid = obj["metadata"]["uid"]
            if kind == "DELETED":
                self.view.pop(uid, None)
                if self.scheduler is not None:
                    self.scheduler.pods.delete(obj)
            else:
                self.view[uid] = obj
                if self.scheduler is not None:
                    self.scheduler.pods.upsert(copy.deepcopy(obj))
        del self.queue[:n]

    def relist(self, scheduler: SunkScheduler) -> None:
        """A new watch: everything as it is now, nothing queued."""
        self.scheduler = scheduler
        self.queue.clear()
        self.view = {uid: copy.deepcopy(p) for uid, p in self.pods.items()}
        scheduler.pods.replace_all([copy.deepcopy(p) for p in self.pods.values()])

    # -- the calls -------------------------------------------------------------------------------

    async def post_event(self, obj: JSON, reason: str, message: str, warning: bool = False) -> None:
        await asyncio.sleep(0)
        await super().post_event(obj, reason, message, warning)
        named = JOB_NAMED.search(message)
        self.world.told.append(
            Told(self.world.tick(), obj["metadata"]["uid"], reason, int(named.group(1)) if named else None)
        )
        self.answered("post_event")
        await asyncio.sleep(0)

    async def delete_pod(self, pod: JSON) -> bool:
        await asyncio.sleep(0)
        self.call("delete_pod", pod["metadata"]["name"])
        uid = pod["metadata"]["uid"]
        current = self.pods.get(uid)  # the uid precondition: only this pod
        if current is None:
            return False
        self.world.check_delete(current)
        if current["spec"].get("nodeName") and current["status"].get("phase") not in ("Succeeded", "Failed"):
            current["metadata"].setdefault("deletionTimestamp", iso(self.world.now()))
        else:
            del self.pods[uid]
        self.emit(uid)
        self.answered("delete_pod")
        await asyncio.sleep(0)
        return True

    async def bind_pod(self, pod: JSON, node: str, job_id: int) -> bool:
        await asyncio.sleep(0)
        current = self.pods.get(pod["metadata"]["uid"])
        acts = not self.fail_next.get("bind_pod") and ("bind_pod", "*") not in self.failing
        if acts and current is not None and not current["spec"].get("nodeName"):
            self.world.check_bind(current, node, job_id)
        bound = await super().bind_pod(pod, node, job_id)
        if bound:
            self.emit(pod["metadata"]["uid"])
            self.unanswered.add(pod["metadata"]["uid"])  # until the scheduler has the answer
            self.answered("bind_pod")
            await asyncio.sleep(0)
            self.unanswered.discard(pod["metadata"]["uid"])
        return bound

    async def add_toleration(self, pod: JSON, toleration: JSON) -> bool:
        await asyncio.sleep(0)
        added = await super().add_toleration(pod, toleration)
        if added:
            self.emit(pod["metadata"]["uid"])
        await asyncio.sleep(0)
        return added

    async def read_group(self, group: str, version: str, namespace: str, name: str) -> JSON | None:
        await asyncio.sleep(0)
        return await super().read_group(group, version, namespace, name)

    async def patch_gang_status(self, namespace: str, name: str, status: JSON) -> str | None:
        await asyncio.sleep(0)
        return await super().patch_gang_status(namespace, name, status)


class ModelSlurm(FakeSlurm):
    """slurmctld: what it was asked (quorum's submissions, with the pods each was for), how the
    model ends each job, and any call failing (`fail_next`), or a submission taken whose answer is
    lost (`lost_submits`)."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world
        self.fail_next: dict[str, int] = {}
        self.lost_submits = 0
        self.submitted: dict[int, Submitted] = {}  # group -> what quorum submitted
        self.shapes: dict[int, list[tuple[int, int, int]]] = {}  # group -> (tasks, cpus, gpus) per component
        self.cause: dict[int, str] = {}  # group -> how the model is ending (or ended) it
        self.ended_seq: dict[int, int] = {}  # group -> seq of its leaving Slurm's live states
        self.marked: set[int] = set()  # groups whose script marked the comment started
        self.allocated: dict[int, set[str]] = {}

    def fault(self, call: str) -> None:
        self.answer()
        if self.fail_next.get(call):
            self.fail_next[call] -= 1
            raise SlurmUnavailable(f"slurmrestd {call}: TimeoutError")

    # -- what the scheduler calls ---------------------------------------------------------------

    async def submit(self, body: Mapping[str, Any]) -> int:
        await asyncio.sleep(0)
        self.fault("submit")
        group = await super().submit(body)
        parts = [body["job"]] if "job" in body else list(body["jobs"])
        key = model.key_of_comment(parts[0]["comment"]) or ""
        api = self.world.api
        pods = frozenset(uid for uid in api.pods if self.world.key_of[uid] == key and uid in api.view)
        self.submitted[group] = Submitted(key, pods)
        event("quorum submits")
        self.shapes[group] = [(p["tasks"], p["cpus_per_task"], int(p.get("gpus_per_task", 0))) for p in parts]
        if self.lost_submits:
            self.lost_submits -= 1
            raise SlurmUnavailable("slurmrestd POST /job/submit: TimeoutError (the job was taken)")
        await asyncio.sleep(0)
        return group

    async def jobs(self) -> list[Job]:
        await asyncio.sleep(0)
        self.fault("jobs")
        return await super().jobs()

    async def job(self, job_id: int) -> list[Job]:
        await asyncio.sleep(0)
        self.fault("job")
        return await super().job(job_id)

    async def cancel(self, job_id: int) -> None:
        await asyncio.sleep(0)
        self.fault("cancel")
        self.world.check_cancel(job_id)
        self.cancelled.append(job_id)
        if job_id in self.components and self.alive(job_id):
            self.begin_end(job_id, self.cause.get(job_id, "quorum"), grace=False)
        await asyncio.sleep(0)

    # -- what slurmctld does --------------------------------------------------------------------

    def alive(self, group: int) -> bool:
        return any(j.alive for j in self.components[group])

    def key(self, group: int) -> str | None:
        return model.key_of_comment(self.components[group][0].comment)

    def end_time(self, group: int) -> int | None:
        return self.components[group][0].end_time

    def reason(self, group: int | None) -> str:
        return ENDS[self.cause[group]][1] if group in self.cause else "-"

    def start(self, group: int, *allocations: list[tuple[str, int, int]]) -> None:
        """RUNNING on the given (node, CPUs, GPUs) per component; not marked started yet."""
        for job, allocation in zip(self.components[group], allocations, strict=True):
            job.job_state, job.state_reason = "RUNNING", "None"
            job.nodes = ",".join(node for node, _, _ in allocation)
            job.job_resources = JobResources(
                nodes=job.nodes,
                allocated_nodes=[
                    JobResourcesNode(nodename=node, sockets={"0": {"cores": allocated_cores(cpus)}})
                    for node, cpus, _ in allocation
                ],
            )
            job.gres_detail = [f"gpu:{gpus}(IDX:0-{gpus - 1})" for _, _, gpus in allocation]
            job.end_time = int(self.world.now()) + 3600  # what Slurm shows of a running job: its limit
            self.allocated.setdefault(group, set()).update(node for node, _, _ in allocation)

    def mark(self, group: int) -> None:
        for job in self.components[group]:
            job.comment = (job.comment or "") + model.STARTED
        self.marked.add(group)

    def begin_end(self, group: int, how: str, grace: bool) -> None:
        """Slurm ends the job: a pending one, or a node failure, at once; a preemption with a
        grace time keeps it RUNNING with its preempt_time; else COMPLETING while KillWait runs."""
        jobs = self.components[group]
        now = int(self.world.now())
        running = jobs[0].job_state == "RUNNING"
        if not running and how != "quorum":
            how = "cancel"
        self.cause.setdefault(group, how)
        how = self.cause[group]
        if not running or how == "node_fail":
            for job in jobs:
                job.job_state, job.end_time = ENDS[how][0], now
                job.state_reason = "TimeLimit" if how == "timeout" else None
        elif how == "preempt" and grace:
            for job in jobs:
                job.preempt_time = now
            return
        else:
            for job in jobs:
                job.job_state, job.end_time = "COMPLETING", now
                job.state_reason = "TimeLimit" if how == "timeout" else None
                job.preempt_time = now if how == "preempt" else job.preempt_time
        self.ended_seq[group] = self.world.tick()

    def finish_end(self, group: int) -> None:
        """KillWait (or the grace time) is over: the job's end state."""
        how = self.cause[group]
        for job in self.components[group]:
            if job.job_state == "RUNNING":
                job.end_time = int(self.world.now())
            job.job_state = ENDS[how][0]
        self.ended_seq.setdefault(group, self.world.tick())

    def ending(self) -> list[int]:
        """Jobs Slurm is ending and has not ended yet (COMPLETING, or a preemption's grace)."""
        return sorted(
            g for g, jobs in self.components.items()
            if jobs[0].job_state == "COMPLETING" or (jobs[0].job_state == "RUNNING" and jobs[0].preempt_time)
        )  # fmt: skip


# -- the machine ---------------------------------------------------------------------------------


class SunkDisruptionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.api, self.slurm = self.world.api, self.world.slurm
        # The scheduler's clock is the model's: its fallback end time and its group re-reads.
        clock = SimpleNamespace(time=self.world.now, monotonic=self.world.loop.time)
        self.clock = mock.patch.object(scheduler_module, "time", clock)
        self.clock.start()
        self.scheduler = self.new_scheduler()
        self.pass_task: asyncio.Task[None] | None = None
        self.stops: list[StopCall] = []
        self.sets: list[str] = []  # pod and gang keys
        self.gangs: dict[str, Gang] = {}
        self.pods_made = 0
        self.decoys = 0

    def new_scheduler(self) -> SunkScheduler:
        scheduler = SunkScheduler(SunkSettings(namespaces=ALLOWED), self.api, self.slurm)
        self.api.relist(scheduler)
        return scheduler

    def run(self, work: Awaitable[Any]) -> Any:
        return self.world.loop.run_until_complete(work)

    def teardown(self) -> None:
        try:
            self.cut_off()
        finally:
            self.world.loop.close()
            self.clock.stop()

    def cut_off(self) -> None:
        """The process ends wherever its tasks are."""
        tasks = [s.task for s in self.stops] + ([self.pass_task] if self.pass_task else [])
        for task in tasks:
            task.cancel()
        if tasks:
            self.run(asyncio.gather(*tasks, return_exceptions=True))
        self.stops, self.pass_task = [], None

    # -- pods --------------------------------------------------------------------------------------

    @initialize(gang=st.booleans(), mixed=st.booleans())
    def a_first_pod_or_gang(self, gang: bool, mixed: bool) -> None:
        if gang:
            self.a_gang_arrives(mixed, 2)
        else:
            self.a_pod_arrives(2)
        self.a_pass(caught_up=True)

    def make_pod(self, name: str, key: str, group: str | None = None, gpus: int = 2) -> str:
        self.pods_made += 1
        p = pod(name, group, created=iso(math.floor(self.world.now())))
        p["spec"]["containers"][0]["resources"]["requests"][GPU] = str(gpus)
        uid = f"uid-{self.pods_made}"
        p["metadata"]["uid"] = uid
        self.api.add_pod(p)
        self.world.made[uid] = self.world.tick()
        self.world.made_at[uid] = self.world.now()
        self.world.key_of[uid] = key
        self.api.emit(uid)
        return uid

    @precondition(lambda self: len(self.sets) < MAX_SETS and self.pods_made < MAX_PODS)
    @rule(gpus=st.sampled_from([1, 2]))
    def a_pod_arrives(self, gpus: int) -> None:
        name = f"solo-{self.pods_made}"
        uid = f"uid-{self.pods_made + 1}"
        key = f"pod/{NS}/{name}/{uid}"
        self.sets.append(key)
        self.make_pod(name, key, gpus=gpus)

    @precondition(lambda self: len(self.sets) < MAX_SETS and self.pods_made + 2 <= MAX_PODS)
    @rule(mixed=st.booleans(), members=st.integers(1, 2))
    def a_gang_arrives(self, mixed: bool, members: int) -> None:
        name = f"g{len(self.gangs)}"
        gang = Gang(name, mixed)
        self.gangs[name] = gang
        self.sets.append(gang_key(name))
        self.api.add_group("scheduling.sigs.k8s.io", "v1alpha1", podgroup(name, 2))
        for index in range(members):
            self.make_member(gang, index)

    def make_member(self, gang: Gang, index: int) -> None:
        gpus = 4 if gang.mixed and index == 1 else 2
        gang.members[index] = self.make_pod(f"{gang.name}-{index}", gang_key(gang.name), gang.name, gpus)

    @precondition(lambda self: bool(self.missing_members()) and self.pods_made < MAX_PODS)
    @rule(data=st.data())
    def a_controller_makes_a_member_again(self, data: st.DataObject) -> None:
        """A gang member that is gone (not merely terminating) is made again under its name."""
        gang, index = data.draw(st.sampled_from(self.missing_members()))
        self.make_member(gang, index)

    def missing_members(self) -> list[tuple[Gang, int]]:
        return [
            (g, i) for g in self.gangs.values() for i in range(2) if g.members.get(i) not in self.api.pods
        ]

    @precondition(lambda self: bool(self.api.pods))
    @rule(data=st.data())
    def a_user_deletes_a_pod(self, data: st.DataObject) -> None:
        uid = data.draw(st.sampled_from(sorted(self.api.pods)))
        found = self.api.pods[uid]
        if found["spec"].get("nodeName") and found["status"].get("phase") not in ("Succeeded", "Failed"):
            found["metadata"].setdefault("deletionTimestamp", iso(self.world.now()))
        else:
            del self.api.pods[uid]
        self.api.emit(uid)

    @rule()
    def kubelets_act(self) -> None:
        """Bound pods run; pods being deleted go."""
        for uid, found in sorted(self.api.pods.items()):
            if found["metadata"].get("deletionTimestamp"):
                del self.api.pods[uid]
                self.api.emit(uid)
            elif found["spec"].get("nodeName") and found["status"].get("phase") == "Pending":
                found["status"]["phase"] = "Running"
                self.api.emit(uid)

    @precondition(lambda self: bool(self.running_pods()))
    @rule(data=st.data(), ok=st.booleans())
    def a_pod_finishes(self, data: st.DataObject, ok: bool) -> None:
        uid = data.draw(st.sampled_from(self.running_pods()))
        self.api.pods[uid]["status"]["phase"] = "Succeeded" if ok else "Failed"
        self.api.emit(uid)

    def running_pods(self) -> list[str]:
        return sorted(uid for uid, p in self.api.pods.items() if p["status"].get("phase") == "Running")

    # -- the scheduler -----------------------------------------------------------------------------

    async def one_pass(self) -> None:
        ACTING.set(("pass", 0))
        try:
            await self.scheduler.reconcile()
        except (ApiException, SlurmError) as err:  # the run loop logs it and passes again
            event(f"pass failed: {type(err).__name__}")
        self.scheduler.passes += 1

    @rule(caught_up=st.booleans())
    def a_pass(self, caught_up: bool) -> None:
        """A whole pass (the one under way, if one is); `caught_up`: the watch has delivered
        everything first."""
        if caught_up:
            self.api.deliver(len(self.api.queue))
        if self.pass_task is None:
            self.pass_task = self.world.loop.create_task(self.one_pass())
        self.run(self.pass_task)
        self.pass_task = None

    @rule()
    def a_pass_starts(self) -> None:
        if self.pass_task is None:
            self.pass_task = self.world.loop.create_task(self.one_pass())

    @precondition(lambda self: bool(self.pass_task or self.stops))
    @rule(n=st.integers(1, 8))
    def tasks_run_a_little(self, n: int) -> None:
        async def turns() -> None:
            for _ in range(n):
                await asyncio.sleep(0)

        self.run(turns())
        self.reap()

    def reap(self) -> None:
        if self.pass_task is not None and self.pass_task.done():
            self.pass_task.result()
            self.pass_task = None
        for stop in [s for s in self.stops if s.task.done()]:
            self.stops.remove(stop)
            event(f"stop: {stop.task.result()}")

    @precondition(lambda self: bool(self.api.queue))
    @rule(n=st.integers(1, 4))
    def the_watch_delivers(self, n: int) -> None:
        self.api.deliver(n)

    @rule()
    def the_scheduler_restarts(self) -> None:
        """A new process over the same apiserver and Slurm; the old one's calls end where they are."""
        self.cut_off()
        self.scheduler = self.new_scheduler()

    @rule(seconds=st.sampled_from([0.3, 0.8, 2.0, 7.0, 30.0]))
    def time_passes(self, seconds: float) -> None:
        self.run(asyncio.sleep(seconds))
        self.reap()

    # -- the stop hook ------------------------------------------------------------------------------

    async def stop_call(self, job: int) -> str:
        """What `/hooks/stop?job=` does (quorum.sunk.hooks.stop); a stop that answers "pods gone"
        must leave no pod bound to the job."""
        ACTING.set(("stop", job))
        try:
            gone = await self.scheduler.stop_job(job)
        except SlurmError:
            return "503"
        except ApiException:
            return "500"
        if isinstance(gone, model.StopRefusal):
            return str(gone.status)
        if gone:
            left = sorted(
                uid for uid, p in self.api.pods.items()
                if (p["metadata"].get("annotations") or {}).get(model.JOB_ID) == str(job)
                and p["status"].get("phase") not in ("Succeeded", "Failed")
            )  # fmt: skip
            # A Binding the apiserver made but whose answer the scheduler has not had (in flight
            # in a pass, or lost) and its watch has not shown: the stop does not know the pod.
            shown = {uid for uid, p in self.api.view.items() if p["spec"].get("nodeName")}
            unknown = [uid for uid in left if uid in self.api.unanswered and uid not in shown]
            if left:
                names = [self.api.pods[uid]["metadata"]["name"] for uid in left]
                why = (
                    " (bound by a Binding whose answer the scheduler had not had)" if unknown == left else ""
                )
                self.world.violate(
                    f"the stop of job {job} answered 'pods gone' while {names} are bound to it{why}",
                    "bind-in-flight" if unknown == left else "gone",
                )
        return "200" if gone else "504"

    @rule(
        data=st.data(),
        whose=st.sampled_from(
            ["ours_live", "ours_ending", "ours_ending", "other_user", "unmarked", "unknown"]
        ),
    )
    def the_stop_hook_is_called(self, data: st.DataObject, whose: str) -> None:
        slurm = self.slurm
        ours = sorted(slurm.submitted)
        choices = {
            "ours_live": [g for g in ours if slurm.alive(g) and g not in slurm.cause],
            "ours_ending": [g for g in ours if g in slurm.cause],
            "other_user": [g for g in slurm.components if g not in slurm.submitted and slurm.key(g)],
            "unmarked": [g for g in slurm.components if g not in slurm.submitted and not slurm.key(g)],
        }.get(whose) or [999_999]
        job = data.draw(st.sampled_from(sorted(choices)))
        event(f"stop called: {whose if job != 999_999 else 'unknown'}")
        self.call_stop(job)

    def call_stop(self, job: int) -> None:
        self.stops.append(StopCall(job, self.world.loop.create_task(self.stop_call(job))))

    # -- Slurm ----------------------------------------------------------------------------------

    @precondition(lambda self: bool(self.pending_jobs()))
    @rule(data=st.data(), marked=st.sampled_from([True, True, False]))
    def slurm_starts_a_job(self, data: st.DataObject, marked: bool) -> None:
        group = data.draw(st.sampled_from(self.pending_jobs()))
        allocations = []
        for tasks, cpus, gpus in self.slurm.shapes[group]:
            where = data.draw(st.lists(st.sampled_from(NODES), min_size=tasks, max_size=tasks))
            per_node: dict[str, int] = {}
            for node in where:
                per_node[node] = per_node.get(node, 0) + 1
            allocations.append([(node, cpus * n, gpus * n) for node, n in per_node.items()])
        self.slurm.start(group, *allocations)
        if marked:
            self.slurm.mark(group)

    @precondition(lambda self: bool(self.pending_jobs()))
    @rule(data=st.data())
    def a_job_starts_and_its_pods_are_bound(self, data: st.DataObject) -> None:
        """Slurm starts a pending job of quorum's, its script marks it, and a pass (the watch
        caught up) binds its pods."""
        self.slurm_starts_a_job(data, True)
        self.a_pass(caught_up=True)

    def pending_jobs(self) -> list[int]:
        return sorted(g for g in self.slurm.submitted if self.slurm.components[g][0].job_state == "PENDING")

    @precondition(lambda self: bool(self.unmarked_jobs()))
    @rule(data=st.data())
    def the_placeholder_script_marks_its_start(self, data: st.DataObject) -> None:
        self.slurm.mark(data.draw(st.sampled_from(self.unmarked_jobs())))

    def unmarked_jobs(self) -> list[int]:
        return sorted(
            g for g in self.slurm.submitted
            if self.slurm.components[g][0].job_state == "RUNNING" and g not in self.slurm.marked
        )  # fmt: skip

    @precondition(lambda self: bool(self.endable_jobs()))
    @rule(
        data=st.data(),
        how=st.sampled_from(["cancel", "timeout", "preempt", "node_fail"]),
        grace=st.booleans(),
        script_stops=st.sampled_from([True, True, False]),
        pending_too=st.sampled_from([False, False, True]),
    )
    def slurm_ends_a_job(
        self, data: st.DataObject, how: str, grace: bool, script_stops: bool, pending_too: bool
    ) -> None:
        """scancel, a time limit, a node failure or a preemption (with a grace time or not), of
        a live job (a running one, unless `pending_too`): quorum's or another user's. A started
        placeholder's script gets SIGTERM and calls `/hooks/stop` (unless its node failed, or its
        call is lost: `script_stops`)."""
        live = self.endable_jobs()
        running = [g for g in live if self.slurm.components[g][0].job_state == "RUNNING"]
        live = live if pending_too or not running else running
        group = data.draw(st.sampled_from(live))
        ran = self.slurm.components[group][0].job_state == "RUNNING"
        self.slurm.begin_end(group, how, grace)
        event(f"Slurm ends a {'running' if ran else 'pending'} job: {self.slurm.cause[group]}")
        if ran and script_stops and how != "node_fail" and group in self.slurm.marked:
            self.call_stop(group)

    @precondition(lambda self: bool(self.slurm.ending()))
    @rule(data=st.data())
    def slurm_finishes_ending_a_job(self, data: st.DataObject) -> None:
        self.slurm.finish_end(data.draw(st.sampled_from(self.slurm.ending())))

    def endable_jobs(self) -> list[int]:
        return sorted(g for g in self.slurm.components if self.slurm.alive(g) and g not in self.slurm.cause)

    @precondition(lambda self: bool(self.sets) and self.decoys < 4)
    @rule(
        data=st.data(),
        user=st.sampled_from(["mallory", "root"]),
        state=st.sampled_from(["PENDING", "RUNNING", "COMPLETING"]),
        started=st.booleans(),
    )
    def another_job_carries_a_copied_comment(
        self, data: st.DataObject, user: str, state: str, started: bool
    ) -> None:
        """Another Slurm user's job with the comment of one of quorum's keys (or, as root, a job
        with no quorum comment at all: an admin's batch job)."""
        self.decoys += 1
        key = data.draw(st.sampled_from(self.sets))
        comment = f"{model.MARKER} {key}" if user == "mallory" else "nightly batch"
        group = self.slurm.sbatch(user, comment + (model.STARTED if started else ""), state=state)
        if state == "COMPLETING":
            self.slurm.cause[group] = "cancel"
            self.slurm.ended_seq[group] = self.world.tick()
            self.slurm.components[group][0].end_time = int(self.world.now())

    # -- faults --------------------------------------------------------------------------------------

    @rule(
        fault=st.sampled_from(
            [*(f"fail {c}" for c in API_CALLS), "lose delete_pod", "lose post_event", "lose bind_pod"]
        ),
        times=st.integers(1, 3),
    )
    def the_apiserver_fails(self, fault: str, times: int) -> None:
        """The next calls fail before they act (etcd timing out), or one acts and its answer is lost."""
        how, call = fault.split()
        if how == "fail":
            self.api.fail_next[call] = times
        else:
            self.api.lose_next[call] = 1

    @rule(fault=st.sampled_from([*SLURM_CALLS, "submit taken, answer lost", "refusal", "down"]))
    def slurm_fails(self, fault: str) -> None:
        """The next call fails (slurmrestd timing out), a submission is taken but its answer lost,
        Slurm refuses the next submission, or slurmrestd is down for a pass."""
        if fault == "submit taken, answer lost":
            self.slurm.lost_submits = 1
        elif fault == "refusal":
            self.slurm.refusals = [
                SlurmError("slurmrestd POST /job/submit: HTTP 500: Invalid partition name")
            ]
        elif fault == "down":
            self.slurm.down = True
            self.a_pass(caught_up=False)
            self.slurm.down = False
        else:
            self.slurm.fail_next[fault] = 1

    # -- the rule -------------------------------------------------------------------------------------

    @invariant()
    def the_scheduler_disrupts_only_by_the_rule(self) -> None:
        assert not self.world.violations, self.world.violations

    @rule()
    def a_quiet_spell(self) -> None:
        """Faults heal, Slurm finishes what it is ending, kubelets and the watch catch up, the
        scheduler passes a few times and its stop calls answer: then every act has been told, no
        pod outlives an ended job it was made before, and no job of quorum's lives without pods."""
        self.api.fail_next.clear()
        self.api.lose_next.clear()
        self.slurm.fail_next.clear()
        self.slurm.lost_submits = 0
        self.slurm.refusals = []
        self.slurm.down = False
        if self.pass_task is not None:
            self.a_pass(caught_up=False)
        for _ in range(3):
            for group in self.slurm.ending():
                self.slurm.finish_end(group)
            self.kubelets_act()
            self.a_pass(caught_up=True)
            self.time_passes(1.0)
        self.time_passes(30.0)  # every stop's deadline has passed
        for _ in range(2):
            self.kubelets_act()
            self.a_pass(caught_up=True)
        self.the_scheduler_disrupts_only_by_the_rule()
        assert not self.stops, f"stop calls that never answered: {[s.job for s in self.stops]}"
        world, slurm = self.world, self.slurm
        for act in world.acts:
            told = [t for t in world.told if t.uid == act.uid and t.seq < act.seq and t.reason in REASONS]
            assert told, f"the delete of pod {act.name} (by {act.by}) was never told by an Event"
        for uid, found in sorted(self.api.pods.items()):
            if not present(found):
                continue
            key = world.key_of[uid]
            ours = [g for g, s in slurm.submitted.items() if s.key == key]
            if any(slurm.alive(g) for g in ours):
                continue
            # An unbound pod made in the second Slurm records as the job's end cannot be told from
            # the next submission's (whole-second times): it is spared, by the rule, and waits.
            unbound = not (found.get("spec") or {}).get("nodeName")
            outlived = [
                g
                for g in ours
                if g in slurm.ended_seq
                and world.made[uid] < slurm.ended_seq[g]
                and not (unbound and math.floor(world.made_at[uid]) >= (slurm.end_time(g) or 0))
            ]
            assert not outlived, f"pod {found['metadata']['name']} ({key}) outlived its ended job {outlived}"
        for group, submitted in sorted(slurm.submitted.items()):
            if not slurm.alive(group):
                continue
            pods = [
                uid for uid, p in self.api.pods.items() if world.key_of[uid] == submitted.key and present(p)
            ]
            assert pods, f"quorum's job {group} ({submitted.key}) lives on with no pods"


REASONS = {reason for _, reason in ENDS.values()}


def gang_key(name: str) -> str:
    return f"gang/{NS}/pg-{name}"


SunkDisruptionMachine.TestCase.settings = settings(
    max_examples=5000 if SOAK else int(os.environ.get("QUORUM_MODEL_EXAMPLES", "200")),
    stateful_step_count=60 if SOAK else 50,
    derandomize=not SOAK,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
test_the_sunk_scheduler_deletes_only_pods_whose_job_ended = SunkDisruptionMachine.TestCase
