"""quorum-operator's Prometheus metrics.

One registry for the process, `REGISTRY` (the operator is one process; its tests read the same
metrics, so they compare values before and after rather than absolute ones). `quorum.operator.health`
serves it at `/metrics`; docs/metrics.md lists every metric with its meaning and example alerts.

The scheduling loop sets most of them; `api_trace_config()` counts the requests of the
kubernetes-asyncio client (give it to `quorum.k8s.client.api_client(trace_configs=...)`), and
`quorum.operator.health` keeps the leader, cache-synced and event-loop-lag metrics.

Counters have no `<name>_created` series (prometheus_client's process-wide switch, also set by
`quorum.webhooks.metrics`): each counter is one series per label set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import SimpleNamespace

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from yarl import URL

disable_created_metrics()  # type: ignore[no-untyped-call]

REGISTRY = CollectorRegistry()

PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""1 ms .. 30 s: a pass and the planner's part of it."""
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""1 ms .. 5 s: how late the event loop runs a callback."""
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""50 ms .. 10 min: a gang's wait for its release and for its pods to bind."""

RECOVERY_ACTIONS = ("DeletePod", "SuspendJob", "Report", "ResumeJob")
"""The values of quorum_operator_recoveries_total's `action` label."""
FAILURE_STAGES = ("assemble", "plan", "release", "status", "recover", "preempt")
"""The values of quorum_operator_gang_failures_total's `stage` label."""

