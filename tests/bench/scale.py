"""quorum at scale (issue 29, point 3): `make bench-scale`.

One run per size and way, each on a freshly started instance (kwok nodes, 8 GPUs each, and 8 CPU
nodes): a deterministic workload of mixed gangs arriving over time, run until every gang pod is
bound. The reference size is 5,000 GPU nodes (40,000 GPUs): 2,000 gangs, one of them 4,096 pods
(512 whole nodes) arriving in the middle; the others 1 to 128 pods (weighted toward small),
1 GPU each, all together within 75% of the GPUs (nothing queues for capacity: the figures are
quorum's and the control plane's, not a backlog's). Other sizes scale the number of gangs and
the large gang with the nodes (200 nodes: 80 gangs, a 164-pod gang), keep the same size
distribution and the same arrival window, so the figures of 200, 1,000 and 5,000 nodes compare.

Arrival: exponential gaps (seeded) stretched over `--arrival-seconds` (300 s); a gang's
PodGroup, then all its pods (64 creates in flight over the whole run, as bench-peers). Pods run
for 120-480 s (kwok completes them), so early gangs finish while later ones arrive.

Measured:
- seconds from the first arrival to all gang pods bound, and from the last pod created;
- per gang, from its last pod created to all its gates removed (release; quorum only) and to
  all its pods bound (bind): p50 / p99, and the large gang's own, with how long its pods took to
  create and when its first gate was removed (the planner's decision, before the release's writes);
- quorum-operator's worst scheduling pass, pass p50 / p99, event-loop lag (worst, p99), gangs it
  found partially placed, from its /metrics; from its log, slow passes (it logs passes over 1 s
  with where the time went), leader Leases lost and releases the apiserver refused;
- peak RSS (VmHWM) and CPU seconds of every process (quorum-operator, quorum-webhooks, the
  apiserver, etcd, ...); every process still alive at the end; the kernel's OOM kills
  (/proc/vmstat, machine-wide) during the run;
- the apiserver's latency for a pod's create, patch (quorum's releases) and binding, and the time
  requests waited in API Priority and Fairness queues by flow schema, from its /metrics;
- apiserver requests per pod, from the audit log (Lease renewals are not audited: kwok's node
  heartbeats would dominate the log at 5,000 nodes and grow with nodes and time, not pods).

Ways (`--mode`, as `make bench-peers` names them): `quorum` (the gate, the default);
`coscheduling`, scheduler-plugins' Coscheduling on the same workload; and on Kubernetes 1.37
(`--kubernetes 1.37`) `delegated`, quorum with `placement: kube-scheduler` (the same PodGroups
and pods as `quorum`), and `was`, no quorum: each gang a Kubernetes PodGroup placed by
kube-scheduler's own gang cycle. Kubernetes 1.36 by default (scheduler-plugins builds against
1.36 and runs one minor behind on 1.37). `kueue`: Kueue's pod integration in front of
kube-scheduler (its pod groups, one ClusterQueue whose quota is the pool), as `make bench-peers`
runs it.

Bounded: each run waits at most `--deadline` seconds (default: the arrival window + 600 s)
after its first arrival; the instance is stopped in any case. Writes
bench/results/<date>-scale.json and .md (runs of other sizes or ways already in the day's file
are kept; a run of the same size and way replaces its entry).

    make bench-scale                       # 5,000 nodes
    make bench-scale NODES="200 1000"      # one instance per size, one after the other
    python -m tests.bench.scale --nodes 200 --nodes 1000 --mode coscheduling
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import random
import re
import ssl
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from devcluster.coscheduler import (
    PERMIT_WAITING_SECONDS,
    SCHEDULER_NAME,
    ensure_coscheduler,
    start_coscheduler,
    start_podgroup_controller,
)
from devcluster.kueue import QUEUE, ensure_kueue, local_queue, pool_quota, start_kueue
from devcluster.nodes import load_pool, render_nodes
from devcluster.process import is_alive
from quorum.install import DEFAULT_NAMESPACE, operator_username
from quorum.k8s.watch import watch_objects
from tests.bench.histograms import difference, histogram_quantile, histograms, parse_samples, summary_ms
from tests.bench.peer_workloads import (
    GROUP,
    GangSpec,
    gang_pod,
    in_workload_podgroup,
    kueue_gang_pod,
    podgroup,
    workload_podgroup,
    write_pool,
)
from tests.bench.peers import coscheduler_binaries, cpu_seconds
from tests.kube import WorkloadApi, api_client, create_namespace, overcommitted_nodes

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
MODES = ("quorum", "coscheduling", "kueue", "delegated", "was")
WITH_QUORUM = ("quorum", "delegated")
NEEDS_137 = ("delegated", "was")  # kube-scheduler's gang cycle, beta from 1.37
REFERENCE_NODES, REFERENCE_GANGS, REFERENCE_BIG_GANG = 5000, 2000, 4096
GPUS_PER_NODE, CPU_NODES = 8, 8
GANG_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
GANG_WEIGHTS = (30, 20, 18, 14, 8, 5, 3, 2)  # mean about 10 pods
FILL = 0.75  # all gangs together stay within this share of the GPUs
RUN_SECONDS = (120, 480)
ARRIVAL_SECONDS = 300.0
AFTER_ARRIVALS = 600.0  # the default deadline: the arrival window + this
QPS, BURST, IN_FLIGHT = 500.0, 1000, 64
CREATE_ATTEMPTS = 5
NAMESPACE = "scale"
GATE = "quorum.dev/gang"
OPERATOR = operator_username(DEFAULT_NAMESPACE)
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    resources: [{group: coordination.k8s.io, resources: [leases]}]
  # kwok's node heartbeats: they grow with nodes and time, not with pods (at 5,000 nodes they
  # overflowed the batch buffer, and the apiserver dropped events of every kind).
  - level: None
    resources: [{group: "", resources: [nodes/status]}]
  - level: Metadata
"""
SLOW_PASS = re.compile(r"slow pass: ([0-9.]+)s \((.*)\)")


