"""Model test: quorum never deletes or suspends work that was fine.

A hypothesis state machine drives the real scheduling pass (`GangLoop`) against the lagging fake
apiserver (`tests/unit/fake_api.py`, `lag=True`), with a fake kube-scheduler, ReplicaSet and Job
controllers and node lifecycle beside it (a gang's pods are a ReplicaSet's or a Job's, so
recovery and preemption both delete pods and suspend Jobs). Its rules interleave gangs arriving
and finishing, nodes cordoned, filled by foreign pods or failing, member evictions, preemption
(gangs of higher priority), leader failover after any write (a new leader relists and resumes
while the old one's tasks are cut off wherever they were), each watch delivered late and on its
own, write failures, and time passing; and the platform's switch to placement kube-scheduler
(docs/placement.md) as a failover to a leader with that setting, after which new pods name their
gang's PodGroup instead of the gate and a fake kube-scheduler places each PodGroup whole.

The rule it holds (docs/lifecycle.md, "When quorum removes a pod"), checked by the fake
apiserver at the moment of every delete (a preemption's victims too) and Job suspension, against what the
apiserver holds then:

- a bound pod of a gang is deleted only if fewer than minMember of the gang's pods were bound
  in the gang's last fresh read (quorum reads the gang's pods after recording its decision);
- a pod is deleted for a partial placement only once the timeout of the gang's current
  decision has ended (a member-loss restart, `RestartGang`, needs no timeout);
- every delete or suspension is recorded on the gang's Gang before it is made
  (`status.disruption` names the pod or Job, under the current decision), and every victim of a
  preemption is named by a preemption recorded on its preemptor's Gang and marked
  `DisruptionTarget` (reason `PreemptionByQuorum`) before it is deleted;
- quorum never promises the same room twice: it releases no pod onto a node whose bound and
  released gang pods leave no room for it (those kube-scheduler placed count as another
  scheduler's pods do: quorum may not have seen them yet);
- quorum deletes no pod that kube-scheduler places (one naming its gang's PodGroup) for a
  recovery: that gang is kube-scheduler's.

And after a quiet spell (faults healed, watches caught up, a few passes): every act above is
followed by an Event that names it, and no gang stays released but short of minMember bound
past its timeout.

`make test` runs it with a fixed seed and a bounded number of examples; `make soak` runs it
long, with random seeds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import os
import sys
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from quorum.core.gangs import Placer
from quorum.core.lifecycle import BackoffPolicy
from quorum.k8s.api import KubeApi
from quorum.k8s.convert import timestamp
from quorum.k8s.usage import BoundPods
from quorum.k8s.writes import RESERVED_TAINT
from quorum.operator import clock
from quorum.operator.gangs import GANG_LABEL, Store
from quorum.operator.loop import GangLoop
from quorum.operator.settings import LoopSettings
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, node, pod, podgroup
from tests.unit.test_workload_versions import k8s_podgroup

JSON = dict[str, Any]
NODES = 4
GPUS = 8
TIMEOUT = 10  # every gang's scheduleTimeoutSeconds
WAS_TIMEOUT = 60  # a Kubernetes PodGroup's (a composite's gangs): it has no such field
WAS = "scheduling.k8s.io"
SIGS = "scheduling.sigs.k8s.io"
SOAK = os.environ.get("QUORUM_SOAK") == "1"
WRITES = (
    "release_pod",
    "patch_gang_status",
    "patch_gang_status_if",
    "create_gang",
    "delete_pod",
    "post_event",
    "read_gang_pods",
    "read_gang",
    "list_gangs",
    "delete_victim",
    "set_job_suspend",
    "mark_disruption_target",
    "clear_disruption_target",
    "taint_node",
    "ensure_pod_group",
)
TOLD = {  # the Events that name each kind of act, and whether they must come after it
    "delete": ({"PartiallyPlaced", "GangRestarted", "StuckPodReplaced"}, True),
    "victim": ({"Preempted"}, False),  # told to the victim as the preemption is recorded
    # RecoveryWithdrawn: a suspension made before its leader was cut off, undone by the next
    # leader's last look (the gang ran after all), and told.
    "suspension": ({"PartiallyPlaced", "GangRestarted", "RecoveryWithdrawn"}, True),
    "victim suspension": ({"Preempted"}, False),  # told to the victim as the preemption is recorded
}


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs the pass's worker-thread work at once: the model's runs are repeatable."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:
            future.set_exception(err)
        return future


class LeaderApi:
    """One leader's way to the apiserver. Once it is deposed, a call it starts fails, as the
    calls of a process that lost its Lease stop (its loop is cancelled within the renew
    deadline, before another may lead); calls already in flight land, late."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.deposed = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.api, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.deposed:
                raise asyncio.CancelledError
            return await method(*args, **kwargs)

        return call


@dataclass
class Act:
    """A delete, a victim's deletion or a suspension quorum made, and the Event that must follow it."""

    seq: int
    gang: str  # the gang's name (its label)
    what: str  # delete | victim | suspension
    pod: str
    reason: str = ""  # a delete's: the recorded disruption's
    at: float = 0.0  # when (the model's clock)


