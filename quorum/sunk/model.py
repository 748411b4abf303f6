"""What the SUNK scheduler decides, as pure functions over plain pods and jobs.

- `validate()`: is a pod schedulable through Slurm at all (annotations passable to Slurm,
  non-zero CPU and memory requests, the grace-period rule)? Errors name the field and the fix.
- `placeholder()`: the one Slurm submission for a pod or a whole gang. Pods of one shape are the
  tasks of one job component; a gang of several shapes is a heterogeneous job (Slurm 22.05 gives
  each component nodes of its own), so Slurm places the gang all or nothing.
- `assign()`: which pod goes to which node of an allocation.
- `ended()`: why a job that is no longer running ended, in words for an Event.
- `allowance_of()`, `not_allowed()`: which partitions, accounts, QOS and reservations a
  namespace's pods may name (the platform's allow-list), and what a pod asks beyond it.
- `stop_refusal()`, `bound_by()`: whether a `/hooks/stop` call is one Slurm's SIGTERM made, and
  which pods it may delete.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from quorum.core.conditions import GangState, Waiting, compose, keep_transition_times
from quorum.core.gangs import name_now
from quorum.core.requests import pod_requests
from quorum.core.times import timestamp

PREFIX = "sunk.coreweave.com/"
PARTITION = PREFIX + "partition"
ACCOUNT = PREFIX + "account"
QOS = PREFIX + "qos"
TIME_LIMIT = PREFIX + "timelimit"  # minutes, or Slurm's [days-]hours:minutes:seconds forms
EXCLUSIVE = PREFIX + "exclusive"  # none (whole node) | user | ok (share)
NODES = PREFIX + "nodes"  # Slurm node names the pod may use, comma-separated
COMMENT = PREFIX + "comment"
RESERVATION = PREFIX + "reservation"
ANNOTATIONS = (PARTITION, ACCOUNT, QOS, TIME_LIMIT, EXCLUSIVE, NODES, COMMENT, RESERVATION)
JOB_ID = PREFIX + "job-id"  # on a pod the scheduler bound: its placeholder job (set by the Binding)
LOCK = PREFIX + "lock"  # the taint key; also the node annotation with the lock state
LOCK_STATES = ("false", "pending", "locked", "locked_strict")
ACCELERATOR = PREFIX + "accelerator"
GPU = "nvidia.com/gpu"
MARKER = "quorum-sunk"  # first word of every placeholder job's comment
STARTED = ": started"  # what the placeholder script appends to the comment when it runs

# Values Slurm's parser accepts: names of partitions, accounts, QOS and reservations.
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_NODE_LIST = re.compile(r"^[A-Za-z0-9_.\-]{1,253}(,[A-Za-z0-9_.\-]{1,253}){0,255}$")
_TIME = re.compile(r"^(?:(\d{1,4})-)?(\d{1,5})(?::(\d{1,2}))?(?::(\d{1,2}))?$")
_MAX_COMMENT = 512
MAX_GANG_PODS = 4096


class InvalidPod(ValueError):
    """The pod cannot be passed to Slurm; the message says what is wrong and how to fix it."""


@dataclass(frozen=True)
class Shape:
    """What one pod asks Slurm for."""

    cpus: int
    memory_mib: int
    gpus: int


@dataclass(frozen=True)
class Options:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit_minutes: int | None = None
    exclusive: str | None = None
    nodes: tuple[str, ...] = ()
    comment: str | None = None
    reservation: str | None = None


@dataclass(frozen=True)
class PodRequest:
    """A validated pod: who it is, its shape, its Slurm options."""

    namespace: str
    name: str
    uid: str
    shape: Shape
    options: Options


def _requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """Effective requests in whole units (cores, bytes, GPUs), as kube-scheduler counts them:
    the one rule of `quorum.core.requests` (requests defaulted from limits, sidecars, init
    containers, overhead)."""
    return {key: milli / 1000 for key, milli in pod_requests(dict(pod)).items() if key != "pods"}


def time_limit_minutes(text: str) -> int:
    """Slurm's time forms: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:min[:s]]."""
    m = _TIME.match(text.strip())
    if not m:
        raise ValueError(text)
    days, a, b, c = m.groups()
    if days is not None:
        minutes = int(days) * 1440 + int(a) * 60 + int(b or 0) + (1 if int(c or 0) else 0)
    elif c is not None:
        minutes = int(a) * 60 + int(b) + (1 if int(c) else 0)
    elif b is not None:
        minutes = int(a) + (1 if int(b) else 0)
    else:
        minutes = int(a)
    if minutes <= 0:
        raise ValueError(text)
    return minutes