# -- the workload (pure) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Gang:
    name: str
    size: int  # pods, minMember = size, 1 GPU each
    arrival: float  # seconds after the run's start
    run_seconds: int

    @property
    def spec(self) -> GangSpec:
        return GangSpec(self.name, self.size)


def gang_count(nodes: int) -> int:
    return max(2, round(REFERENCE_GANGS * nodes / REFERENCE_NODES))


def big_gang_size(nodes: int) -> int:
    return max(2, round(REFERENCE_BIG_GANG * nodes / REFERENCE_NODES))


def workload(nodes: int, arrival_seconds: float = ARRIVAL_SECONDS, seed: int = 29) -> list[Gang]:
    """The gangs of a run on `nodes` GPU nodes, in arrival order: `gang_count(nodes)` gangs, the
    one in the middle `big_gang_size(nodes)` pods, the others drawn from GANG_SIZES (a draw that
    would take the total past FILL of the GPUs is halved until it fits, at least 1 pod each);
    arrivals from 0 to `arrival_seconds` with exponential gaps."""
    rng = random.Random(seed)
    count, big = gang_count(nodes), big_gang_size(nodes)
    budget = math.floor(FILL * GPUS_PER_NODE * nodes) - big
    sizes: list[int] = []
    for i in range(count - 1):
        size = rng.choices(GANG_SIZES, GANG_WEIGHTS)[0]
        left = budget - sum(sizes) - (count - 2 - i)  # a pod for each gang still to draw
        while size > 1 and size > left:
            size //= 2
        sizes.append(size)
    middle = count // 2
    sizes.insert(middle, big)
    gaps = [rng.expovariate(1.0) for _ in range(count - 1)]
    scale = arrival_seconds / sum(gaps)
    arrivals = [0.0]
    for gap in gaps:
        arrivals.append(arrivals[-1] + gap * scale)
    return [
        Gang(f"g{i:04d}", size, round(at, 3), rng.randint(*RUN_SECONDS))
        for i, (size, at) in enumerate(zip(sizes, arrivals, strict=True))
    ]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# -- what the run sees -------------------------------------------------------------------------


@dataclass
class PodTimes:
    """When each benchmark pod was created (the create's answer), seen without quorum's gate
    and seen bound, from a watch in this process (time.time(): the audit log's clock)."""

    pods: int
    created: dict[str, float] = field(default_factory=dict)
    ungated: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    listings: int = 0

    def upsert(self, raw: dict[str, Any]) -> None:
        name, now = raw["metadata"]["name"], time.time()
        spec = raw.get("spec") or {}
        if name not in self.ungated and not any(
            g.get("name") == GATE for g in spec.get("schedulingGates") or []
        ):
            self.ungated[name] = now
        if spec.get("nodeName") and name not in self.bound:
            self.bound[name] = now
            if len(self.bound) >= self.pods:
                self.done.set()

    def delete(self, raw: dict[str, Any]) -> None:
        pass

    def replace_all(self, pods: list[dict[str, Any]]) -> None:
        self.listings += 1
        for pod in pods:
            self.upsert(pod)

    async def follow(self, api: client.ApiClient) -> None:
        listing = functools.partial(client.CoreV1Api(api).list_namespaced_pod, NAMESPACE)
        await watch_objects(listing, [self], asyncio.Event(), lambda: None)


@dataclass
class Run:
    """One run's client-side record."""

    times: PodTimes
    start: float
    end: float
    arrived: dict[str, float]
    create_retries: int
    all_created: float
    overcommitted: list[str]  # nodes whose bound pods request more than they have
    error: str  # why the run stopped early ("": it did not)