class AuditedApi(FakeApi):
    """The lagging fake apiserver, which checks the rule at every destructive call."""

    def __init__(self, store: Store, bound: BoundPods, clock_: clock.ManualClock) -> None:
        super().__init__(store, bound, lag=True)
        self.clock = clock_
        self.violations: list[str] = []
        self.acts: list[Act] = []
        self.seq = 0
        self.event_log: list[tuple[int, str, str]] = []  # (seq, object name, reason)
        self.bound_at: dict[str, int] = {}  # pod uid -> seq of its binding
        self.fresh_read: dict[str, int] = {}  # gang -> seq of quorum's last read of its pods
        # gang -> its minMember then: a tenant may resize the group between quorum's read and its
        # act; quorum decides by the group's size as its Gang records it (`spec.minMember`,
        # written a pass after the group changed) or the group's, the larger
        self.min_at_read: dict[str, int] = {}
        self.deleted_bound: dict[tuple[str, int], set[str]] = {}  # (gang, attempt) -> bound pods deleted
        self.lost: set[str] = set()  # gangs a running member of which someone else took
        self.delegated = False  # the platform switched to placement kube-scheduler
        self.skip = set(os.environ.get("QUORUM_MODEL_SKIP", "").split(","))  # checks left out, to explore

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    def violate(self, message: str, check: str) -> None:
        if check not in self.skip:
            self.violations.append(message)

    # -- what the apiserver holds ------------------------------------------------------------

    def gang_pods(self, gang: str) -> list[JSON]:
        return [
            p
            for p in self.server.pods.values()
            if (p["metadata"].get("labels") or {}).get(GANG_LABEL) == gang
            and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]

    def gang_object(self, gang: str) -> JSON:
        return (self.server.gangs.get((NS, gang)) or {}).get("status") or {}

    def group(self, gang: str) -> JSON:
        """The group of gang `pg-<name>` (a PodGroup of the seeds) or `wpg-<name>` (Kubernetes')."""
        if gang.startswith("wpg-"):
            return self.server.groups.get((WAS, NS, gang.removeprefix("wpg-"))) or {}
        return self.server.groups.get((SIGS, NS, gang.removeprefix("pg-"))) or {}

    def min_member(self, gang: str) -> int:
        spec = self.group(gang).get("spec") or {}
        if gang.startswith("wpg-"):
            return int(spec.get("schedulingPolicy", {}).get("gang", {}).get("minCount") or 1)
        return int(spec.get("minMember") or 1)

    def timeout(self, gang: str) -> int:
        return WAS_TIMEOUT if gang.startswith("wpg-") else TIMEOUT

    def restarts(self, gang: str) -> bool:
        annotations = self.group(gang).get("metadata", {}).get("annotations") or {}
        return annotations.get("quorum.dev/member-loss-policy") == "RestartGang"

    def siblings(self, gang: str) -> tuple[int, list[str]]:
        """The minGroupCount of the gang's CompositePodGroup and its gangs (0 and none if it has none)."""
        parent = (self.group(gang).get("spec") or {}).get("parentCompositePodGroupName")
        composite = self.server.composites.get((NS, parent or ""))
        if composite is None:
            return 0, []
        return int(composite["spec"]["schedulingPolicy"]["gang"]["minGroupCount"]), [
            f"wpg-{name}"
            for (api, ns, name), group in self.server.groups.items()
            if api == WAS
            and ns == NS
            and (group.get("spec") or {}).get("parentCompositePodGroupName") == parent
        ]

    def composite_short(self, gang: str) -> bool:
        """Whether the gang's CompositePodGroup had fewer than minGroupCount gangs bound whole
        in quorum's last fresh reads of their pods (counting those it deleted since), one of
        them partially placed: past its timeout, or recorded so."""
        need, siblings = self.siblings(gang)
        short = [s for s in siblings if self.bound_when_read(s) < self.min_member(s)]
        timed_out = any(
            (self.gang_object(s).get("disruption") or {}).get("reason") == "PartiallyPlaced"
            or (
                (decided := (self.gang_object(s).get("admission") or {}).get("time")) is not None
                and self.clock.time() - timestamp(decided) >= self.timeout(s)
            )
            for s in short
        )
        return len(siblings) - len(short) < need and timed_out

    def bound_when_read(self, gang: str) -> int:
        """The gang's pods bound when quorum last read them afresh, those it deleted since too."""
        read = self.fresh_read.get(gang, self.seq)
        attempt = int((self.gang_object(gang).get("admission") or {}).get("attempt") or 0)
        taken = self.deleted_bound.get((gang, attempt), set())
        return len(
            taken
            | {
                p["metadata"]["uid"]
                for p in self.gang_pods(gang)
                if p["spec"].get("nodeName") and self.bound_at.get(p["metadata"]["uid"], 0) <= read
            }
        )

    # -- the rule, checked as quorum acts ----------------------------------------------------------

    def check_delete(self, target: JSON) -> None:
        meta = target["metadata"]
        current = self.server.pods.get(meta["uid"])
        gang = (meta.get("labels") or {}).get(GANG_LABEL)
        if (
            current is None
            or gang is None
            or meta.get("resourceVersion") != current["metadata"]["resourceVersion"]
        ):
            return  # refused: gone, or changed since quorum read it
        if placed_by_kube_scheduler(current, self.delegated, self.pinned):
            self.violate(f"deleted pod {meta['name']} of {gang}, which kube-scheduler places", "delegated")
        status = self.gang_object(gang)
        admission = status.get("admission") or {}
        attempt = int(admission.get("attempt") or 0)
        disruption = status.get("disruption") or {}
        name = meta["name"]
        bound_pod = bool(current["spec"].get("nodeName"))
        need = self.min_at_read.get(gang, self.min_member(gang))
        composite = disruption.get("reason") == "CompositePartiallyPlaced"
        if bound_pod:
            read = self.fresh_read.get(gang, self.seq)
            taken = self.deleted_bound.setdefault((gang, attempt), set())
            if self.bound_at.get(meta["uid"], 0) <= read:
                taken.add(meta["uid"])
            bound = self.bound_when_read(gang)
            if bound >= need and not (composite and self.composite_short(gang)):
                self.violate(
                    f"deleted bound pod {name} of {gang}: {bound} of minMember {need} bound"
                    + (", and its composite had minGroupCount gangs whole" if composite else ""),
                    "bound",
                )
        released_at = timestamp(admission.get("time"))
        restart = self.restarts(gang) and disruption.get("reason") != "PartiallyPlaced"
        # A composite's gang goes with a sibling whose own timeout ended (checked at its recovery).
        if not restart and not composite and self.clock.time() - released_at < self.timeout(gang):
            self.violate(
                f"deleted pod {name} of {gang} {self.clock.time() - released_at:.0f}s after its decision "
                f"(attempt {attempt}), before its timeout of {self.timeout(gang)}s ended",
                "timeout",
            )
        if disruption.get("reason") == "MemberLost" and gang not in self.lost:
            self.violate(
                f"deleted pod {name} of {gang}: restarted for a member loss, but it lost none", "lost"
            )
        recorded = (
            isinstance(disruption, dict)
            and disruption.get("attempt") == attempt
            and meta["uid"] in {t.get("uid") for t in disruption.get("pods") or []}
        )
        if not recorded:
            self.violate(f"deleted pod {name} of {gang} with no recorded decision naming it", "recorded")
        self.acts.append(
            Act(self.tick(), gang, "delete", name, str(disruption.get("reason")), self.clock.time())
        )
        of_composite = ", of a composite" if gang.startswith("wpg-") else ""
        event(f"delete ({disruption.get('reason')}{of_composite})")

    def check_victim(self, target: JSON) -> None:
        meta = target["metadata"]
        current = self.server.pods.get(meta["uid"])
        if current is None:
            return
        gang = (current["metadata"].get("labels") or {}).get(GANG_LABEL)
        named = False
        for obj in self.server.gangs.values():
            for victim in ((obj.get("status") or {}).get("preemption") or {}).get("victims") or []:
                if victim.get("kind") == "gang" and victim.get("name") == gang:
                    named = True
                if victim.get("kind") == "pod" and victim.get("name") == meta["name"]:
                    named = True
        if not named:
            self.violate(f"deleted victim {meta['name']} named by no recorded preemption", "recorded")
        if self.disruption_targets.get(meta["uid"], ("",))[0] != "PreemptionByQuorum":
            self.violate(f"deleted victim {meta['name']} not marked DisruptionTarget first", "recorded")
        self.acts.append(Act(self.tick(), gang or meta["name"], "victim", meta["name"]))
        event("victim")

    def check_suspension(self, namespace: str, name: str, uid: str) -> None:
        job = self.jobs.get((namespace, name))
        if job is None or job["metadata"]["uid"] != uid or job["spec"].get("suspend"):
            return  # refused (gone, replaced), or suspended already: nothing happens
        gang = "pg-" + name.removeprefix("job-")
        preempted = any(
            victim.get("kind") == "gang" and victim.get("name") == gang
            for obj in self.server.gangs.values()
            for victim in ((obj.get("status") or {}).get("preemption") or {}).get("victims") or []
        )
        if preempted and name not in self.suspended_jobs_recorded(gang):
            self.violate(f"suspended victim Job {name} before its Gang recorded it to resume", "recorded")
        if not preempted:
            status = self.gang_object(gang)
            admission = status.get("admission") or {}
            disruption = status.get("disruption") or {}
            recorded = (
                isinstance(disruption, dict)
                and disruption.get("attempt") == int(admission.get("attempt") or 0)
                and uid in {t.get("uid") for t in disruption.get("jobs") or []}
            )
            if not recorded:
                self.violate(f"suspended Job {name} with no recorded decision naming it", "recorded")
            read = self.fresh_read.get(gang, self.seq)
            bound = sum(
                1
                for p in self.gang_pods(gang)
                if p["spec"].get("nodeName") and self.bound_at.get(p["metadata"]["uid"], 0) <= read
            )
            need = self.min_at_read.get(gang, self.min_member(gang))
            restart = self.restarts(gang) and disruption.get("reason") != "PartiallyPlaced"
            if bound >= need and not restart:
                self.violate(f"suspended Job {name} of {gang}: {bound} of minMember {need} bound", "bound")
            released_at = timestamp(admission.get("time"))
            if not restart and self.clock.time() - released_at < TIMEOUT:
                self.violate(
                    f"suspended Job {name} of {gang} before its timeout of {TIMEOUT}s ended", "timeout"
                )
        self.acts.append(Act(self.tick(), gang, "victim suspension" if preempted else "suspension", name))
        event("suspension (preemption)" if preempted else "suspension")

    def suspended_jobs_recorded(self, gang: str) -> list[str]:
        """The Jobs the gang's Gang records as quorum's to resume (what recovery and `quorum
        uninstall` read)."""
        return list((self.gang_object(gang).get("recovery") or {}).get("suspendedJobs") or [])

    def check_release(self, target: JSON, node_name: str | None) -> None:
        current = self.server.pods.get(target["metadata"]["uid"])
        node_obj = self.server.nodes.get(node_name or "")
        if current is None or node_obj is None or not _gated(current):
            return

        def counts(p: JSON) -> bool:
            """Gang pods bound there or promised it (others' pods quorum may not know of yet)."""
            uid = p["metadata"]["uid"]
            if p["status"].get("phase") in ("Succeeded", "Failed") or uid == current["metadata"]["uid"]:
                return False
            if GANG_LABEL not in (p["metadata"].get("labels") or {}):
                return False
            if placed_by_kube_scheduler(p, self.delegated, self.pinned):
                return False  # kube-scheduler's, as a foreign pod: quorum may not know of it yet
            if p["spec"].get("nodeName"):
                return bool(p["spec"]["nodeName"] == node_name)
            return not _gated(p) and self.pinned.get(uid) == node_name

        promised = sum(gpus(p) for p in self.server.pods.values() if counts(p))
        if promised + gpus(current) > GPUS:
            self.violate(
                f"released {current['metadata']['name']} onto {node_name}: {promised} of {GPUS} GPUs "
                f"bound to or promised to gang pods already",
                "overcommit",
            )

    def check_taint(self, token: str) -> None:
        """One preemption at a time: a node is reserved only for the preemption recorded, while
        no other is (a leader that does not see one in flight must not start another)."""
        recorded = {
            str(record.get("token"))
            for obj in self.server.gangs.values()
            if isinstance(record := (obj.get("status") or {}).get("preemption"), dict) and record.get("token")
        }
        if token not in recorded:
            self.violate(f"reserved a node for preemption {token}, which no Gang records", "recorded")
        elif len(recorded) > 1:
            self.violate(f"preemptions {sorted(recorded)} in flight at once", "one preemption")

    # -- the calls -----------------------------------------------------------------------------

    async def taint_node(self, node: JSON, token: str, add: bool) -> bool:
        if add and not self.will_fail("taint_node", node, token, add):
            self.check_taint(token)
        return await super().taint_node(node, token, add)

    async def applied(self, act: Coroutine[Any, Any, bool], check: Callable[[], None] | None) -> bool:
        """Check a destructive call against the rule as it is made; its act counts (and must
        be told) only if the apiserver applied it: a call refused (the pod changed since it was
        read), or cut off before it was sent (a leader cancelled with it in flight), did nothing."""
        mark = len(self.acts)
        if check is not None:
            check()
        try:
            done = await act
        except BaseException:
            del self.acts[mark:]
            raise
        if not done:
            del self.acts[mark:]
        return done

    async def delete_pod(self, pod: JSON) -> bool:
        check = None if self.will_fail("delete_pod", pod) else lambda: self.check_delete(pod)
        return await self.applied(super().delete_pod(pod), check)

    async def delete_victim(self, pod: JSON) -> bool:
        check = None if self.will_fail("delete_victim", pod) else lambda: self.check_victim(pod)
        return await self.applied(super().delete_victim(pod), check)

    async def release_pod(self, pod: JSON, node: str | None, tolerate: str | None = None) -> bool:
        if not self.will_fail("release_pod", pod, node):
            self.check_release(pod, node)
            if pod["metadata"]["labels"].get(GANG_LABEL, "").startswith("wpg-"):
                event("a composite's gang released")
        return await super().release_pod(pod, node, tolerate)

    async def set_job_suspend(self, namespace: str, name: str, uid: str, suspend: bool) -> bool:
        checked = suspend and not self.will_fail("set_job_suspend", namespace, name, uid, suspend)
        check = (lambda: self.check_suspension(namespace, name, uid)) if checked else None
        return await self.applied(super().set_job_suspend(namespace, name, uid, suspend), check)

    async def read_job(self, namespace: str, name: str) -> JSON | None:
        """The Job with the count of its pods that are active now, as its controller keeps it."""
        job = await super().read_job(namespace, name)
        if job is not None:
            owned = [p for p in self.server.pods.values() if controller_uid(p) == job["metadata"]["uid"]]
            job["status"] = {
                "active": sum(1 for p in owned if p["status"].get("phase") not in ("Succeeded", "Failed"))
            }
        return job

    async def read_gang_pods(self, namespace: str, gang: str, *also: str) -> list[JSON]:
        pods = await super().read_gang_pods(namespace, gang, *also)
        self.fresh_read[gang] = self.tick()
        recorded = ((self.server.gangs.get((NS, gang)) or {}).get("spec") or {}).get("minMember")
        self.min_at_read[gang] = max(self.min_member(gang), recorded if isinstance(recorded, int) else 0)
        return pods

    async def post_event(self, obj: JSON, reason: str, message: str, warning: bool = False) -> None:
        await super().post_event(obj, reason, message, warning)
        self.event_log.append((self.tick(), obj["metadata"]["name"], reason))