def validate(pod: Mapping[str, Any], kill_wait_seconds: int) -> PodRequest:
    """The pod as Slurm will see it, or InvalidPod with every problem found."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    problems: list[str] = []
    try:
        requests = _requests(pod)
    except (ValueError, TypeError, ArithmeticError) as err:
        raise InvalidPod(f"a resource request is not a Kubernetes quantity ({err})") from None
    cpu, memory, gpus = requests.get("cpu", 0.0), requests.get("memory", 0.0), requests.get(GPU, 0.0)
    if not cpu > 0:
        problems.append("the pod requests no CPU: set resources.requests.cpu on its containers")
    if not memory > 0:
        problems.append("the pod requests no memory: set resources.requests.memory on its containers")
    if gpus != int(gpus) or gpus < 0:
        problems.append(f"{GPU} must be a whole number of GPUs, not {gpus:g}")
    for value in (cpu, memory, gpus):
        if not math.isfinite(value) or value > 1e15:
            problems.append("a resource request is out of range")
            break
    grace = spec.get("terminationGracePeriodSeconds", 30)
    limit = kill_wait_seconds - 5
    if isinstance(grace, bool) or not isinstance(grace, int) or grace >= limit:
        problems.append(
            f"terminationGracePeriodSeconds is {grace} (30 if unset); it must be below {limit} "
            f"(Slurm's KillWait of {kill_wait_seconds}s minus 5s), so that the pod is gone before "
            "Slurm kills its job: set it to at most " + str(max(limit - 1, 0))
        )
    options = _options(annotations, problems)
    if problems:
        raise InvalidPod("; ".join(problems))
    shape = Shape(
        cpus=max(1, math.ceil(cpu - 1e-9)),
        memory_mib=max(1, math.ceil(memory / 2**20)),
        gpus=int(gpus),
    )
    return PodRequest(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""), shape, options)


def _options(annotations: Mapping[str, Any], problems: list[str]) -> Options:
    def text(key: str) -> str | None:
        value = annotations.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            problems.append(f"annotation {key} is empty")
            return None
        return value.strip()

    def name(key: str) -> str | None:
        value = text(key)
        if value is not None and not _NAME.match(value):
            problems.append(f"annotation {key}={value[:80]!r} is not a Slurm name (letters, digits, _ . -)")
            return None
        return value

    limit = None
    if (raw := text(TIME_LIMIT)) is not None:
        try:
            limit = time_limit_minutes(raw)
        except ValueError:
            problems.append(
                f"annotation {TIME_LIMIT}={raw[:80]!r} is not a Slurm time limit "
                "(minutes, or [days-]hours:minutes:seconds)"
            )
    exclusive = text(EXCLUSIVE)
    if exclusive is not None and exclusive not in ("none", "user", "ok"):
        problems.append(f"annotation {EXCLUSIVE}={exclusive[:80]!r} must be none, user or ok")
        exclusive = None
    nodes: tuple[str, ...] = ()
    if (raw := text(NODES)) is not None:
        if _NODE_LIST.match(raw):
            nodes = tuple(raw.split(","))
        else:
            problems.append(f"annotation {NODES} must be Slurm node names separated by commas")
    comment = text(COMMENT)
    if comment is not None and (len(comment) > _MAX_COMMENT or not comment.isprintable()):
        problems.append(f"annotation {COMMENT} must be printable and at most {_MAX_COMMENT} characters")
        comment = None
    elif comment is not None and STARTED in comment:
        # The placeholder script marks its start by appending this: a comment that carries it
        # would have the pod bound before the prolog locked the node.
        problems.append(f"annotation {COMMENT} may not contain {STARTED!r}: remove it")
        comment = None
    return Options(
        partition=name(PARTITION),
        account=name(ACCOUNT),
        qos=name(QOS),
        time_limit_minutes=limit,
        exclusive=exclusive,
        nodes=nodes,
        comment=comment,
        reservation=name(RESERVATION),
    )


# -- what a namespace may ask of Slurm -----------------------------------------------------------

ANY_NAMESPACE = "*"


@dataclass(frozen=True)
class Allowance:
    """The Slurm names one namespace's pods may ask for (the platform's allow-list). A pod that
    names none of a kind gets Slurm's default, which is always allowed; an empty set allows only
    that."""

    partitions: frozenset[str] = field(default_factory=frozenset)
    accounts: frozenset[str] = field(default_factory=frozenset)
    qos: frozenset[str] = field(default_factory=frozenset)
    reservations: frozenset[str] = field(default_factory=frozenset)


NOTHING = Allowance()
# (annotation, Options field, Allowance field, words): the four names the allow-list covers.
_ALLOWED_KINDS = (
    (PARTITION, "partition", "partitions", "partitions"),
    (ACCOUNT, "account", "accounts", "accounts"),
    (QOS, "qos", "qos", "QOS"),
    (RESERVATION, "reservation", "reservations", "reservations"),
)


def allowance_of(namespace: str, table: Mapping[str, Allowance]) -> Allowance:
    """What `namespace` may use: its own entry, else the `*` entry, else only Slurm's defaults
    (an entry of its own replaces `*`, it does not add to it)."""
    found = table.get(namespace)
    if found is None:
        found = table.get(ANY_NAMESPACE)
    return NOTHING if found is None else found


@dataclass(frozen=True)
class NotAllowed:
    annotation: str
    value: str
    allowed: frozenset[str]
    words: str  # "partitions", "accounts", ...


def not_allowed(options: Options, allowance: Allowance) -> tuple[NotAllowed, ...]:
    """Each Slurm name the pod asks for that its namespace may not use (empty: allowed)."""
    found = []
    for annotation, option, allowed_field, words in _ALLOWED_KINDS:
        value = getattr(options, option)
        allowed: frozenset[str] = getattr(allowance, allowed_field)
        if value is not None and value not in allowed:
            found.append(NotAllowed(annotation, value, allowed, words))
    return tuple(found)


def allowance_refusal(pod: PodRequest, allowance: Allowance) -> str | None:
    """Why the pod may not be submitted, in words for its Event: what it asked, what its
    namespace may use, and the fix; None if its namespace may use all it asks for."""
    refused = not_allowed(pod.options, allowance)
    if not refused:
        return None
    asked = ", ".join(f"{r.annotation}={r.value}" for r in refused)
    may = "; ".join(
        f"{r.words} " + (", ".join(sorted(r.allowed)[:20]) if r.allowed else "none but Slurm's default")
        for r in refused
    )
    return (
        f"namespace {pod.namespace} may not use what pod {pod.name} asks of Slurm ({asked}); it may use: "
        f"{may}. Set the annotation to an allowed value, or remove it for Slurm's default; to be "
        "allowed more, ask the platform (quorum-sunk-scheduler's QUORUM_SUNK_NAMESPACES)"
    )


# -- the placeholder job -------------------------------------------------------------------------


@dataclass(frozen=True)
class Component:
    """Pods of one shape and options: the tasks of one job (or of one hetjob component)."""

    shape: Shape
    options: Options
    pods: tuple[PodRequest, ...]


@dataclass(frozen=True)
class Placeholder:
    """One Slurm submission: for a pod, or for a gang (`gang` = namespace/name)."""

    key: str  # `pod/<ns>/<name>/<uid>` or `gang/<ns>/<name>`: the job's comment names it
    components: tuple[Component, ...]
    gang: str | None = None

    @property
    def pods(self) -> tuple[PodRequest, ...]:
        return tuple(p for c in self.components for p in c.pods)


def plan_placeholder(pods: Sequence[PodRequest], gang: str | None = None) -> Placeholder:
    """The submission for one pod, or for all pods of a gang (grouped by shape and options, in
    the order first seen)."""
    if not pods:
        raise ValueError("a placeholder needs at least one pod")
    if len(pods) > MAX_GANG_PODS:
        raise InvalidPod(f"a gang of {len(pods)} pods is more than {MAX_GANG_PODS} Slurm tasks")
    groups: dict[tuple[Shape, Options], list[PodRequest]] = {}
    for pod in pods:
        groups.setdefault((pod.shape, pod.options), []).append(pod)
    components = tuple(Component(shape, opts, tuple(members)) for (shape, opts), members in groups.items())
    if gang is not None:
        key = f"gang/{gang}"
    else:
        only = pods[0]
        key = f"pod/{only.namespace}/{only.name}/{only.uid}"
    return Placeholder(key, components, gang)


def job_comment(placeholder: Placeholder, user_comment: str | None = None) -> str:
    """The job's comment: how the scheduler finds its pods again after a restart."""
    text = f"{MARKER} {placeholder.key}"
    return f"{text} {user_comment}" if user_comment else text