async def drive(instance: Instance, mode: str, gangs: list[Gang], deadline: float) -> Run:
    """Create the gangs at their arrival times and wait until every pod is bound, or `deadline`
    seconds after the start."""
    scheduler = "default-scheduler" if mode == "was" else SCHEDULER_NAME  # quorum's rewrites it
    times = PodTimes(sum(g.size for g in gangs))
    arrived: dict[str, float] = {}
    retries, error = 0, ""
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        await create_namespace(api, NAMESPACE)
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        workloads = await WorkloadApi.of(api) if mode == "was" else None
        if mode == "kueue":
            body = local_queue(NAMESPACE)
            await custom.create_namespaced_custom_object(
                "kueue.x-k8s.io", "v1beta2", NAMESPACE, "localqueues", body
            )
        follower = asyncio.create_task(times.follow(api))
        await asyncio.sleep(1)  # the watch is open
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def create(call: Any, body: dict[str, Any]) -> None:
            """One create, retried on 429 / 5xx / no answer (a 409 after a retry: it was made)."""
            nonlocal retries
            for attempt in range(CREATE_ATTEMPTS):
                try:
                    async with gate:
                        await call(body)
                    return
                except ApiException as err:
                    if err.status == 409 and attempt > 0:
                        return
                    if err.status not in (429, 500, 502, 503, 504) or attempt == CREATE_ATTEMPTS - 1:
                        raise
                except (TimeoutError, OSError):
                    if attempt == CREATE_ATTEMPTS - 1:
                        raise
                retries += 1
                await asyncio.sleep(0.5 * 2**attempt)

        async def create_pod(body: dict[str, Any]) -> None:
            await create(functools.partial(core.create_namespaced_pod, NAMESPACE), body)
            times.created[body["metadata"]["name"]] = time.time()

        async def arrive(gang: Gang) -> None:
            await asyncio.sleep(max(0.0, start + gang.arrival - time.time()))
            arrived[gang.name] = time.time()
            pods = [gang_pod(gang.spec, i, scheduler, gang.run_seconds) for i in range(gang.size)]
            if mode == "kueue":  # its own pod groups: labels, no group object
                pods = [kueue_gang_pod(gang.spec, i, gang.run_seconds, QUEUE) for i in range(gang.size)]
            elif workloads is not None:  # Kubernetes' own PodGroup, of the version served
                version = workloads.version
                await create(
                    functools.partial(workloads.create, api, NAMESPACE, "podgroups"),
                    workload_podgroup(gang.spec, version),
                )
                pods = [in_workload_podgroup(pod, gang.spec) for pod in pods]
            else:
                body = podgroup(gang.spec, PERMIT_WAITING_SECONDS)
                await create(
                    functools.partial(
                        custom.create_namespaced_custom_object, GROUP, "v1alpha1", NAMESPACE, "podgroups"
                    ),
                    body,
                )
            await asyncio.gather(*(create_pod(pod) for pod in pods))

        start = time.time()

        async def arrive_all() -> None:
            await asyncio.gather(*(arrive(g) for g in gangs))

        arrivals = asyncio.create_task(arrive_all())
        waiting = asyncio.create_task(times.done.wait())
        pending: set[asyncio.Future[Any]] = {waiting, follower, arrivals}
        try:
            while waiting in pending:
                left = start + deadline - time.time()
                if left <= 0:
                    print(f"  {mode}: not all bound within {deadline:.0f} s", file=sys.stderr, flush=True)
                    break
                done, pending = await asyncio.wait(pending, timeout=left, return_when="FIRST_COMPLETED")
                failed = [t for t in done if t is not waiting and (t is follower or t.exception())]
                if failed:  # the watch ended, or a create failed for good: say why, keep what was seen
                    task = failed[0]
                    error = repr(task.exception() or RuntimeError("the pod watch ended"))
                    print(f"  {mode}: stopped: {error}", file=sys.stderr, flush=True)
                    break
        finally:
            end = time.time()
            for task in (waiting, follower, arrivals):
                task.cancel()
            for task in (waiting, follower, arrivals):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        overcommitted = await overcommitted_nodes(api)
    all_created = max(times.created.values(), default=end)
    return Run(times, start, end, arrived, retries, all_created, overcommitted, error)


# -- the processes -----------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) of a process, in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return {k: round(int(fields[k].split()[0]) / 1024, 1) for k in ("VmRSS", "VmHWM")}


def oom_kills() -> int:
    """The kernel's count of OOM kills since boot (machine-wide)."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def scrape(url: str, timeout: float = 30.0) -> str:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the dev CA, on 127.0.0.1
    with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
        text: str = response.read().decode()
    return text


def gauge(text: str, name: str) -> float | None:
    """The value of an unlabelled sample `name` in Prometheus' text format."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def seconds_or_none(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