PASS_DURATION = Histogram(
    "quorum_operator_pass_duration_seconds",
    "Duration of one scheduling pass of the leader (assemble gangs, plan, release, write statuses), "
    "in seconds.",
    buckets=PASS_BUCKETS,
    registry=REGISTRY,
)
PASS_DURATION_MAX = Gauge(
    "quorum_operator_pass_duration_max_seconds",
    "The longest scheduling pass since the process started, in seconds.",
    registry=REGISTRY,
)
PLAN_DURATION = Histogram(
    "quorum_operator_plan_duration_seconds",
    "The planner's part of a scheduling pass (placing the waiting gangs on the nodes), in seconds.",
    buckets=PASS_BUCKETS,
    registry=REGISTRY,
)
EVENT_LOOP_LAG = Histogram(
    "quorum_operator_event_loop_lag_seconds",
    "How late the asyncio event loop woke a sleeper (time past its deadline), in seconds; high "
    "values mean something blocked the loop.",
    buckets=LAG_BUCKETS,
    registry=REGISTRY,
)
EVENT_LOOP_LAG_MAX = Gauge(
    "quorum_operator_event_loop_lag_max_seconds",
    "The worst event loop lag seen since the process started, in seconds.",
    registry=REGISTRY,
)
GC_PAUSE = Histogram(
    "quorum_operator_gc_pause_seconds",
    "How long one collection of Python's cyclic garbage collector stopped the process (every "
    "thread, the event loop included), by generation (2: a full collection, whose time grows with "
    "everything the operator holds), in seconds.",
    ("generation",),
    buckets=LAG_BUCKETS,
    registry=REGISTRY,
)
GANGS = Gauge(
    "quorum_operator_gangs",
    "Gangs the leader knows, by phase (Pending, Scheduling, Running, Finished, Failed) and by the "
    "reason of their Admitted condition (Released, Pending, Unschedulable, Backoff, ...); a count.",
    ("phase", "reason"),
    registry=REGISTRY,
)
GATED_PODS = Gauge(
    "quorum_operator_gated_pods",
    "Gang pods held at quorum's scheduling gate (not released yet); a count.",
    registry=REGISTRY,
)
STARVATION_HELD_NODES = Gauge(
    "quorum_operator_starvation_held_nodes",
    "Nodes the starvation guard holds for a starving gang after the last pass (gangs behind it use "
    "only what it cannot); a count.",
    registry=REGISTRY,
)
STARVATION_RESTING_TENANTS = Gauge(
    "quorum_operator_starvation_resting_tenants",
    "Tenants whose starving gangs hold nothing now: the room held for them did not grow for "
    "starvation_idle_seconds; a count.",
    registry=REGISTRY,
)
RELEASE_LATENCY = Histogram(
    "quorum_operator_release_latency_seconds",
    "Time from the creation of the last member a gang needed (its minMember-th pod) to the gang's "
    "release, in seconds.",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
BOUND_LATENCY = Histogram(
    "quorum_operator_bound_latency_seconds",
    "Time from the creation of the last member a gang needed to minMember of its pods bound to "
    "nodes, in seconds.",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
RELEASES = Counter(
    "quorum_operator_releases_total",
    "Gangs released (admitted whole: their gates removed); a count.",
    registry=REGISTRY,
)
PODS_RELEASED = Counter(
    "quorum_operator_pods_released_total",
    "Pods released from quorum's scheduling gate, in gangs or alone (members beyond minMember, "
    "replacements); a count.",
    registry=REGISTRY,
)
PARTIAL_PLACEMENTS = Counter(
    "quorum_operator_partial_placements_total",
    "Gangs found partially placed: scheduleTimeoutSeconds after the release, fewer than minMember "
    "pods bound and a released pod unbound; a count.",
    registry=REGISTRY,
)
GANG_RESTARTS = Counter(
    "quorum_operator_gang_restarts_total",
    "Running gangs that lost members below minMember and were restarted whole (member-loss policy "
    "RestartGang); a count.",
    registry=REGISTRY,
)
RECOVERIES = Counter(
    "quorum_operator_recoveries_total",
    "Recovery steps taken for partially placed gangs, by action (DeletePod, SuspendJob, Report, "
    "ResumeJob); a count.",
    ("action",),
    registry=REGISTRY,
)
GANG_FAILURES = Counter(
    "quorum_operator_gang_failures_total",
    "A gang's work that raised an exception and was isolated (the other gangs went on), by stage "
    "(assemble, plan, release, status, recover, preempt); a count.",
    ("stage",),
    registry=REGISTRY,
)
LEADER = Gauge(
    "quorum_operator_leader",
    "1 while this replica holds the leader Lease (and schedules), else 0.",
    registry=REGISTRY,
)
API_REQUESTS = Counter(
    "quorum_operator_api_requests_total",
    "Requests to the Kubernetes apiserver, by verb (get, list, watch, create, update, patch, delete) "
    'and HTTP status code ("error": no answer came); a count.',
    ("verb", "code"),
    registry=REGISTRY,
)
DRA_DEVICES_ALLOCATED_TWICE = Gauge(
    "quorum_operator_dra_devices_allocated_twice",
    "DRA devices that more than one allocated ResourceClaim holds (two allocators took the same "
    "device: quorum for a gang and kube-scheduler for a pod outside gangs, docs/dra.md); should be 0.",
    registry=REGISTRY,
)
CACHE_SYNCED = Gauge(
    "quorum_operator_cache_synced",
    "1 once the watched kind has been listed (its cache is complete), else 0.",
    ("kind",),
    registry=REGISTRY,
)

for _action in RECOVERY_ACTIONS:
    RECOVERIES.labels(_action)
for _stage in FAILURE_STAGES:
    GANG_FAILURES.labels(_stage)

_gang_labels: set[tuple[str, str]] = set()


def set_gangs(counts: Mapping[tuple[str, str], int]) -> None:
    """Set quorum_operator_gangs to `counts` ((phase, reason) -> gangs); a label set seen
    before and absent now goes to 0 (its series does not vanish)."""
    for labels in _gang_labels - counts.keys():
        GANGS.labels(*labels).set(0)
    for labels, n in counts.items():
        GANGS.labels(*labels).set(n)
    _gang_labels.update(counts.keys())


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
# A namespace's own subresources: /api/v1/namespaces/{name}/status is not a collection.
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


def _resource_path(path: str) -> list[str] | None:
    """The segments after /api/{version} or /apis/{group}/{version}; None for other paths
    (discovery, /version, /openapi)."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        return parts[2:]
    if len(parts) >= 3 and parts[0] == "apis":
        return parts[3:]
    return None


def api_verb(method: str, url: URL | str) -> str:
    """The Kubernetes verb of a request to the apiserver: GET with `watch=true` (or `1`) -> watch,
    GET of a collection (the path ends with a resource's plural name, cluster-wide or in a
    namespace) -> list, other GETs -> get; POST -> create, PUT -> update, PATCH -> patch,
    DELETE -> delete (a collection's too). Other methods: their lower-cased name."""
    method = method.upper()
    if method != "GET":
        return _VERBS.get(method, method.lower())
    if not isinstance(url, URL):
        url = URL(url)
    if url.query.get("watch", "").lower() in ("true", "1"):
        return "watch"
    rest = _resource_path(url.path)
    if not rest:
        return "get"
    if rest[0] == "watch":  # the old /api/v1/watch/... paths
        return "watch"
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in _NAMESPACE_SUBRESOURCES:
        rest = rest[2:]  # namespaces/{ns}/{resource}/...
    return "list" if len(rest) == 1 else "get"


async def _on_request_end(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestEndParams
) -> None:
    API_REQUESTS.labels(api_verb(params.method, params.url), str(params.response.status)).inc()


async def _on_request_exception(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestExceptionParams
) -> None:
    if isinstance(params.exception, asyncio.CancelledError):
        return  # the request was abandoned (shutdown, a lost lease), not failed
    API_REQUESTS.labels(api_verb(params.method, params.url), "error").inc()


def api_trace_config() -> aiohttp.TraceConfig:
    """aiohttp tracing that counts every request into quorum_operator_api_requests_total{verb,
    code}: the status code when the response's headers arrive (a watch counts when its stream
    starts), "error" when the request failed with no answer (connection refused or reset, a
    timeout). A cancelled request is not counted."""
    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(_on_request_end)
    trace.on_request_exception.append(_on_request_exception)
    return trace


PREEMPTION_RESULTS = (
    "Started",
    "Ended",
    "Expired",
    "NothingToPreempt",
    "WouldNotFit",
    "Unproven",
    "Fits",
)
"""The values of quorum_operator_preemptions_total's `result` label."""
PREEMPTIONS = Counter(
    "quorum_operator_preemptions_total",
    "Preemption decisions and their ends, by result: Started (victims deleted), Ended (the preemptor "
    "bound, or gone), Expired (not bound before the deadline: reserved nodes freed), or why a held "
    "gang found nothing to take.",
    ["result"],
    registry=REGISTRY,
)
PREEMPTION_PAST_BUDGETS = Counter(
    "quorum_operator_preemption_past_budgets_total",
    "PodDisruptionBudgets a preemption took more pods of than they allowed (no set of victims "
    "within every budget would have made room).",
    registry=REGISTRY,
)
PREEMPTION_VICTIMS = Histogram(
    "quorum_operator_preemption_victims",
    "Work items (whole gangs, lone pods) taken by one preemption.",
    buckets=(1, 2, 3, 5, 10, 20, 50, 100),
    registry=REGISTRY,
)
for _result in PREEMPTION_RESULTS:
    PREEMPTIONS.labels(_result)