def key_of_comment(comment: str | None) -> str | None:
    """The placeholder key in a job comment quorum wrote, None for any other job."""
    if not comment or not comment.startswith(MARKER + " "):
        return None
    return comment.removesuffix(STARTED).split(" ", 2)[1]


def job_name(key: str) -> str:
    """What squeue shows: `ns/pod` for a pod's job, `ns/gang` for a gang's."""
    parts = key.split("/")
    return "/".join(parts[1:3])[:128]


def started(comment: str | None) -> bool:
    return bool(comment) and str(comment).endswith(STARTED)


def placeholder_script(hook_url: str) -> str:
    """The batch script: mark the job started, then wait; when Slurm stops the job (cancel,
    preemption, time limit), ask the scheduler to delete the pods and wait until they are gone;
    if they are still there just before KillWait, drain the job's nodes (every component's) with
    a reason. The hook token goes to curl on stdin, never in its argv where `ps` shows it."""
    return f"""#!/bin/bash
# quorum SUNK placeholder: the pods of this job run in Kubernetes, not here.
scontrol update JobId="$SLURM_JOB_ID" Comment="$QUORUM_COMMENT{STARTED}"
stop() {{
  if ! printf 'Authorization: Bearer %s\\n' "$(cat "$QUORUM_HOOK_TOKEN_FILE" 2>/dev/null)" | \\
      curl --silent --fail --max-time "$QUORUM_STOP_SECONDS" --retry 1000 --retry-delay 1 \\
      --retry-all-errors --retry-max-time "$QUORUM_STOP_SECONDS" -H @- -X POST \\
      "{hook_url}/hooks/stop?job=$SLURM_JOB_ID"; then
    nodes=$(squeue --noheader --jobs="$SLURM_JOB_ID" --format=%N 2>/dev/null | paste -sd, -)
    scontrol update NodeName="${{nodes:-$SLURMD_NODENAME}}" State=DRAIN \\
      Reason="quorum: pods of job $SLURM_JOB_ID still running at KillWait"
  fi
  exit 0
}}
trap stop TERM
sleep infinity &
wait $!
"""