def operator_figures(before: str, after: str) -> dict[str, Any]:
    """From two scrapes of quorum-operator's /metrics (before and after the workload): its worst
    pass (since it started: at 5,000 nodes the first full pass counts too), pass and plan
    p50/p99 and count in the window, event-loop lag worst and p99."""
    names = (
        "quorum_operator_pass_duration_seconds",
        "quorum_operator_plan_duration_seconds",
        "quorum_operator_event_loop_lag_seconds",
    )
    window = difference(parse_samples(after, names), parse_samples(before, names))
    figures: dict[str, Any] = {
        "worst_pass_seconds": gauge(after, "quorum_operator_pass_duration_max_seconds"),
        "worst_event_loop_lag_seconds": gauge(after, "quorum_operator_event_loop_lag_max_seconds"),
        "partial_placements": round(
            (gauge(after, "quorum_operator_partial_placements_total") or 0.0)
            - (gauge(before, "quorum_operator_partial_placements_total") or 0.0)
        ),
    }
    for metric, key in zip(names, ("pass", "plan", "event_loop_lag"), strict=True):
        series = histograms(window, metric, ())
        if not series:
            continue
        h = series[()]
        figures[f"{key}_count"] = round(h.count)
        figures[f"{key}_p50_seconds"] = seconds_or_none(histogram_quantile(0.5, h.buckets))
        figures[f"{key}_p99_seconds"] = seconds_or_none(histogram_quantile(0.99, h.buckets))
    gc = "quorum_operator_gc_pause_seconds"
    full = histograms(
        difference(parse_samples(after, (gc,)), parse_samples(before, (gc,))), gc, (), {"generation": "2"}
    )
    if full:
        h = full[()]
        figures["full_gc_count"] = round(h.count)
        figures["full_gc_seconds_total"] = round(h.sum, 2)
        # The bound of the highest bucket a collection fell in.
        figures["worst_full_gc_seconds"] = max(
            (
                le
                for (le, n), (_, below) in zip(h.buckets, ((0.0, 0.0), *h.buckets), strict=False)
                if n > below
            ),
            default=None,
        )
    return figures


def webhook_figures(text: str) -> dict[str, Any]:
    """quorum-webhooks' answer time per AdmissionReview (all its webhooks), p50/p99."""
    metric = "quorum_webhook_request_duration_seconds"
    series = histograms(parse_samples(text, (metric,)), metric, ())
    if not series:
        return {}
    h = series[()]
    return {
        "admission_reviews": round(h.count),
        "review_p50_seconds": seconds_or_none(histogram_quantile(0.5, h.buckets)),
        "review_p99_seconds": seconds_or_none(histogram_quantile(0.99, h.buckets)),
    }


def operator_log(log_lines: Iterable[str]) -> dict[str, Any]:
    """From quorum-operator's log: its passes over 1 s (it logs where their time went): how
    many, and the worst with its timings; how often it lost its leader Lease (each loss cancels
    the work under way and the next term resumes from the API); releases the apiserver refused
    (a pod gone, or already changed: the patch's `test` failed); its watches' relistings (each
    holds a second copy of what it lists while it lists)."""
    count, worst, where, lost, refused, relisted = 0, 0.0, "", 0, 0, 0
    for line in log_lines:
        if "leader election failed" in line:
            lost += 1
        elif " listed again: " in line:
            relisted += 1
        elif " not released: " in line:
            refused += 1
        elif match := SLOW_PASS.search(line):
            count += 1
            if float(match.group(1)) > worst:
                worst, where = float(match.group(1)), match.group(2)
    return {
        "slow_passes": count,
        "slowest_logged_pass_seconds": worst,
        "slowest_logged_pass": where[:400],
        "leader_losses": lost,
        "releases_refused": refused,
        "relistings": relisted,
    }


def count_requests(audit_log: Path, start: float, end: float) -> tuple[Counter[str], Counter[str]]:
    """Requests the apiserver served in [start, end], by client; quorum-operator's by verb and
    resource. Read line by line (the log is hundreds of MiB at 5,000 nodes)."""
    counts: Counter[str] = Counter()
    operator: Counter[str] = Counter()
    with audit_log.open() as lines:
        for line in lines:
            event = json.loads(line)
            stamp = event["requestReceivedTimestamp"].replace("Z", "+00:00")
            if not start <= datetime.fromisoformat(stamp).timestamp() <= end:
                continue
            user, agent = event.get("user", {}).get("username", ""), event.get("userAgent", "")
            if user == OPERATOR:
                who = "quorum-operator"
                ref = event.get("objectRef") or {}
                sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
                operator[f"{event['verb']} {ref.get('resource', '?')}{sub}"] += 1
            elif agent.startswith("OpenAPI-Generator"):
                who = "benchmark client"
            elif user.startswith("system:serviceaccount:kube-system:"):
                who = "kube-controller-manager"
            else:
                who = agent.split("/", 1)[0] or user
            counts[who] += 1
    return counts, operator