def placed_by_kube_scheduler(p: JSON, delegated: bool, released: Collection[str]) -> bool:
    """A pod admitted under placement kube-scheduler (`delegated`: the platform switched): a seed
    gang's that names its gang's PodGroup, or a Kubernetes PodGroup's never held at quorum's gate
    (not gated, never released by quorum: not in `released`)."""
    group = ((p.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    label = (p["metadata"].get("labels") or {}).get(GANG_LABEL)
    if group is None:
        return False
    if group == label:
        return True
    return delegated and not _gated(p) and p["metadata"]["uid"] not in released


def controller_uid(p: JSON) -> str | None:
    return next((o["uid"] for o in p["metadata"].get("ownerReferences") or [] if o.get("controller")), None)


def gpus(p: JSON) -> int:
    return sum(int(c["resources"]["requests"].get("nvidia.com/gpu", 0)) for c in p["spec"]["containers"])


def _gated(p: JSON) -> bool:
    return any(g.get("name") == "quorum.dev/gang" for g in p["spec"].get("schedulingGates") or [])


def loop_settings(placement: Placer = Placer.QUORUM) -> LoopSettings:
    return LoopSettings(
        placement=placement,
        forming_grace_seconds=0.0,
        status_interval_seconds=0.0,
        gang_timeout_seconds=30.0,
        failure_backoff=BackoffPolicy(1.0, 4.0),
        backoff=BackoffPolicy(10.0, 40.0),
    )


@dataclass
class GangSpec:
    name: str  # the group's name; the gang is "pg-<name>" ("wpg-<name>" in a composite)
    size: int
    min_member: int
    gpus: int
    priority: int
    job: bool = False  # its pods are a Job's (recovered by suspending it), else a ReplicaSet's
    made: int = 0  # pods made so far (names)
    finished: bool = False
    composite: str | None = None  # its Kubernetes PodGroup's CompositePodGroup (1.37)

    @property
    def gang(self) -> str:
        return f"wpg-{self.name}" if self.composite else f"pg-{self.name}"


@dataclass
class Model:
    gangs: dict[str, GangSpec] = field(default_factory=dict)
    created: int = 0
    foreign: int = 0


class DisruptionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.new_event_loop()
        self.runner.set_default_executor(InlineExecutor())
        self.clock = clock.ManualClock(start=1_800_000_000.0)
        self.clock_use = clock.using(self.clock)
        self.clock_use.__enter__()
        server = Store()
        server.composite_version = "v1alpha3"
        for i in range(NODES):
            server.nodes[f"n{i}"] = node(f"n{i}", GPUS)
        self.api = AuditedApi(server, BoundPods(), self.clock)
        self.api.server = server
        store, bound = self.api.relist()
        self.session = LeaderApi(self.api)
        self.placement = Placer.QUORUM  # the platform's setting: what the webhook and a new leader use
        self.loop = GangLoop(cast(KubeApi, self.session), store, bound, loop_settings())
        self.loop.resume()
        self.deposed: list[GangLoop] = []  # leaders that lost the Lease and have not noticed yet
        self.led_since = self.clock.time()  # when the current leader took over
        self.model = Model()

    def run(self, work: Coroutine[Any, Any, Any]) -> Any:
        return self.runner.run_until_complete(work)

    def teardown(self) -> None:
        try:
            for loop in [self.loop, *self.deposed]:
                self.stop(loop)
            self.runner.run_until_complete(asyncio.sleep(0))
        finally:
            self.runner.close()
            self.clock_use.__exit__(None, None, None)

    # -- tenants ---------------------------------------------------------------------------------

    @initialize(
        size=st.integers(1, 4),
        extra=st.integers(0, 2),
        gpu=st.sampled_from([2, 4, 8]),
        restart=st.booleans(),
        job=st.booleans(),
    )
    def a_first_gang(self, size: int, extra: int, gpu: int, restart: bool, job: bool) -> None:
        self.a_gang_arrives(size, extra, gpu, 0, restart, job)

    @rule(
        size=st.integers(1, 4),
        extra=st.integers(0, 2),
        gpu=st.sampled_from([2, 4, 8]),
        priority=st.sampled_from([0, 0, 100]),
        restart=st.booleans(),
        job=st.booleans(),
    )
    def a_gang_arrives(
        self, size: int, extra: int, gpu: int, priority: int, restart: bool, job: bool
    ) -> None:
        live = [g for g in self.model.gangs.values() if not g.finished]
        if len(live) >= 4 or self.model.created >= 6:
            return
        name = f"g{self.model.created}"
        self.model.created += 1
        spec = GangSpec(name, size + extra, size, gpu, priority, job)
        self.model.gangs[name] = spec
        if job:
            self.api.jobs[(NS, f"job-{name}")] = {
                "metadata": {"name": f"job-{name}", "namespace": NS, "uid": f"job-{name}", "labels": {}},
                "spec": {"suspend": False},
                "status": {},
            }
        group = podgroup(name, size)
        group["spec"]["scheduleTimeoutSeconds"] = TIMEOUT
        if restart:
            group["metadata"]["annotations"] = {"quorum.dev/member-loss-policy": "RestartGang"}
        for table in (self.api.server.groups, self.loop.store.groups):  # groups are not modelled lagging
            table[("scheduling.sigs.k8s.io", NS, name)] = copy.deepcopy(group)
        for _ in range(spec.size):
            self.make_pod(spec)

    @rule(
        sizes=st.tuples(st.integers(1, 2), st.integers(1, 3)),
        gpu=st.sampled_from([4, 8, 8]),
        min_groups=st.integers(1, 2),
    )
    def a_composite_arrives(self, sizes: tuple[int, int], gpu: int, min_groups: int) -> None:
        """A 1.37 CompositePodGroup of two gangs (a launcher and its workers, each a ReplicaSet
        of Kubernetes PodGroup pods), admitted whole and recovered whole."""
        live = [g for g in self.model.gangs.values() if not g.finished]
        if len(live) >= 3 or self.model.created >= 6 or self.placement is Placer.KUBE_SCHEDULER:
            return  # (kube-scheduler's composite cycle is not modelled)
        composite = f"c{self.model.created}"
        self.model.created += 1
        body = {
            "apiVersion": f"{WAS}/v1alpha3",
            "kind": "CompositePodGroup",
            "metadata": {"name": composite, "namespace": NS, "uid": f"uid-{composite}"},
            "spec": {"schedulingPolicy": {"gang": {"minGroupCount": min_groups}}},
        }
        for composites in (self.api.server.composites, self.loop.store.composites):  # not modelled lagging
            composites[(NS, composite)] = copy.deepcopy(body)
        for part, size in zip(("launcher", "workers"), sizes, strict=True):
            name = f"{composite}-{part}"
            spec = GangSpec(name, size, size, gpu, 0, composite=composite)
            self.model.gangs[name] = spec
            group = k8s_podgroup("v1beta1", name=name, parentCompositePodGroupName=composite)
            group["spec"]["schedulingPolicy"] = {"gang": {"minCount": size}}
            for table in (self.api.server.groups, self.loop.store.groups):
                table[(WAS, NS, name)] = copy.deepcopy(group)
            for _ in range(size):
                self.make_pod(spec)

    def make_pod(self, spec: GangSpec) -> None:
        kind, prefix = ("Job", "job") if spec.job else ("ReplicaSet", "rs")
        owner = {
            "apiVersion": "batch/v1" if spec.job else "apps/v1",
            "kind": kind,
            "name": f"{prefix}-{spec.name}",
            "uid": f"{prefix}-{spec.name}",
            "controller": True,
        }
        p = pod(spec.name, spec.made, spec.gpus, owner)
        p["metadata"]["uid"] = f"{spec.name}-{spec.made}"
        p["metadata"]["name"] = f"{spec.name}-{spec.made}"
        p["spec"]["priority"] = spec.priority
        if spec.composite:
            p["metadata"]["labels"] = {GANG_LABEL: spec.gang}
            p["spec"]["schedulingGroup"] = {"podGroupName": spec.name}
        if self.placement is Placer.KUBE_SCHEDULER:  # the webhook names the PodGroup, no gate
            p["spec"]["schedulingGates"] = []
            p["spec"].setdefault("schedulingGroup", {"podGroupName": spec.gang})
        spec.made += 1
        self.api.server.pods[p["metadata"]["uid"]] = p
        self.api.changed("pods", p["metadata"]["uid"], p)

    @rule(data=st.data())
    def a_gang_finishes(self, data: st.DataObject) -> None:
        live = [g for g in self.model.gangs.values() if not g.finished]
        if not live:
            return
        spec = data.draw(st.sampled_from(live))
        # A composite's gangs finish together, as its job does.
        for each in [g for g in live if g.composite and g.composite == spec.composite] or [spec]:
            each.finished = True
            for p in self.api.gang_pods(each.gang):
                self.remove_pod(p)
            for table in (self.api.server.groups, self.loop.store.groups):
                table.pop((WAS if each.composite else SIGS, NS, each.name), None)
        if spec.composite:
            for composites in (self.api.server.composites, self.loop.store.composites):
                composites.pop((NS, spec.composite), None)

    def remove_pod(self, p: JSON) -> None:
        uid = p["metadata"]["uid"]
        if self.api.server.pods.pop(uid, None) is not None:
            self.api.changed("pods", uid, None)

    @rule()
    def controllers_act(self) -> None:
        """Each ReplicaSet, and each Job not suspended, makes its missing pods again (gated by
        the webhook), a bounded number; a suspended Job's controller deletes its pods."""
        for spec in self.model.gangs.values():
            pods = self.api.gang_pods(spec.gang)
            if spec.job and self.api.jobs[(NS, f"job-{spec.name}")]["spec"].get("suspend"):
                for p in pods:
                    self.remove_pod(p)
                continue
            missing = spec.size - len(pods)
            while not spec.finished and missing > 0 and spec.made < spec.size + 6:
                self.make_pod(spec)
                missing -= 1

    @rule(data=st.data())
    def someone_evicts_a_member(self, data: st.DataObject) -> None:
        running = [
            p
            for p in self.api.server.pods.values()
            if p["spec"].get("nodeName") and GANG_LABEL in p["metadata"]["labels"]
        ]
        if running:
            taken = data.draw(st.sampled_from(sorted(running, key=lambda p: p["metadata"]["uid"])))
            self.api.lost.add(taken["metadata"]["labels"][GANG_LABEL])
            self.remove_pod(taken)

    @rule(data=st.data(), change=st.sampled_from([-2, -1, 1, 2]))
    def its_group_is_resized(self, data: st.DataObject, change: int) -> None:
        """A tenant changes a running gang's minMember (Kubernetes 1.37's mutable gang.minCount):
        growing is not a member loss, shrinking makes the members beyond it elastic."""
        live = [g for g in self.model.gangs.values() if not g.finished and not g.composite]
        if not live:
            return
        spec = data.draw(st.sampled_from(live))
        spec.min_member = max(1, min(spec.size, spec.min_member + change))
        for table in (self.api.server.groups, self.loop.store.groups):
            group = table.get(("scheduling.sigs.k8s.io", NS, spec.name))
            if group is not None:
                table[("scheduling.sigs.k8s.io", NS, spec.name)] = {
                    **group,
                    "spec": {**group["spec"], "minMember": spec.min_member},
                }

    @rule(data=st.data())
    def a_member_is_replaced_while_the_gang_watch_lags(self, data: st.DataObject) -> None:
        """A running member goes, its ReplicaSet makes it again, and quorum releases the
        replacement and passes again, all while the Gang watch shows none of quorum's writes."""
        self.someone_evicts_a_member(data)
        self.controllers_act()
        for _ in range(2):
            self.api.deliver("pods")
            self.api.deliver("nodes")
            self.run(self.loop.step())
            self.run(settle(self.loop))

    @rule(failing=st.integers(1, 3), i=st.integers(0, NODES - 1))
    def a_release_is_cut_off_by_a_failover(self, failing: int, i: int) -> None:
        """The leader releases with some pod patches failing, the released pods bind, a node is
        cordoned, and the leader dies before it finishes: the next one resumes the release."""
        self.api.deliver_all()
        self.api.fail("release_pod", times=failing)
        self.run(self.loop.step())
        self.run(settle(self.loop))
        self.kube_scheduler_binds()
        self.a_node_is_cordoned(i)
        self.the_leader_fails_over()
        self.run(self.loop.step())
        self.run(settle(self.loop))

    @rule(data=st.data())
    def a_composites_pod_misses_its_node(self, data: st.DataObject) -> None:
        """A released pod of a composite's gang finds its node cordoned before it binds; the
        others bind, the gang's timeout passes, and quorum makes a few passes."""
        waiting = [
            p
            for uid, p in sorted(self.api.server.pods.items())
            if p["metadata"]["labels"].get(GANG_LABEL, "").startswith("wpg-")
            and not _gated(p)
            and not p["spec"].get("nodeName")
            and self.api.pinned.get(uid)
        ]
        if not waiting:
            return
        missing = data.draw(st.sampled_from(waiting))
        self.a_node_is_cordoned(int(str(self.api.pinned[missing["metadata"]["uid"]])[1:]))
        self.kube_scheduler_binds()
        self.time_passes(WAS_TIMEOUT + 1)
        for _ in range(3):
            self.api.deliver("pods")
            self.run(self.loop.step())
            self.run(settle(self.loop))

    # -- nodes and kube-scheduler --------------------------------------------------------------

    @rule()
    def kube_scheduler_binds(self) -> None:
        """Released pods bind to the node their release pinned them to, if it still takes them."""
        for uid, p in sorted(self.api.server.pods.items()):
            if _gated(p) or p["spec"].get("nodeName") or uid not in self.api.pinned:
                continue
            target = self.api.pinned[uid]
            n = self.api.server.nodes.get(target or "")
            if n is None or n["spec"].get("unschedulable"):
                continue
            taints = [t for t in n["spec"].get("taints") or [] if t.get("key") == RESERVED_TAINT]
            if any(t.get("value") != self.api.tolerated.get(uid) for t in taints):
                continue
            if self.used(target or "") + gpus(p) > GPUS:
                continue
            self.bind(p, str(target))

    def bind(self, p: JSON, node_name: str) -> None:
        """kube-scheduler binds the pod to the node; kwok runs it."""
        uid = p["metadata"]["uid"]
        bound = copy.deepcopy(p)
        bound["spec"]["nodeName"] = node_name
        bound["status"] = {"phase": "Running"}
        self.api.server.pods[uid] = bound
        self.api.bound_at[uid] = self.api.tick()
        self.api.changed("pods", uid, bound)

    @rule()
    def kube_scheduler_places_pod_groups(self) -> None:
        """kube-scheduler's gang cycle: the unbound pods that name a PodGroup are bound together,
        first fit, once the pods naming it reach its minCount and all of them fit; else none."""
        by_group: dict[str, list[JSON]] = {}
        for _, p in sorted(self.api.server.pods.items()):
            group = ((p["spec"].get("schedulingGroup") or {}).get("podGroupName")) if not _gated(p) else None
            if group is not None and p["status"].get("phase") not in ("Succeeded", "Failed"):
                by_group.setdefault(group, []).append(p)
        for group, pods in by_group.items():
            obj = self.api.server.groups.get((WAS, NS, group))
            unbound = [
                p
                for p in pods
                if not p["spec"].get("nodeName") and p["metadata"]["uid"] not in self.api.pinned
            ]
            if obj is None or not unbound:
                continue
            if len(pods) < int(obj["spec"]["schedulingPolicy"]["gang"]["minCount"]):
                continue
            free = {
                name: GPUS - self.used(name)
                for name, n in sorted(self.api.server.nodes.items())
                if not n["spec"].get("unschedulable")
                and not any(t.get("key") == RESERVED_TAINT for t in n["spec"].get("taints") or [])
            }
            placement: list[tuple[JSON, str]] = []
            for p in unbound:
                target = next((name for name, left in free.items() if left >= gpus(p)), None)
                if target is None:
                    break
                free[target] -= gpus(p)
                placement.append((p, target))
            if len(placement) < len(unbound):
                continue
            event("kube-scheduler placed a PodGroup")
            for p, target in placement:
                self.bind(p, target)

    @rule()
    def the_platform_moves_to_kube_scheduler_placement(self) -> None:
        """The operator's Deployment is rolled out with placement kube-scheduler (a new leader,
        with what its watches had), and the webhook admits new pods so from now on."""
        if self.placement is Placer.KUBE_SCHEDULER:
            return
        self.placement = Placer.KUBE_SCHEDULER
        self.api.delegated = True
        event("the platform moved to placement kube-scheduler")
        self.the_leader_fails_over(frozenset(), lingers=True)

    def used(self, node_name: str) -> int:
        return sum(
            gpus(p)
            for p in self.api.server.pods.values()
            if p["spec"].get("nodeName") == node_name
            and p["status"].get("phase") not in ("Succeeded", "Failed")
        )

    @rule(i=st.integers(0, NODES - 1))
    def a_node_is_cordoned(self, i: int) -> None:
        n = self.api.server.nodes[f"n{i}"]
        n["spec"]["unschedulable"] = True
        self.api.changed("nodes", f"n{i}", n)

    @rule(i=st.integers(0, NODES - 1))
    def a_foreign_pod_lands(self, i: int) -> None:
        """A pod of another scheduler takes what is free on a node by bound pods alone (it does
        not know what quorum promised)."""
        free = GPUS - self.used(f"n{i}")
        if free <= 0 or self.model.foreign >= 6:
            return
        self.model.foreign += 1
        p = pod("foreign", self.model.foreign, free)
        p["metadata"]["labels"] = {}
        p["metadata"]["uid"] = p["metadata"]["name"] = f"foreign-{self.model.foreign}"
        p["spec"]["schedulingGates"] = []
        p["spec"]["nodeName"] = f"n{i}"
        p["status"] = {"phase": "Running"}
        self.api.server.pods[p["metadata"]["uid"]] = p
        self.api.changed("pods", p["metadata"]["uid"], p)

    @rule(i=st.integers(0, NODES - 1))
    def a_node_fails(self, i: int) -> None:
        """NotReady, and the node lifecycle deletes its pods."""
        n = self.api.server.nodes[f"n{i}"]
        n["spec"]["unschedulable"] = True
        n["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        self.api.changed("nodes", f"n{i}", n)
        for p in list(self.api.server.pods.values()):
            if p["spec"].get("nodeName") == f"n{i}":
                if GANG_LABEL in (p["metadata"].get("labels") or {}):
                    self.api.lost.add(p["metadata"]["labels"][GANG_LABEL])  # a member lost with its node
                self.remove_pod(p)

    # -- quorum, its watches, its apiserver ------------------------------------------------------

    @rule()
    def a_pass(self) -> None:
        self.run(self.loop.step())

    @rule(n=st.integers(1, 12))
    def tasks_run_a_little(self, n: int) -> None:
        async def turns() -> None:
            for _ in range(n):
                await asyncio.sleep(0)

        self.run(turns())

    @rule()
    def tasks_run_to_the_end(self) -> None:
        self.run(settle(self.loop))

    @rule(kind=st.sampled_from(["pods", "gangs", "nodes", "groups"]), n=st.integers(1, 6))
    def a_watch_delivers(self, kind: str, n: int) -> None:
        self.api.deliver(kind, n)

    @rule(method=st.sampled_from(WRITES), times=st.integers(1, 3))
    def writes_fail(self, method: str, times: int) -> None:
        self.api.fail(method, times=times)

    @rule(seconds=st.sampled_from([1, 5, 15, TIMEOUT + 1, 2 * TIMEOUT, WAS_TIMEOUT + 1]))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(
        relisted=st.frozensets(st.sampled_from(["pods", "gangs", "nodes"])),
        lingers=st.booleans(),
    )
    def the_leader_fails_over(
        self, relisted: frozenset[str] = frozenset({"pods", "gangs", "nodes"}), lingers: bool = False
    ) -> None:
        """The standby leads with what its own watches had: each kind as far behind as the
        leader's, but for the kinds whose watch relisted as it took over. The old leader either
        died at once, wherever its tasks were, or `lingers`: it has not noticed yet, and its
        tasks' writes in flight go on landing after the handover until it stops."""
        old = self.loop
        self.session.deposed = True  # a call it starts from now on fails; those in flight land
        if lingers:
            self.deposed.append(old)
        else:
            self.stop(old)
        store, bound = self.api.standby(relisted)
        self.led_since = self.clock.time()
        self.session = LeaderApi(self.api)
        self.loop = GangLoop(cast(KubeApi, self.session), store, bound, loop_settings(self.placement))
        for _ in range(100):  # as its run() does: it lists afresh until a list gets through
            try:
                self.run(self.loop.take_over())
                break
            except Exception:
                continue
        else:
            raise AssertionError("the new leader could never list the gangs")

    @rule()
    def the_deposed_leader_stops(self) -> None:
        """A deposed leader notices that it lost the Lease: its tasks are cancelled."""
        while self.deposed:
            self.stop(self.deposed.pop())

    def stop(self, loop: GangLoop) -> None:
        self.run(loop.work.cancel_all())
        for task in list(loop.reports):
            task.cancel()

    # -- the rule ----------------------------------------------------------------------------------

    @invariant()
    def quorum_disrupts_only_by_the_rule(self) -> None:
        assert not self.api.violations, self.api.violations

    @invariant()
    def every_suspended_job_is_recorded(self) -> None:
        """A Job quorum suspended is recorded on its gang's Gang as long as it stays suspended,
        wherever a leader was cut off and whichever write failed: else neither recovery nor
        `quorum uninstall` would ever resume it."""
        for spec in self.model.gangs.values():
            job = self.api.jobs.get((NS, f"job-{spec.name}"))
            if spec.finished or job is None or not job["spec"].get("suspend"):
                continue
            recorded = self.api.suspended_jobs_recorded(spec.gang)
            assert job["metadata"]["name"] in recorded, (
                f"Job {job['metadata']['name']} is suspended and recorded nowhere (recorded: {recorded})"
            )

    @rule()
    def a_quiet_spell(self) -> None:
        """Faults heal, the watches catch up, controllers and kube-scheduler act, quorum makes a
        few passes: every act has been told, and no gang is left half-released past its timeout."""
        self.api.heal()
        self.the_deposed_leader_stops()
        quiet_since = self.clock.time()
        # A composite's gangs time out after 60 s: the spell lasts past that when one is here.
        composites = any(g.composite and not g.finished for g in self.model.gangs.values())
        for i in range(8 if composites else 4):
            self.api.deliver_all()
            self.run(self.loop.step())
            self.run(settle(self.loop))
            self.kube_scheduler_binds()
            self.kube_scheduler_places_pod_groups()
            self.controllers_act()
            self.clock.advance(WAS_TIMEOUT if composites and i == 3 else 5)
        self.api.deliver_all()
        self.run(self.loop.step())
        self.run(settle(self.loop))
        self.quorum_disrupts_only_by_the_rule()
        for spec in self.model.gangs.values():  # recorded, and resumed by the rules once its pods are gone
            job = self.api.jobs.get((NS, f"job-{spec.name}"))
            if not spec.finished and job is not None and job["spec"].get("suspend"):
                left = [
                    p for p in self.api.server.pods.values() if controller_uid(p) == job["metadata"]["uid"]
                ]
                assert left, f"Job {job['metadata']['name']} stays suspended with none of its pods left"
        in_flight = any((g.get("status") or {}).get("preemption") for g in self.api.server.gangs.values())
        marked = [
            p["metadata"]["name"]
            for p in self.api.server.pods.values()
            if p["spec"].get("nodeName")
            and any(
                c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                for c in p["status"].get("conditions") or []
            )
        ]
        assert in_flight or not marked, f"pods {marked} run on marked DisruptionTarget by no preemption"
        for act in self.api.acts:
            told, after = TOLD[act.what]
            names = {act.gang, act.gang.removeprefix("pg-").removeprefix("wpg-"), act.pod}
            assert any(
                (seq > act.seq or not after) and name in names and reason in told
                for seq, name, reason in self.api.event_log
            ), f"the {act.what} of pod {act.pod} ({act.gang}) was never told by an Event"
        now = self.clock.time()
        for spec in self.model.gangs.values():
            gang = spec.gang
            pods = self.api.gang_pods(gang)
            bound = sum(1 for p in pods if p["spec"].get("nodeName"))
            stuck = [
                p
                for p in pods
                if not _gated(p)
                and not p["spec"].get("nodeName")
                and not placed_by_kube_scheduler(p, self.api.delegated, self.api.pinned)
            ]
            admission = self.api.gang_object(gang).get("admission") or {}
            decided = timestamp(admission.get("time"))
            # A leader that took over since counts the timeout from its own first sight of the
            # decision (by the spell's start at the latest, when its watches catch up).
            seen = quiet_since if self.led_since > decided else decided
            timeout = self.api.timeout(gang)
            late = now - decided > timeout + 12 and now - seen > timeout + 5
            # A released pod quorum may not delete (a Job's: it would count as failed) is reported
            # for a person to act on (a grown gang's spare, released before it grew).
            reported = any(name == gang and reason == "StuckPod" for _, name, reason in self.api.event_log)
            assert not (stuck and bound < spec.min_member and late and not reported), (
                f"{gang}: {bound} of {spec.min_member} bound, {len(stuck)} released pods unbound, "
                f"{now - timestamp(admission.get('time')):.0f}s after its decision"
            )
        self.composites_recover_whole(now)

    def composites_recover_whole(self, now: float) -> None:
        """Once a gang of a CompositePodGroup was recovered for its partial placement (a pass or
        more ago), a sibling admitted before that and running whole does not keep running, unless
        minGroupCount of the composite's gangs run whole: it is recovered with it, not left
        holding its nodes. (A sibling short of members, one lost after the recovery, waits for
        its replacement under its member-loss policy, as a gang of no composite does.)"""
        for spec in self.model.gangs.values():
            if not spec.composite or spec.finished:
                continue
            need, siblings = self.api.siblings(spec.gang)
            whole = sum(
                sum(1 for p in self.api.gang_pods(s) if p["spec"].get("nodeName")) >= self.api.min_member(s)
                for s in siblings
            )
            recovered = [
                a.at
                for a in self.api.acts
                if a.reason == "PartiallyPlaced"
                and a.gang in siblings
                and a.gang != spec.gang
                and a.at <= now - 10
            ]
            bound = [
                p["metadata"]["name"] for p in self.api.gang_pods(spec.gang) if p["spec"].get("nodeName")
            ]
            decided = timestamp((self.api.gang_object(spec.gang).get("admission") or {}).get("time"))
            before = [at for at in recovered if decided < at - 1]
            runs = len(bound) >= self.api.min_member(spec.gang)
            assert not (before and runs and whole < need), (
                f"{spec.gang} keeps {bound} bound beside a sibling recovered {now - max(before):.0f}s ago: "
                f"{whole} of minGroupCount {need} gangs of {spec.composite} whole"
            )


async def settle(loop: GangLoop) -> None:
    """Every task of the loop run to its end (bounded: a task that waits forever is a bug)."""
    for _ in range(50):
        if not (loop.work.running or loop.reports):
            return
        await asyncio.gather(*loop.work.running, *loop.reports, return_exceptions=True)
    raise AssertionError("the loop's tasks never ended")


DisruptionMachine.TestCase.settings = settings(
    max_examples=20000 if SOAK else int(os.environ.get("QUORUM_MODEL_EXAMPLES", "400")),
    stateful_step_count=80 if SOAK else 50,
    derandomize=not SOAK,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
test_quorum_never_deletes_work_that_was_fine = DisruptionMachine.TestCase


def composite_left_partially_placed(machine: DisruptionMachine) -> None:
    """A composite of a launcher and two workers, released whole; one worker's node is cordoned
    before it binds, and its timeout passes."""
    machine.a_composite_arrives(sizes=(1, 2), gpu=8, min_groups=2)
    machine.api.deliver_all()
    machine.a_pass()
    machine.tasks_run_to_the_end()
    target = machine.api.pinned["c0-workers-1"]
    machine.a_node_is_cordoned(i=int(str(target)[1:]))
    machine.kube_scheduler_binds()
    machine.time_passes(seconds=WAS_TIMEOUT + 1)


def test_a_composite_is_recovered_whole_and_admitted_again_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)  # outside hypothesis's run
    machine = DisruptionMachine()
    try:
        composite_left_partially_placed(machine)
        machine.a_quiet_spell()
        machine.a_quiet_spell()
        acts = {(a.pod, a.reason) for a in machine.api.acts}
        assert acts == {
            ("c0-workers-0", "PartiallyPlaced"),
            ("c0-workers-1", "PartiallyPlaced"),
            ("c0-launcher-0", "CompositePartiallyPlaced"),
        }
        bound = sorted(
            p["metadata"]["name"] for p in machine.api.server.pods.values() if p["spec"].get("nodeName")
        )
        assert bound == ["c0-launcher-1", "c0-workers-2", "c0-workers-3"], "admitted again, whole"
    finally:
        machine.teardown()


def test_the_model_sees_a_composite_recovered_gang_by_gang(monkeypatch: pytest.MonkeyPatch) -> None:
    """The invariant can fail: with a composite's siblings never taken along (issue 38's third
    scene), the quiet spell finds the launcher holding its node beside recovered workers."""
    from quorum.operator.recovery import CompositeState

    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)
    monkeypatch.setattr(CompositeState, "recovers", lambda self, *_: ())
    machine = DisruptionMachine()
    try:
        composite_left_partially_placed(machine)
        machine.a_pass()  # the workers are recovered
        machine.tasks_run_to_the_end()
        for i in range(NODES):  # and find no room to come back to
            machine.a_node_is_cordoned(i)
        with pytest.raises(
            AssertionError, match=r"keeps \['c0-launcher-0'\] bound beside a sibling recovered"
        ):
            machine.a_quiet_spell()
    finally:
        machine.teardown()


def test_a_new_leader_takes_a_sibling_of_a_gang_its_predecessor_recovered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The workers of a composite are recovered for their partial placement; the write that
    records the launcher's recovery with them fails, and the leader fails over. The new leader
    knows of the workers' recovery from their records only: it must still take the launcher,
    admitted before that recovery, rather than leave it holding its node."""
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)
    machine = DisruptionMachine()
    try:
        composite_left_partially_placed(machine)
        machine.api.fail("patch_gang_status_if", when=lambda _ns, name, *_: "launcher" in name)
        machine.a_pass()  # the workers recovered; the launcher's record refused
        machine.tasks_run_to_the_end()
        assert {a.pod for a in machine.api.acts} == {"c0-workers-0", "c0-workers-1"}
        machine.api.heal()
        machine.the_leader_fails_over()
        for i in range(NODES):  # no room for the workers to come back to
            machine.a_node_is_cordoned(i)
        machine.a_quiet_spell()
        assert ("c0-launcher-0", "CompositePartiallyPlaced") in {(a.pod, a.reason) for a in machine.api.acts}
    finally:
        machine.teardown()


def test_a_composite_sibling_that_lost_a_member_after_the_recovery_keeps_its_running_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by `make soak`: composite c1 (minGroupCount 1) ran whole by its workers when its
    launcher missed its node and was recovered, so the workers stayed. A node failure then took
    one of the workers' two pods and left no room for its replacement. The surviving pod runs and
    waits for its replacement under the member-loss policy (Replace), as a gang of no composite
    does: no rule of the docs deletes it, and the model no longer asked for it."""
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)
    machine = DisruptionMachine()
    try:
        machine.a_first_gang(size=2, gpu=4, extra=1, restart=False, job=False)
        machine.a_composite_arrives(gpu=8, min_groups=1, sizes=(1, 2))
        machine.the_leader_fails_over(lingers=False, relisted=frozenset(["pods"]))
        machine.a_pass()
        machine.a_pass()
        machine.a_gang_finishes(data=Chosen(lambda g: g.name == "g0"))
        machine.a_composite_arrives(gpu=4, min_groups=1, sizes=(1, 1))
        for _ in range(4):
            machine.a_pass()
        machine.a_composites_pod_misses_its_node(
            data=Chosen(lambda p: p["metadata"]["name"] == "c1-launcher-0")
        )
        machine.a_node_fails(i=0)  # c1-workers-0 goes with it
        machine.a_quiet_spell()
        assert [(a.pod, a.reason) for a in machine.api.acts] == [("c1-launcher-0", "PartiallyPlaced")]
        assert machine.api.server.pods["c1-workers-1"]["spec"].get("nodeName") == "n1", "kept running"
    finally:
        machine.teardown()


def test_a_suspended_jobs_released_pod_keeps_its_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the model: a partly placed gang's Job is suspended while one of its released pods
    is still unbound. kube-scheduler may bind that pod until the Job controller deletes it, so
    its room stays promised; releasing another gang onto it was an overcommit."""
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)  # outside hypothesis's run
    machine = DisruptionMachine()
    try:
        machine.a_first_gang(size=1, extra=0, gpu=2, restart=False, job=False)
        machine.a_quiet_spell()
        machine.a_node_fails(i=0)  # g0's pod goes; its ReplicaSet makes another, gated
        machine.a_gang_arrives(size=4, extra=0, gpu=2, priority=0, restart=False, job=True)
        machine.a_release_is_cut_off_by_a_failover(failing=1, i=0)  # g1: 3 of 4 bound on n1
        machine.controllers_act()
        machine.time_passes(seconds=TIMEOUT + 5)
        machine.a_pass()  # g1 partly placed: its Job suspended, g1-0 still released to n1
        machine.a_pass()  # g0's new pod is planned
        machine.quorum_disrupts_only_by_the_rule()
        machine.a_quiet_spell()
        assert machine.api.acts, "the scenario no longer reaches a suspension"
    finally:
        machine.teardown()


class Picks:
    """Stands in for hypothesis's `data` in a replayed case: draws the pod of the given name
    (None: the first element)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name

    def draw(self, strategy: Any) -> Any:
        return next(p for p in strategy.elements if self.name in (None, p["metadata"]["name"]))


def test_a_new_leader_keeps_the_room_of_a_released_pod_a_later_decision_left_unrecorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the model (random seeds): g0-0 is released to n3 and never binds; replacements
    are released alone, each decision's record naming only its own pods; after a failover the
    new leader rebuilt its ledger from the records alone, forgot g0-0's room on n3 and released
    another pod there. The pod's own pin is read back now."""
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)
    machine = DisruptionMachine()
    try:
        machine.a_first_gang(size=3, extra=2, gpu=4, restart=False, job=False)
        machine.a_node_fails(i=1)
        machine.a_release_is_cut_off_by_a_failover(failing=1, i=0)  # g0-0 released to n3, unbound
        pinned = machine.api.server.pods["g0-0"]
        assert not pinned["spec"].get("nodeName") and machine.api.pinned["g0-0"] == "n3"
        machine.a_member_is_replaced_while_the_gang_watch_lags(Picks("g0-1"))
        machine.a_member_is_replaced_while_the_gang_watch_lags(Picks("g0-2"))
        machine.the_leader_fails_over()
        machine.a_pass()
        machine.a_pass()
        machine.quorum_disrupts_only_by_the_rule()
        machine.a_quiet_spell()
    finally:
        machine.teardown()