def _component_body(component: Component, comment: str, env: Mapping[str, str]) -> dict[str, Any]:
    shape, opts = component.shape, component.options
    tasks = len(component.pods)
    body: dict[str, Any] = {
        "name": job_name(key_of_comment(comment) or "quorum"),
        "comment": comment,
        "tasks": tasks,
        "cpus_per_task": shape.cpus,
        "memory_per_cpu": math.ceil(shape.memory_mib / shape.cpus),
        "environment": dict(env),
        "current_working_directory": "/tmp",
        "standard_output": "/dev/null",
        "standard_error": "/dev/null",
        "requeue": False,
    }
    if shape.gpus:
        body["gpus_per_task"] = str(shape.gpus)
    if opts.partition:
        body["partition"] = opts.partition
    if opts.account:
        body["account"] = opts.account
    if opts.qos:
        body["qos"] = opts.qos
    if opts.reservation:
        body["reservation"] = opts.reservation
    if opts.time_limit_minutes:
        body["time_limit"] = opts.time_limit_minutes
    if opts.exclusive == "none":
        body["exclusive"] = "true"
    elif opts.exclusive == "user":
        body["exclusive"] = "user"
    elif opts.exclusive == "ok":
        body["oversubscribe"] = True
    if opts.nodes:
        # slurmrestd 0.0.38 takes no node list; each node carries a feature named after itself.
        body["constraints"] = "|".join(opts.nodes)
    return body


def submission(
    placeholder: Placeholder,
    hook_url: str,
    stop_seconds: int,
    hook_token_path: str,
) -> dict[str, Any]:
    """The body of `POST /slurm/v0.0.38/job/submit`; `hook_token_path`: the hook API's secret
    on the Slurm nodes (the path only: the job's environment is readable by its user)."""
    first_comment = next((c.options.comment for c in placeholder.components if c.options.comment), None)
    comment = job_comment(placeholder, first_comment)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "QUORUM_COMMENT": comment,
        "QUORUM_STOP_SECONDS": str(stop_seconds),
        "QUORUM_HOOK_TOKEN_FILE": hook_token_path,
    }
    bodies = [_component_body(c, comment, env) for c in placeholder.components]
    script = placeholder_script(hook_url)
    if len(bodies) == 1:
        return {"script": script, "job": bodies[0]}
    return {"script": script, "jobs": bodies}


# -- allocations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeShare:
    """What one node of an allocation gave one job component."""

    node: str
    cpus: int
    gpus: int


def tasks_on(shares: Sequence[NodeShare], shape: Shape) -> list[str]:
    """The node of each task, in order: a node holds as many tasks as its CPUs and GPUs cover."""
    found: list[str] = []
    for share in shares:
        by_cpu = share.cpus // shape.cpus
        by_gpu = share.gpus // shape.gpus if shape.gpus else by_cpu
        found += [share.node] * min(by_cpu, by_gpu)
    return found


def assign(component: Component, shares: Sequence[NodeShare]) -> dict[str, str] | None:
    """{pod uid: node} for a component's pods, None if the allocation does not hold them all."""
    nodes = tasks_on(shares, component.shape)
    if len(nodes) < len(component.pods):
        return None
    return {pod.uid: node for pod, node in zip(component.pods, nodes, strict=False)}


_GRES = re.compile(r"gpu(?::[A-Za-z0-9_\-]+)?:(\d+)")


def gpus_of_gres(detail: str) -> int:
    """GPUs in one `gres_detail` entry, e.g. 'gpu:2(IDX:0-1)' -> 2."""
    m = _GRES.search(detail or "")
    return int(m.group(1)) if m else 0


@dataclass(frozen=True)
class JobEnd:
    reason: str  # Event reason
    message: str