# -- one run -----------------------------------------------------------------------------------


def start_instance(mode: str, nodes: int, tmp: Path, kubernetes: str = "1.36") -> tuple[Instance, Path]:
    pool = write_pool(tmp / "pool.yaml", nodes, CPU_NODES)
    (tmp / "audit-policy.yaml").write_text(AUDIT_POLICY)
    audit = tmp / "audit.log"
    with_quorum = mode in WITH_QUORUM
    spec = ClusterSpec(
        name=f"scale-{mode}-{nodes}",
        kubernetes=kubernetes,
        placement="kube-scheduler" if mode == "delegated" else "quorum",
        pool_file=pool,
        client_qps=QPS,
        client_burst=BURST,
        install_manifests=with_quorum,
        webhooks=with_quorum,
        operator=with_quorum,
        extra_args={
            "kube-apiserver": (
                f"--audit-policy-file={tmp / 'audit-policy.yaml'}",
                f"--audit-log-path={audit}",
                "--audit-log-mode=batch",
                "--audit-log-batch-max-wait=1s",
                "--audit-log-batch-buffer-size=200000",
            ),
            # kwok renews thousands of node leases from one process on these 2 cores and falls
            # behind under load: at 5,000 nodes the node lifecycle controller tainted 2,195 of
            # them unreachable within minutes, and pods released onto them could not bind. Real
            # kubelets each renew their own; the benchmark measures gangs, not kwok's heartbeats.
            "kube-controller-manager": ("--node-monitor-grace-period=10m",),
        },
    )
    instance = Instance(spec.name)
    instance.down(quiet=True)
    instance.up(spec, log=lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
    if mode == "coscheduling":
        binaries = coscheduler_binaries(instance)
        built = ensure_coscheduler(binaries)
        start_coscheduler(instance, built, verbosity=0, own_gates=binaries.pins == instance.binaries.pins)
        start_podgroup_controller(instance, built)
    elif mode == "kueue":
        start_kueue(instance, ensure_kueue(instance.binaries), pool_quota(render_nodes(load_pool(pool))))
    return instance, audit


def measure(
    mode: str, nodes: int, arrival_seconds: float, deadline: float | None, seed: int, kubernetes: str = "1.36"
) -> dict[str, Any]:
    gangs = workload(nodes, arrival_seconds, seed)
    bound = deadline if deadline is not None else arrival_seconds + AFTER_ARRIVALS
    pods = sum(g.size for g in gangs)
    print(
        f"{nodes} nodes / {mode} / Kubernetes {kubernetes}: {len(gangs)} gangs, {pods} pods, "
        f"arriving over {arrival_seconds:.0f} s; "
        f"waiting at most {bound:.0f} s; starting a fresh instance ...",
        file=sys.stderr,
        flush=True,
    )
    wall = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="quorum-scale-") as tmp:
        instance, audit = start_instance(mode, nodes, Path(tmp), kubernetes)
        up_seconds = time.monotonic() - wall
        try:
            state = instance.state()
            assert state is not None
            processes = list(state.processes)
            operator_url = f"http://127.0.0.1:{state.ports.operator}/metrics"
            before_metrics = scrape(operator_url) if mode in WITH_QUORUM else ""
            before_cpu, before_oom = cpu_seconds(instance), oom_kills()
            before_apiserver = apiserver_metrics(instance)
            run = asyncio.run(drive(instance, mode, gangs, bound))
            after_cpu, after_oom = cpu_seconds(instance), oom_kills()
            after_apiserver = apiserver_metrics(instance)
            served = served_requests(after_apiserver) - served_requests(before_apiserver)
            latency = apiserver_latency(before_apiserver, after_apiserver)
            dead = sorted(p.name for p in processes if not is_alive(p))
            memory = {p.name: proc_status(p.pid) for p in processes if is_alive(p)}
            extra: dict[str, Any] = {}
            if mode in WITH_QUORUM and "quorum-operator" not in dead:
                extra["operator"] = operator_figures(before_metrics, scrape(operator_url))
                log = instance.layout.log("quorum-operator")
                with log.open(errors="replace") as lines:
                    extra["operator"] |= operator_log(lines)
            if mode in WITH_QUORUM and "quorum-webhooks" not in dead:
                extra["webhooks"] = webhook_figures(
                    scrape(f"https://127.0.0.1:{state.ports.webhooks}/metrics")
                )
            time.sleep(2)  # the audit log is written in batches
            requests, operator_requests = count_requests(audit, run.start, run.end)
            extra["audit_events_dropped"] = audit_events_dropped(instance)
            extra["served_requests_per_pod"] = round(served / max(1, len(run.times.created)), 2)
        finally:
            instance.down(quiet=True)
    cpu = {k: round(after_cpu[k] - before_cpu.get(k, 0.0), 1) for k in after_cpu}
    result = summarise(mode, nodes, gangs, run, requests)
    result |= {
        "kubernetes": instance.binaries.pins.kubernetes,
        "arrival_seconds": arrival_seconds,
        "deadline_seconds": bound,
        "instance_up_seconds": round(up_seconds, 1),
        "wall_seconds": round(time.monotonic() - wall, 1),
        "processes_dead_at_end": dead,
        "oom_kills_during_run": after_oom - before_oom,
        "peak_rss_mib": {k: v["VmHWM"] for k, v in sorted(memory.items(), key=lambda kv: -kv[1]["VmHWM"])},
        "rss_at_end_mib": {k: v["VmRSS"] for k, v in memory.items()},
        "cpu_seconds": round(sum(cpu.values()), 1),
        "cpu_seconds_by_process": dict(sorted(cpu.items(), key=lambda kv: -kv[1])),
        "apiserver_latency": latency,
        **extra,
    }
    if operator_requests:
        result["operator_requests"] = dict(operator_requests.most_common())
    return result