def test_a_cleared_decision_the_watch_shows_an_older_copy_of_is_not_done_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the model (random seeds): a recovery recorded, carried out (the Job suspended,
    then resumed) and cleared; the lagging Gang watch then delivered the copies from before and
    during the record. The copy from before showed the decision cleared, as written, so it was
    taken for shown; the next copy showed it recorded, and the Job was suspended again with no
    decision on record. A write now counts as shown only from its own resourceVersion on."""
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)
    machine = DisruptionMachine()
    try:
        machine.a_first_gang(size=1, extra=0, gpu=2, restart=False, job=True)
        machine.a_member_is_replaced_while_the_gang_watch_lags(Picks())
        machine.time_passes(seconds=15)
        machine.a_pass()
        machine.a_pass()  # partly placed: recorded, Job suspended, record cleared
        machine.a_member_is_replaced_while_the_gang_watch_lags(Picks())  # Job resumed
        assert not machine.api.jobs[(NS, "job-g0")]["spec"].get("suspend")
        machine.a_watch_delivers(kind="gangs", n=3)
        machine.a_pass()
        machine.every_suspended_job_is_recorded()
        machine.quorum_disrupts_only_by_the_rule()
    finally:
        machine.teardown()


def test_a_suspension_its_leader_could_not_tell_is_undone_when_the_gang_runs_after_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the model (random seed 17): a recovery suspends a Job and its leader is cut off
    before the Event; meanwhile the gang's pod binds. The next leader's last look finds the gang
    whole and withdraws the decision: the Job must be resumed before its controller deletes the
    running pod, and the withdrawal must say so."""
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)
    machine = DisruptionMachine()
    try:
        machine.a_first_gang(size=1, extra=0, gpu=2, restart=False, job=True)
        machine.a_foreign_pod_lands(i=0)
        machine.a_gang_arrives(size=1, extra=0, gpu=2, priority=0, restart=False, job=False)
        machine.tasks_run_a_little(n=1)
        machine.a_pass()
        machine.a_quiet_spell()
        machine.a_gang_arrives(size=3, extra=0, gpu=8, priority=0, restart=False, job=False)
        machine.a_member_is_replaced_while_the_gang_watch_lags(Picks("g0-0"))
        machine.time_passes(seconds=TIMEOUT + 5)
        machine.api.fail(  # its leader is cut off before the Event
            "post_event", times=1, when=lambda obj, reason, *_: reason == "PartiallyPlaced"
        )
        machine.a_pass()  # partly placed: recorded, Job suspended, the Event not posted
        machine.tasks_run_to_the_end()
        assert machine.api.jobs[(NS, "job-g0")]["spec"].get("suspend")
        machine.kube_scheduler_binds()  # its pod binds before the Job controller acts
        (running,) = [p["metadata"]["uid"] for p in machine.api.gang_pods("pg-g0")]
        machine.the_leader_fails_over()
        machine.api.deliver_all()
        machine.a_pass()
        machine.tasks_run_to_the_end()
        assert not machine.api.jobs[(NS, "job-g0")]["spec"].get("suspend"), "resumed"
        machine.controllers_act()
        assert [p["metadata"]["uid"] for p in machine.api.gang_pods("pg-g0")] == [running], "kept"
        told = [r for _, name, r in machine.api.event_log if name == "pg-g0" and r == "RecoveryWithdrawn"]
        assert told and not machine.api.suspended_jobs_recorded("pg-g0")
        machine.a_quiet_spell()
    finally:
        machine.teardown()