_ENDS = {
    "CANCELLED": ("SlurmJobCancelled", "was cancelled in Slurm"),
    "PREEMPTED": ("SlurmJobPreempted", "was preempted by a higher-priority Slurm job"),
    "TIMEOUT": ("SlurmJobTimeLimit", "reached its time limit"),
    "NODE_FAIL": ("SlurmNodeFailed", "lost a node"),
    "BOOT_FAIL": ("SlurmNodeFailed", "could not boot its node"),
    "FAILED": ("SlurmJobFailed", "failed"),
    "COMPLETED": ("SlurmJobEnded", "ended"),
    "OUT_OF_MEMORY": ("SlurmJobFailed", "ran out of memory"),
    "DEADLINE": ("SlurmJobTimeLimit", "reached its deadline"),
}


def ended(job_id: int, state: str, reason: str | None = None, preempted: bool = False) -> JobEnd:
    """Why the pods of a job that stopped (or is stopping) are deleted, for an Event. While a
    job stops Slurm shows it COMPLETING; a preempted one has its preempt_time set."""
    if preempted:
        state = "PREEMPTED"
    elif state in ("COMPLETING", "RUNNING", "CONFIGURING") and reason in ("TimeLimit", "Deadline"):
        state = "TIMEOUT"
    elif state in ("COMPLETING", "RUNNING", "CONFIGURING"):
        state = "CANCELLED"
    event, words = _ENDS.get(state, ("SlurmJobEnded", f"ended ({state})"))
    extra = f" ({reason})" if reason and reason not in ("None", "") else ""
    return JobEnd(event, f"Slurm job {job_id} {words}{extra}; the pod is deleted with it")


# -- /hooks/stop: only for a job Slurm is ending, only its own pods -------------------------------


class JobView(Protocol):
    """What the stop decision reads of a Slurm job (`quorum.sunk.slurm.Job` is one)."""

    @property
    def job_id(self) -> int: ...
    @property
    def job_state(self) -> str: ...
    @property
    def user_name(self) -> str | None: ...
    @property
    def comment(self) -> str | None: ...
    @property
    def preempt_time(self) -> int | None: ...


def key_of_job(user_name: str | None, comment: str | None, our_user: str) -> str | None:
    """The pod or gang a job stands for: named by its comment, and only in a job of the Slurm user
    quorum submits as (Slurm authenticates the user; any user can write a comment)."""
    if user_name != our_user:
        return None
    return key_of_comment(comment)


def key_now(key: str) -> str:
    """The key a gang's job has today, given one an earlier release may have written: a gang
    named as it was then (quorum.core.gangs.name_now). A name can be both one group's name today
    and another's then, so this is only a fallback for a job that no pod claims."""
    if not key.startswith("gang/"):
        return key
    _, namespace, name = key.split("/", 2)
    return f"gang/{namespace}/{name_now(name)}"


# What Slurm shows for a job whose script got SIGTERM because Slurm is ending it: COMPLETING
# while scancel, a time limit or a preemption (PreemptMode=CANCEL) runs its course, then the end
# state; REQUEUED* while it is requeued. Any other state (RUNNING, PENDING, SUSPENDED, a bare
# signal's SIGNALING, one Slurm adds later) is not a stop.
STOPPING_STATES = frozenset(
    {
        "COMPLETING", "CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL",
        "PREEMPTED", "DEADLINE", "OUT_OF_MEMORY", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
    }
)  # fmt: skip


def stopping(state: str, preempt_time: int | None) -> bool:
    """Slurm is ending the job (or has): a preemption with a GraceTime keeps it RUNNING, with its
    preempt_time set, until the grace ends."""
    return state in STOPPING_STATES or (state == "RUNNING" and bool(preempt_time))


@dataclass(frozen=True)
class StopRefusal:
    status: int  # 404: Slurm knows no such job; 403: not quorum's, or not stopping
    reason: str


def stop_refusal(job_id: int, jobs: Sequence[JobView], our_user: str) -> StopRefusal | None:
    """Why a `/hooks/stop?job=` call is not one a placeholder job's SIGTERM made (`jobs`: what
    Slurm says of the id, every component of a heterogeneous job); None if it is. The shared
    secret alone does not stop a job that runs, nor touch a job that is not quorum's."""
    if not jobs:
        return StopRefusal(404, f"Slurm knows no job {job_id}")
    if not any(key_of_job(j.user_name, j.comment, our_user) for j in jobs):
        users = ", ".join(sorted({j.user_name or "?" for j in jobs}))
        return StopRefusal(
            403,
            f"job {job_id} is not a placeholder job of quorum-sunk-scheduler (its Slurm user is {users}, "
            f"quorum submits as {our_user}, with a comment naming its pods)",
        )
    job = next((j for j in jobs if j.job_id == job_id), jobs[0])
    if not stopping(job.job_state, job.preempt_time):
        return StopRefusal(
            403,
            f"job {job_id} is {job.job_state} in Slurm, not stopping: /hooks/stop is for a placeholder "
            "job Slurm is ending (cancelled, preempted, out of time); its pods stay",
        )
    return None