def apiserver_metrics(instance: Instance) -> str:
    """The apiserver's /metrics, as the admin reads it."""
    status, body = instance.rest().get("/metrics", timeout=60)
    if status != 200:
        raise RuntimeError(f"GET /metrics: HTTP {status}: {body[:300]!r}")
    return body.decode()


REQUEST_DURATION = "apiserver_request_duration_seconds"
APF_WAIT = "apiserver_flowcontrol_request_wait_duration_seconds"
# The requests a gang's pods cost: created by the client, released by quorum, bound by the scheduler.
POD_REQUESTS = {
    "create": ("POST", ""),
    "patch": ("PATCH", ""),
    "binding": ("POST", "binding"),
}


def apiserver_latency(before: str, after: str) -> dict[str, Any]:
    """What the apiserver's own histograms say of the run (the difference of two scrapes of its
    /metrics): each pod request's latency, and the time requests waited in API Priority and
    Fairness queues, by flow schema (quorum-operator's writes are its service account's)."""
    window = difference(
        parse_samples(after, (REQUEST_DURATION, APF_WAIT)),
        parse_samples(before, (REQUEST_DURATION, APF_WAIT)),
    )
    requests = {}
    for name, (verb, subresource) in POD_REQUESTS.items():
        found = histograms(
            window, REQUEST_DURATION, [], {"verb": verb, "resource": "pods", "subresource": subresource}
        )
        if found and found[()].count:
            requests[name] = summary_ms(found[()])
    waits = histograms(window, APF_WAIT, ["flow_schema", "priority_level"], {"execute": "true"})
    return {
        "pods": requests,
        "flowcontrol_wait": {"/".join(k): summary_ms(h) for k, h in sorted(waits.items()) if h.count},
    }


def served_requests(metrics: str) -> float:
    """Requests the apiserver has served by a scrape of its /metrics (its own counter,
    apiserver_request_total), but for Leases and node status: kwok's heartbeats, which grow with
    nodes and time, not pods. Exact where the audit log is not: at 5,000 nodes it held fewer
    creations than the benchmark made."""
    total = 0.0
    for line in metrics.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, value = line.rsplit(" ", 1)
        if 'resource="leases"' in labels or (
            'resource="nodes"' in labels and 'subresource="status"' in labels
        ):
            continue
        total += float(value)
    return total


def audit_events_dropped(instance: Instance) -> int:
    """Events the apiserver could not audit (a full batch buffer drops them): nonzero means the
    requests per pod counted from the log are too low."""
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in apiserver_metrics(instance).splitlines()
            if line.startswith("apiserver_audit_error_total")
        )
    )