def replay(monkeypatch: pytest.MonkeyPatch) -> DisruptionMachine:
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)  # outside hypothesis's run
    return DisruptionMachine()


def decision_of(gangs: dict[tuple[str, str], JSON], gang: str) -> int:
    return int(((gangs[(NS, gang)].get("status") or {}).get("admission") or {}).get("attempt") or 0)


@pytest.mark.parametrize("extra", [0, 1], ids=["partial-placement", "stuck-pod"])
def test_a_new_leader_whose_gang_watch_lags_does_not_delete_a_running_gang(
    monkeypatch: pytest.MonkeyPatch, extra: int
) -> None:
    """Issue 38, 1: a gang has run for an hour under decision 1; a member is evicted and its
    replacement released as decision 2, recorded; the leader dies. The standby's pod watch shows
    the replacement released, its Gang watch still decision 1. It read "decision 1 is an hour
    old, 1 of 2 bound" and deleted both pods, the running one too (`partial-placement`); or, a
    gang running at minMember, "the replacement released an hour ago never bound" and deleted
    the pod released seconds ago (`stuck-pod`)."""
    machine = replay(monkeypatch)
    try:
        machine.a_first_gang(size=2 - extra, extra=extra, gpu=2, restart=False, job=False)
        machine.a_quiet_spell()
        assert len([p for p in machine.api.gang_pods("pg-g0") if p["spec"].get("nodeName")]) == 2
        machine.time_passes(seconds=3600)
        machine.a_member_is_replaced_while_the_gang_watch_lags(Picks("g0-1"))
        assert decision_of(machine.api.server.gangs, "pg-g0") == 2
        assert decision_of(machine.loop.store.gangs, "pg-g0") == 1, "the Gang watch lags"
        survivor = machine.api.server.pods["g0-0"]
        machine.the_leader_fails_over(relisted=frozenset({"pods", "nodes"}), lingers=False)
        machine.time_passes(seconds=15)
        for _ in range(3):
            machine.a_pass()
            machine.tasks_run_to_the_end()
        machine.quorum_disrupts_only_by_the_rule()
        assert machine.api.called("delete_pod") == [], "nothing deleted"
        assert machine.api.server.pods["g0-0"] is survivor, "the running member untouched"
        machine.a_quiet_spell()
    finally:
        machine.teardown()