def goes_with_ended_job(
    pod: Mapping[str, Any], job_id: int, ended_at: float, live: Collection[int] = ()
) -> bool:
    """Whether a pod of the job's pod or gang goes when job `job_id` ended at `ended_at` (Slurm's
    end time, whole seconds); `live`: the key's jobs still alive. A bound pod goes unless its
    Binding recorded a job that is still alive (the annotation is the pod owner's to edit, so a
    record of anything else — another id, none — does not keep a pod on a node Slurm freed). An
    unbound pod goes if it was made in an earlier second: one made in the end's own second cannot
    be told from the next submission's, so it is spared and submitted again."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if spec.get("nodeName"):
        return not _recorded_live(pod, live, job_id)
    return timestamp(meta.get("creationTimestamp")) < ended_at


def _recorded_live(pod: Mapping[str, Any], live: Collection[int], but: int) -> bool:
    recorded = ((pod.get("metadata") or {}).get("annotations") or {}).get(JOB_ID)
    return recorded is not None and recorded.isdigit() and int(recorded) in live and int(recorded) != but


def on_jobs_nodes(pod: Mapping[str, Any], job_id: int, live: Collection[int]) -> bool:
    """A bound pod of the job's key that the stop of job `job_id` must see gone: every bound pod
    of the key, unless its Binding recorded another job that is still alive (a pod bound before
    Bindings recorded the job, or whose record its owner changed, counts)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and not _recorded_live(pod, live, job_id)