def summarise(mode: str, nodes: int, gangs: list[Gang], run: Run, requests: Counter[str]) -> dict[str, Any]:
    times = run.times
    pods = sum(g.size for g in gangs)
    big = max(gangs, key=lambda g: g.size)
    total = sum(requests.values())
    kwok = requests.get("kwok", 0)
    result: dict[str, Any] = {
        "mode": mode,
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "gangs": len(gangs),
        "pods": pods,
        "big_gang_pods": big.size,
        "pods_created": len(times.created),
        "pods_bound": len(times.bound),
        "all_bound": len(times.bound) >= pods,
        "create_retries": run.create_retries,
        "released_never_bound": len(times.ungated.keys() - times.bound.keys()) if mode == "quorum" else None,
        "overcommitted_nodes": run.overcommitted[:20],
        "error": run.error,
        "pod_watch_listings": times.listings,
        "seconds_to_create_all": round(run.all_created - run.start, 1),
        "latest_arrival_behind_schedule_seconds": round(
            max(
                (run.arrived[g.name] - run.start - g.arrival for g in gangs if g.name in run.arrived),
                default=0.0,
            ),
            2,
        ),
        "apiserver_requests": total,
        "apiserver_requests_per_pod": round(total / pods, 2),
        "apiserver_requests_per_pod_without_kwok": round((total - kwok) / pods, 2),
        "requests_by_client": dict(requests.most_common()),
    }
    if times.bound:
        result["seconds_to_all_bound"] = round(max(times.bound.values()) - run.start, 1)
        result["last_created_to_all_bound_seconds"] = round(max(times.bound.values()) - run.all_created, 2)
    release, bind = [], []
    for gang in gangs:
        names = [f"{gang.name}-{i}" for i in range(gang.size)]
        if not all(n in times.created for n in names):
            continue
        last = max(times.created[n] for n in names)
        if gang is big:
            result["big_gang_creation_seconds"] = round(last - min(times.created[n] for n in names), 2)
        if mode == "quorum" and all(n in times.ungated for n in names):
            release.append(max(0.0, max(times.ungated[n] for n in names) - last))
            if gang is big:
                # Split: the wait for the planner's decision, then the release's pod writes.
                first = max(0.0, min(times.ungated[n] for n in names) - last)
                result["big_gang_first_release_seconds"] = round(first, 2)
                result["big_gang_release_seconds"] = round(release[-1], 2)
        if all(n in times.bound for n in names):
            bind.append(max(times.bound[n] for n in names) - last)
            if gang is big:
                result["big_gang_bind_seconds"] = round(bind[-1], 2)
    for key, values in (("release", release), ("bind", bind)):
        if values:
            result[f"{key}_gangs"] = len(values)
            result[f"{key}_p50_seconds"] = round(statistics.median(values), 3)
            result[f"{key}_p99_seconds"] = round(percentile(values, 99), 3)
            result[f"{key}_max_seconds"] = round(max(values), 3)
    return result


# -- the report --------------------------------------------------------------------------------

ROWS: tuple[tuple[str, str], ...] = (
    ("GPU nodes / GPUs", "{nodes:,} / {gpus:,}"),
    ("gangs / pods (largest gang)", "{gangs:,} / {pods:,} ({big_gang_pods:,})"),
    ("all pods bound", "all_bound"),
    ("first arrival -> all bound (s)", "seconds_to_all_bound"),
    ("last pod created -> all bound (s)", "last_created_to_all_bound_seconds"),
    ("release: last created -> gates removed, p50 / p99 (s)", "release_p50_seconds/release_p99_seconds"),
    ("bind: last created -> all bound, p50 / p99 (s)", "bind_p50_seconds/bind_p99_seconds"),
    ("largest gang: release / bind (s)", "big_gang_release_seconds/big_gang_bind_seconds"),
    (
        "largest gang: its pods created over / first gate removed (s)",
        "big_gang_creation_seconds/big_gang_first_release_seconds",
    ),
    (
        "full garbage collections: count / seconds in all / worst (bucket bound, s)",
        "operator.full_gc_count/operator.full_gc_seconds_total/operator.worst_full_gc_seconds",
    ),
    ("worst pass (s)", "operator.worst_pass_seconds"),
    ("pass p50 / p99 (s)", "operator.pass_p50_seconds/operator.pass_p99_seconds"),
    ("passes over 1 s", "operator.slow_passes"),
    ("leader Lease lost / releases refused", "operator.leader_losses/operator.releases_refused"),
    ("gangs found partially placed (quorum's count)", "operator.partial_placements"),
    ("pods released and never bound / nodes overcommitted", "=stuck"),
    (
        "event-loop lag, worst / p99 (s)",
        "operator.worst_event_loop_lag_seconds/operator.event_loop_lag_p99_seconds",
    ),
    ("admission review p99 (s)", "webhooks.review_p99_seconds"),
    ("quorum-operator peak RSS (MiB)", "peak_rss_mib.quorum-operator"),
    ("quorum-webhooks peak RSS (MiB)", "peak_rss_mib.quorum-webhooks"),
    ("kube-apiserver peak RSS (MiB)", "peak_rss_mib.kube-apiserver"),
    ("etcd peak RSS (MiB)", "peak_rss_mib.etcd"),
    (
        "apiserver requests per pod (without kwok)",
        "apiserver_requests_per_pod/apiserver_requests_per_pod_without_kwok",
    ),
    ("apiserver requests per pod, its own counter (no Leases, no node status)", "served_requests_per_pod"),
    (
        "apiserver latency of pods (ms): create / patch / binding, p50 / p99",
        "apiserver_latency.pods.create.p50_ms/apiserver_latency.pods.create.p99_ms/"
        "apiserver_latency.pods.patch.p50_ms/apiserver_latency.pods.patch.p99_ms/"
        "apiserver_latency.pods.binding.p50_ms/apiserver_latency.pods.binding.p99_ms",
    ),
    ("audit events dropped (nonzero: the request counts are low)", "audit_events_dropped"),
    ("quorum-operator requests per pod", "=operator_requests_per_pod"),
    ("CPU seconds, all / quorum-operator", "cpu_seconds/cpu_seconds_by_process.quorum-operator"),
    ("processes dead at the end / OOM kills", "=dead_and_oom"),
    ("instance up (s) / whole run (s)", "instance_up_seconds/wall_seconds"),
)