def test_a_new_leader_that_does_not_see_a_preemption_in_flight_does_not_preempt_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 38, 2: a preemption is in flight (recorded, nodes tainted, victims deleted); the
    new leader's Gang watch lacks the record. It took the reservation taints for strays, held
    the preemptor and preempted again: a second lower-priority gang deleted for nothing."""
    machine = replay(monkeypatch)
    try:
        machine.a_first_gang(size=2, extra=0, gpu=8, restart=False, job=False)  # n0, n1 full
        machine.a_gang_arrives(size=2, extra=0, gpu=8, priority=0, restart=False, job=False)
        machine.a_quiet_spell()  # g1 on n2, n3
        machine.a_gang_arrives(size=2, extra=0, gpu=8, priority=100, restart=False, job=False)
        machine.api.deliver_all()
        machine.a_pass()  # g2 held: it preempts one of them
        machine.tasks_run_to_the_end()
        assert machine.api.victims_deleted, "the scenario no longer preempts"
        taken = {p.split("-")[0] for p in machine.api.victims_deleted}
        (left,) = {"g0", "g1"} - taken
        machine.the_leader_fails_over(relisted=frozenset({"pods", "nodes"}), lingers=False)
        assert not (machine.loop.store.gangs[(NS, "pg-g2")].get("status") or {}).get("preemption")
        for _ in range(3):
            machine.a_pass()
            machine.tasks_run_to_the_end()
        machine.quorum_disrupts_only_by_the_rule()
        assert not [u for u in machine.api.victims_deleted if u.startswith(left)], f"{left} preempted too"
        machine.a_quiet_spell()
        bound = [p for p in machine.api.gang_pods("pg-g2") if p["spec"].get("nodeName")]
        assert len(bound) == 2, "the preemptor runs on the nodes reserved for it"
    finally:
        machine.teardown()


def test_a_victim_that_cannot_be_marked_withdraws_the_preemption_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 38, 4: one 500 on one victim's DisruptionTarget mark stopped the preemption half-way
    for good: no victim deleted, the running victims left marked (a Job's podFailurePolicy then
    misreads a real failure) and recorded `preempted` (which turns off their RestartGang)."""
    machine = replay(monkeypatch)
    try:
        machine.a_first_gang(size=2, extra=0, gpu=8, restart=True, job=False)
        machine.a_quiet_spell()
        machine.a_gang_arrives(size=2, extra=0, gpu=8, priority=100, restart=False, job=False)
        machine.a_gang_arrives(size=2, extra=0, gpu=8, priority=100, restart=False, job=False)
        machine.api.deliver_all()
        machine.api.fail(
            "mark_disruption_target", times=1, when=lambda pod, *_: pod["metadata"]["name"] == "g0-1"
        )
        machine.a_pass()
        machine.tasks_run_to_the_end()
        assert machine.api.called("mark_disruption_target"), "the scenario no longer preempts"
        assert machine.api.victims_deleted == []
        for name in ("g0-0", "g0-1"):
            conditions = machine.api.server.pods[name]["status"].get("conditions") or []
            assert all(c["status"] == "False" for c in conditions if c["type"] == "DisruptionTarget"), name
        assert not machine.api.gang_object("pg-g0").get("preempted"), "its record put back"
        assert "PreemptionWithdrawn" in machine.api.reasons("pg-g0")
        assert not any((g.get("status") or {}).get("preemption") for g in machine.api.server.gangs.values())
        machine.a_quiet_spell()
    finally:
        machine.teardown()