def bound_by(pod: Mapping[str, Any], job_id: int) -> bool:
    """The scheduler bound this pod to job `job_id`'s allocation: it is on a node, and its Binding
    recorded the job."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    return bool(spec.get("nodeName")) and (meta.get("annotations") or {}).get(JOB_ID) == str(job_id)


@dataclass
class Counts:
    """What a reconcile pass did (the scheduler's metrics count these)."""

    submitted: int = 0
    bound: int = 0
    deleted: int = 0
    cancelled: int = 0
    invalid: int = 0


# -- gangs: the Gang object of a gang Slurm places -----------------------------------------------


@dataclass(frozen=True)
class SlurmJobFacts:
    job_id: int
    state: str  # Slurm's job_state of its first component
    reason: str | None  # Slurm's state_reason (why a pending job waits: Resources, Priority, ...)
    partition: str | None
    nodes: str | None
    started: bool  # its placeholder script has marked the comment


@dataclass(frozen=True)
class SlurmGangFacts:
    """Everything the status of a gang Slurm places is composed from."""

    min_member: int
    counts: Mapping[str, int]  # members (not finished), bound, running, succeeded, failed
    job: SlurmJobFacts | None  # its live placeholder job, if any
    note: tuple[str, str] | None  # (reason, message) of why it was not submitted, if it was not


def group_min_member(group: Mapping[str, Any], workload_api: bool) -> int | None:
    """A PodGroup's gang size: `spec.minMember` (the scheduling.sigs.k8s.io and x-k8s.io
    PodGroups), or a Kubernetes 1.36 PodGroup's `spec.schedulingPolicy.gang.minCount` (1 under
    the `basic` policy); None if it is not a whole number from 1 to MAX_GANG_PODS."""
    spec = group.get("spec")
    if not isinstance(spec, Mapping):
        return None
    if workload_api:
        policy = spec.get("schedulingPolicy")
        if not isinstance(policy, Mapping) or "gang" not in policy:
            return 1
        gang = policy.get("gang")
        value = gang.get("minCount") if isinstance(gang, Mapping) else None
    else:
        value = spec.get("minMember")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GANG_PODS:
        return None
    return value


def slurm_gang_status(
    facts: SlurmGangFacts, previous: Mapping[str, Any] | None, stamp: str
) -> dict[str, Any]:
    """The Gang status of a gang Slurm places, composed by the operator's rules
    (`conditions.compose`: the same phase, counters and conditions as every gang). Slurm's
    allocation is its admission: its pods count as released once the job runs and its script
    has started; until then Slurm's reason is the hold (`SlurmResources`, no room: Unschedulable),
    and `status.slurm` names the job. A condition keeps its lastTransitionTime while its status
    is unchanged (`previous` is the status written before)."""
    kinds = ("members", "bound", "running", "succeeded", "failed")
    counts = {k: max(0, int(facts.counts.get(k, 0))) for k in kinds}
    job = facts.job
    allocated = job is not None and job.state == "RUNNING" and job.started
    released = counts["members"] if allocated else min(counts["bound"], counts["members"])
    hold: Waiting | None = None
    if released >= max(1, facts.min_member):
        pass  # placed: nothing holds it (as the planner holds no admitted gang)
    elif job is not None and not allocated:
        waits = job.reason if job.reason not in (None, "", "None") else job.state
        no_room = job.state == "PENDING" and job.reason in ("Resources", "ReqNodeNotAvail")
        hold = Waiting(
            "SlurmResources" if no_room else "SlurmPending",
            f"Slurm job {job.job_id} is {job.state} ({waits}) in partition {job.partition}: Slurm places "
            f"all {facts.min_member} pods at once or none of them",
        )
    elif job is None and facts.note is not None:
        hold = Waiting(*facts.note)
    elif job is None and counts["members"] < facts.min_member:
        need = facts.min_member
        hold = Waiting("WaitingForMembers", f"{counts['members']} of {need} members exist (minMember {need})")
    composed = compose(
        GangState(
            counts={**counts, "gated": counts["members"] - released, "released": released},
            min_member=facts.min_member,
            now=0.0,  # no recovery record: nothing of the status depends on the time
            hold=hold,
        )
    )
    before = (previous or {}).get("conditions")
    timed = keep_transition_times(composed.conditions, before if isinstance(before, list) else None, stamp)
    status: dict[str, Any] = {**composed.body, "conditions": timed}
    status["slurm"] = (
        None
        if job is None
        else {
            "jobId": job.job_id,
            "state": job.state,
            "reason": job.reason or "",
            "partition": job.partition or "",
            "nodes": job.nodes or "",
        }
    )
    return status


# -- nodes: the lock and the drain ---------------------------------------------------------------

LOCK_TAINT = {"key": LOCK, "value": "true", "effect": "NoExecute"}
LOCK_TOLERATION = {"key": LOCK, "operator": "Equal", "value": "true", "effect": "NoExecute"}
DRAIN_ANNOTATION = PREFIX + "drain"  # the reason of a drain that came from Slurm
OUR_DRAIN = "quorum: Kubernetes node"  # how the reasons of drains quorum made begin


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def lock_patch(node: Mapping[str, Any], state: str) -> list[dict[str, Any]] | None:
    """The JSON patch that puts a node in lock state `state` (false | pending | locked |
    locked_strict): the NoExecute taint on for every state but false, and the state in the
    node's `sunk.coreweave.com/lock` annotation. None if the node is in that state already."""
    if state not in LOCK_STATES:
        raise ValueError(state)
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    taints = list(spec.get("taints") or [])
    annotations = meta.get("annotations") or {}
    has_taint = any(t.get("key") == LOCK for t in taints)
    want_taint = state != "false"
    if has_taint == want_taint and annotations.get(LOCK, "false") == state:
        return None
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/spec/taints", "value": spec.get("taints")}]
    if want_taint and not has_taint:
        if taints:
            ops.append({"op": "add", "path": "/spec/taints/-", "value": LOCK_TAINT})
        else:
            ops = [{"op": "add", "path": "/spec/taints", "value": [LOCK_TAINT]}]
    elif has_taint and not want_taint:
        kept = [t for t in taints if t.get("key") != LOCK]
        ops.append({"op": "replace", "path": "/spec/taints", "value": kept})
    if not annotations:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {LOCK: state}})
    else:
        ops.append({"op": "add", "path": f"/metadata/annotations/{_escape(LOCK)}", "value": state})
    return ops


def drain_annotation_patch(node: Mapping[str, Any], reason: str) -> list[dict[str, Any]]:
    """The JSON patch that shows Slurm's drain reason on a node (`""` removes it)."""
    key = f"/metadata/annotations/{_escape(DRAIN_ANNOTATION)}"
    if reason == "":
        return [{"op": "remove", "path": key}]
    if not (node.get("metadata") or {}).get("annotations"):
        return [{"op": "add", "path": "/metadata/annotations", "value": {DRAIN_ANNOTATION: reason}}]
    return [{"op": "add", "path": key, "value": reason}]


def tolerates_lock(pod: Mapping[str, Any]) -> bool:
    """Whether a pod tolerates `sunk.coreweave.com/lock=true:NoExecute` (Kubernetes' rules)."""
    for t in (pod.get("spec") or {}).get("tolerations") or []:
        if t.get("effect") not in (None, "", "NoExecute"):
            continue
        op = t.get("operator") or "Equal"
        if op == "Exists" and t.get("key") in (None, "", LOCK):
            return True
        if op == "Equal" and t.get("key") == LOCK and t.get("value") == "true":
            return True
    return False


def drain_reason(node: Mapping[str, Any]) -> str | None:
    """Why a Kubernetes node's Slurm node must be drained (cordoned, not Ready, or not in
    production), None if it may run jobs."""
    spec, meta = node.get("spec") or {}, node.get("metadata") or {}
    state = (meta.get("labels") or {}).get("node.coreweave.cloud/state", "production")
    if spec.get("unschedulable"):
        return f"{OUR_DRAIN} cordoned"
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
    if conditions and ready != "True":
        return f"{OUR_DRAIN} not Ready"
    if state != "production":
        return f"{OUR_DRAIN} in state {state}"
    return None