def lookup(run: dict[str, Any], path: str) -> Any:
    value: Any = run
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def figure(run: dict[str, Any], spec: str) -> str:
    if spec == "=operator_requests_per_pod":
        count = lookup(run, "requests_by_client.quorum-operator")
        return "-" if count is None else f"{count / run['pods']:.2f}"
    if spec == "=stuck":
        return f"{cell(run.get('released_never_bound'))} / {len(run.get('overcommitted_nodes') or [])}"
    if spec == "=dead_and_oom":
        return f"{', '.join(run['processes_dead_at_end']) or 'none'} / {run['oom_kills_during_run']}"
    if "{" in spec:
        return spec.format(**run)
    parts = [cell(lookup(run, p)) for p in spec.split("/")]
    return " / ".join(parts)


def markdown(data: dict[str, Any]) -> str:
    runs = sorted(data["runs"], key=lambda r: (minor(r), MODES.index(r["mode"]), r["nodes"]))
    lines = [
        f"# quorum at scale ({data['date']})",
        "",
        "`make bench-scale` (tests/bench/scale.py): each column one run on a fresh instance; 1 GPU per pod, "
        "gangs arriving over the arrival window, run until every gang pod is bound.",
        "",
        "| | " + " | ".join(f"{r['nodes']:,} nodes, {r['mode']} ({minor(r)})" for r in runs) + " |",
        "|---" + "|---:" * len(runs) + "|",
    ]
    for label, spec in ROWS:
        lines.append(f"| {label} | " + " | ".join(figure(r, spec) for r in runs) + " |")
    return "\n".join(lines) + "\n"


def minor(run: dict[str, Any]) -> str:
    """The run's Kubernetes minor version ("1.36" for runs recorded before it was)."""
    return ".".join(run.get("kubernetes", "v1.36").lstrip("v").split(".")[:2])


def merge(existing: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The day's runs with `new` in: a run of the same size, way and Kubernetes minor replaces the
    older one."""
    keys = {(r["mode"], r["nodes"], minor(r)) for r in new}
    return [r for r in existing if (r["mode"], r["nodes"], minor(r)) not in keys] + new


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--nodes", type=int, action="append", help="GPU nodes (repeat: one run per size; 5000)"
    )
    parser.add_argument(
        "--mode", action="append", choices=MODES, help="quorum (default), coscheduling, kueue, delegated, was"
    )
    parser.add_argument(
        "--kubernetes", choices=("1.36", "1.37"), default="1.36", help="delegated and was need 1.37"
    )
    parser.add_argument("--arrival-seconds", type=float, default=ARRIVAL_SECONDS)
    parser.add_argument(
        "--deadline", type=float, help="seconds to wait after the start (arrival window + 600)"
    )
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument(
        "--out", type=Path, help="the JSON to write (default bench/results/<date>-scale.json)"
    )
    args = parser.parse_args()
    if args.kubernetes == "1.36" and set(args.mode or ()) & set(NEEDS_137):
        parser.error(f"{', '.join(NEEDS_137)} need kube-scheduler's gang cycle: add --kubernetes 1.37")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out: Path = args.out or RESULTS / f"{stamp}-scale.json"
    runs = []
    for mode in args.mode or ["quorum"]:
        for nodes in args.nodes or [REFERENCE_NODES]:
            result = measure(mode, nodes, args.arrival_seconds, args.deadline, args.seed, args.kubernetes)
            print(json.dumps(result, indent=2), flush=True)
            runs.append(result)
            out.parent.mkdir(parents=True, exist_ok=True)
            old = json.loads(out.read_text())["runs"] if out.exists() else []
            data = {"date": stamp, "runs": merge(old, [result])}
            out.write_text(json.dumps(data, indent=2) + "\n")  # after every run: a later one may fail
            out.with_suffix(".md").write_text(markdown(data))
    print(out.with_suffix(".md").read_text())
    print(f"written to {out} and {out.with_suffix('.md')}")
    ok = all(r["all_bound"] and not r["processes_dead_at_end"] and not r["overcommitted_nodes"] for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