def test_a_new_leader_whose_pod_watch_lags_does_not_promise_a_node_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the model once a failover kept the standby's own watches: its pod watch had not
    shown pods the old leader released, so it released another gang's pod onto a node already
    promised in full. A new leader now plans nothing until its watches show what the apiserver
    listed at its takeover (`GangLoop.take_over`)."""
    machine = replay(monkeypatch)
    try:
        machine.a_first_gang(size=1, extra=2, gpu=2, restart=False, job=False)
        machine.a_gang_arrives(size=1, extra=1, gpu=2, priority=0, restart=False, job=False)
        machine.a_foreign_pod_lands(i=0)
        machine.a_quiet_spell()
        machine.a_gang_arrives(size=2, extra=1, gpu=2, priority=0, restart=False, job=False)
        machine.a_release_is_cut_off_by_a_failover(failing=1, i=1)
        machine.the_leader_fails_over(relisted=frozenset(), lingers=False)
        assert machine.loop.catch_up is not None and machine.loop.catch_up.behind(machine.loop.store)
        machine.a_member_is_replaced_while_the_gang_watch_lags(Picks("g0-0"))
        machine.quorum_disrupts_only_by_the_rule()
        machine.a_quiet_spell()
    finally:
        machine.teardown()


class Chosen:
    """Stands in for hypothesis's `data` in a replayed case: draws the first element for which
    `pick` holds."""

    def __init__(self, pick: Callable[[Any], bool] = lambda _: True) -> None:
        self.pick = pick

    def draw(self, strategy: Any) -> Any:
        return next(e for e in strategy.elements if self.pick(e))


def test_a_withdrawn_recovery_leaves_the_gang_recoverable_a_timeout_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by `make soak`: a recovery withdrawn (minMember bound at the last look) counted its
    attempt as recovered, so when the gang later fell below minMember with a released pod that
    never bound (a foreign pod took its node), nothing recovered it, ever, and nothing said so."""
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)
    machine = DisruptionMachine()
    try:
        machine.a_first_gang(size=2, extra=1, gpu=8, restart=False, job=False)
        machine.a_release_is_cut_off_by_a_failover(failing=2, i=3)
        machine.a_pass()
        machine.a_pass()
        machine.a_foreign_pod_lands(i=0)
        machine.kube_scheduler_binds()
        machine.time_passes(seconds=15)
        machine.a_pass()
        machine.a_pass()
        machine.a_node_fails(i=1)
        machine.a_quiet_spell()
        told = [reason for _, name, reason in machine.api.event_log if name == "pg-g0"]
        assert "RecoveryWithdrawn" in told and told.index("RecoveryWithdrawn") < told.index("PartiallyPlaced")
    finally:
        machine.teardown()