SLURM_CORDON = "SlurmCordon"  # the node condition of a Slurm node Slurm itself took out (SUNK's)


def drained_in_slurm(slurm_state: str, slurm_flags: Sequence[str]) -> bool:
    """A DRAIN flag, or a state Slurm reports as drain(ing|ed): no new jobs go there."""
    return "DRAIN" in {f.upper() for f in slurm_flags} or slurm_state.lower().startswith("drain")


def taken_out_in_slurm(
    slurm_state: str, slurm_flags: Sequence[str], slurm_reason: str | None
) -> tuple[str, str] | None:
    """(reason, message) when Slurm keeps a node from jobs for a reason of its own: down or
    failed (whatever the reason text: quorum's drain of a node whose Kubernetes node is not Ready
    overwrites Slurm's reason, not its state), or drained by an admin or a health check. None
    when it may run jobs or the only thing keeping it is quorum's drain for its Kubernetes node.
    A bare NOT_RESPONDING flag is not a take-out: Slurm sets it for a moment after every RESUME
    and on a missed ping, and marks the node DOWN itself once SlurmdTimeout passes, so counting
    it would make the condition flap."""
    if slurm_state.lower().startswith(("down", "fail")):
        return "SlurmDown", slurm_reason or "down in Slurm"
    if (slurm_reason or "").startswith(OUR_DRAIN):
        return None
    if drained_in_slurm(slurm_state, slurm_flags):
        return "SlurmDrain", slurm_reason or "drained in Slurm"
    return None


def cordon_condition(
    node: Mapping[str, Any], taken_out: tuple[str, str] | None, now: str
) -> dict[str, Any] | None:
    """The `SlurmCordon` condition the node should get, None if it has it already (or never had
    it and Slurm has not taken the node out)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    current = next((c for c in conditions if isinstance(c, dict) and c.get("type") == SLURM_CORDON), None)
    if current is None and taken_out is None:
        return None
    status = "True" if taken_out else "False"
    reason, message = taken_out or ("SlurmAvailable", "Slurm may run jobs on this node")
    message = message[:1024]
    if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
        status,
        reason,
        message,
    ):
        return None
    kept = current is not None and current.get("status") == status and current.get("lastTransitionTime")
    return {
        "type": SLURM_CORDON,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": kept or now,
    }


@dataclass(frozen=True)
class NodeSync:
    drain: str | None = None  # drain the Slurm node with this reason
    resume: bool = False  # resume it (quorum drained it and the reason has passed)
    annotate: str | None = None  # the Slurm drain reason to show on the Kubernetes node ("" removes)
    condition: dict[str, Any] | None = None  # the node's SlurmCordon condition to write


def sync_node(
    node: Mapping[str, Any],
    slurm_state: str,
    slurm_flags: Sequence[str],
    slurm_reason: str | None,
    now: str = "",
) -> NodeSync:
    """What keeps a Kubernetes node and its Slurm node in step: the Kubernetes side drains and
    resumes Slurm; a node Slurm took out itself (drained by someone else, down) shows on the
    Kubernetes node as an annotation with the reason and the condition `SlurmCordon`, as in SUNK."""
    want = drain_reason(node)
    drained = drained_in_slurm(slurm_state, slurm_flags)
    ours = (slurm_reason or "").startswith(OUR_DRAIN)
    taken_out = taken_out_in_slurm(slurm_state, slurm_flags, slurm_reason)
    condition = cordon_condition(node, taken_out, now)
    shown = ((node.get("metadata") or {}).get("annotations") or {}).get(DRAIN_ANNOTATION)
    if want and not drained:
        return NodeSync(drain=want, condition=condition)
    if want and drained and ours and slurm_reason != want:
        return NodeSync(drain=want, condition=condition)
    if not want and drained and ours:
        return NodeSync(resume=True, condition=condition)
    if taken_out and shown != taken_out[1]:
        return NodeSync(annotate=taken_out[1], condition=condition)
    if not taken_out and shown is not None:
        return NodeSync(annotate="", condition=condition)
    return NodeSync(condition=condition)


_RANGE_PART = re.compile(r"[^,\[]+(?:\[[^\]]*\])?")


def expand_nodelist(nodes: str | None) -> list[str]:
    """Node names of a Slurm node list: 'gpu-[001-003],cpu-1' -> gpu-001, gpu-002, gpu-003, cpu-1."""
    out: list[str] = []
    for part in _RANGE_PART.findall(nodes or ""):
        m = re.fullmatch(r"(.*)\[(.*)\]", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                continue
            out += [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)][:4096]
    return out