def test_a_group_shrunk_while_its_recovery_is_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by `make soak`: the tenant shrinks minMember from 2 to 1 between quorum's fresh read
    (1 of 2 bound) and its suspension of the Job; quorum decides by the size its Gang records."""
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)
    machine = DisruptionMachine()
    try:
        machine.a_first_gang(size=2, job=True, gpu=8, extra=0, restart=False)
        machine.a_release_is_cut_off_by_a_failover(failing=2, i=3)
        machine.the_deposed_leader_stops()
        machine.a_foreign_pod_lands(i=1)
        machine.a_node_is_cordoned(i=3)
        machine.a_member_is_replaced_while_the_gang_watch_lags(cast(st.DataObject, Chosen()))
        machine.someone_evicts_a_member(cast(st.DataObject, Chosen()))
        machine.a_gang_arrives(extra=1, gpu=4, job=True, priority=0, restart=False, size=2)
        machine.a_pass()
        machine.kube_scheduler_binds()
        machine.a_gang_arrives(extra=0, gpu=8, job=False, priority=100, restart=False, size=4)
        machine.a_gang_finishes(cast(st.DataObject, Chosen(lambda g: g.name == "g2")))
        machine.time_passes(seconds=11)
        machine.a_pass()
        machine.the_deposed_leader_stops()
        machine.its_group_is_resized(cast(st.DataObject, Chosen(lambda g: g.name == "g0")), change=-1)
        machine.a_release_is_cut_off_by_a_failover(failing=2, i=0)
        machine.quorum_disrupts_only_by_the_rule()
        assert any(a.what == "suspension" for a in machine.api.acts), (
            "the scenario still reaches the suspension"
        )
    finally:
        machine.teardown()


def test_a_standby_keeps_the_room_of_a_suspended_jobs_released_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by `make soak`: the model's standby took over the old leader's store with that
    leader's own assumption in it (a pod of a Job it suspended, marked terminating until the
    watch shows it), which no watch of the standby delivered; so the new leader did not keep the
    room of that released pod, which kube-scheduler may still bind, and promised it twice."""
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)
    machine = DisruptionMachine()
    try:
        machine.a_first_gang(size=1, extra=0, gpu=2, restart=False, job=True)
        machine.a_foreign_pod_lands(i=1)
        machine.a_release_is_cut_off_by_a_failover(failing=1, i=0)
        machine.a_composite_arrives(gpu=8, min_groups=1, sizes=(1, 1))
        machine.time_passes(seconds=15)
        machine.a_member_is_replaced_while_the_gang_watch_lags(cast(st.DataObject, Chosen()))
        machine.the_leader_fails_over(lingers=False, relisted=frozenset(["gangs"]))
        machine.a_pass()
        machine.a_pass()
        machine.quorum_disrupts_only_by_the_rule()
    finally:
        machine.teardown()
