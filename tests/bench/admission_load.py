"""Admission latency through the apiserver (issues 14 and 29): what quorum's admission adds to
pod creation, measured by the apiserver itself.

Four ways, each run on a freshly started local control plane (Kubernetes 1.37):
- `policies`: quorum installed as `quorum manifests` makes it (the default ClusterSpec): pods are
  mutated inside the apiserver by the MutatingAdmissionPolicy quorum-pod-defaults, judged by
  quorum's ValidatingAdmissionPolicies, and quorum-webhooks is registered for what CEL cannot do;
  quorum-operator off;
- `webhooks`: the same with `--pod-admission webhooks` (pods.mutate.quorum.dev for every pod);
- `cks`: no quorum; seed 002's policies alone, as the platform would run them without quorum
  (tests/bench/cks.py: the CPU toleration as a MutatingAdmissionPolicy, the reserved-domain and
  interruptable checks as ValidatingAdmissionPolicies): the baseline quorum's own cost is judged
  against (quorum's default way at most 1.15x it, issue 42);
- `absent`: no quorum at all (no webhooks, no manifests).

Each run creates 2,000 pods as the customer identity (cluster-admin by RBAC, not
system:masters) into 4 user namespaces, 64 creates in flight, capped at 120 s: 40 % CPU pods (the
mutating webhook adds the CPU toleration), 24 % 8-GPU pods, 26 % pods of label gangs of 8
(`pod-group.scheduling.sigs.k8s.io/name` + `/min-available`, `schedulerName: cw-coscheduler`;
the webhook gates them), 10 % pods carrying `qos.coreweave.cloud/interruptable: "true"` (two
validating webhooks are called for them). Gangs are created pod after pod, in a seeded shuffle
with the single pods. 64 pods of the same mix are created first, unmeasured (TLS connections,
CEL compilation, caches). The ways run in turn, 3 rounds (`--rounds`), every other round in
reverse order (`round_order`): this machine's speed drifts from minute to minute, and a way that
always ran last would always meet the drift of the whole round.

Held still during the window, in every way: quorum-operator (off: gang pods stay gated; its
releases would add pod UPDATEs and Gang writes in one way only) and kube-scheduler (stopped once
the instance is up: without quorum every pod would be bound and run by kwok, with quorum the
gang pods would not), so the two ways differ in admission only. Before the window each
instance settles (`settle`): the apiserver has type-checked every ValidatingAdmissionPolicy (a
one-off cost of installing them, larger for quorum's fifteen than for `cks`' two) and the instance's
processes are quiet; the seconds it took are recorded per round.

Measured: the apiserver's /metrics scraped before and after the 2,000 creates; the difference of
the histogram buckets (summed over the rounds) gives, for each webhook, each policy's
matchConditions, the admission plugins and the admission steps, p50 and p99 interpolated as
PromQL's histogram_quantile does (tests/bench/histograms.py) and the exact mean (_sum / _count);
quorum-webhooks' own /metrics the same way. Client side: each create's latency (request sent ->
response, inside the 64-slot semaphore) p50 / p99 over all rounds, and pods/s (median of the
rounds). CPU per pod of every process over the window.

Bounded: 3 x 2 x (64 + 2,000) pods, 120 s of creates per run; about 3 minutes on 2 cores.
Writes bench/results/<date>-admission.json and prints markdown tables.

    make bench-admission
    python -m tests.bench.admission_load --name-prefix al-admission --pods 500 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import ssl
import statistics
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from tests.bench.cks import cks_policies
from tests.bench.histograms import Samples, difference, histograms, parse_samples, summary_ms, total
from tests.bench.peers import cpu_seconds
from tests.kube import api_client, create_namespace, raw_json

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
PODS, IN_FLIGHT, CAP_SECONDS, WARMUP, ROUNDS = 2000, 64, 120.0, 64, 3
NAMESPACES = ("team-a", "team-b", "team-c", "team-d")
GANG_SIZE = 8
# Shares of the pods; gangs are rounded down to whole gangs, CPU pods take what is left.
SHARES = {"gpu": 0.24, "gang": 0.26, "interruptable": 0.10}
GATE = "quorum.dev/gang"
CPU_TOLERATION = "is_cpu_compute"
GANG_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
INTERRUPTABLE = "qos.coreweave.cloud/interruptable"

WEBHOOK = "apiserver_admission_webhook_admission_duration_seconds"
STEP = "apiserver_admission_step_admission_duration_seconds"
PLUGIN = "apiserver_admission_controller_admission_duration_seconds"
MATCH = "apiserver_admission_match_condition_evaluation_seconds"
POLICY_CHECK = "apiserver_validating_admission_policy_check_duration_seconds"
REQUEST = "apiserver_request_duration_seconds"
QUEUE = "apiserver_flowcontrol_request_wait_duration_seconds"
SERVER = "quorum_webhook_request_duration_seconds"
APISERVER_HISTOGRAMS = (WEBHOOK, STEP, PLUGIN, MATCH, POLICY_CHECK, REQUEST, QUEUE)
PLUGINS = ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook", "ValidatingAdmissionPolicy")


WAYS = ("absent", "cks", "webhooks", "policies")


def ways(prefix: str, chosen: tuple[str, ...] = WAYS) -> dict[str, ClusterSpec]:
    specs = {
        "absent": ClusterSpec(
            name=f"{prefix}-absent", install_manifests=False, webhooks=False, operator=False
        ),
        "cks": ClusterSpec(name=f"{prefix}-cks", install_manifests=False, webhooks=False, operator=False),
        "webhooks": ClusterSpec(name=f"{prefix}-webhooks", operator=False, pod_admission="webhooks"),
        "policies": ClusterSpec(name=f"{prefix}-policies", operator=False, pod_admission="policies"),
    }
    return {way: specs[way] for way in chosen}


# -- the workload (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedPod:
    namespace: str
    kind: str  # cpu, gpu, gang, interruptable
    body: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def cpu_only(self) -> bool:
        return "nvidia.com/gpu" not in self.body["spec"]["containers"][0]["resources"].get("limits", {})


def mix(total: int) -> dict[str, int]:
    """How many pods of each kind `total` pods are made of."""
    gangs = int(total * SHARES["gang"]) // GANG_SIZE
    counts = {
        "gpu": int(total * SHARES["gpu"]),
        "gang": gangs * GANG_SIZE,
        "interruptable": int(total * SHARES["interruptable"]),
    }
    return {"cpu": total - sum(counts.values()), **counts}


def pod_body(name: str, kind: str, index: int, gang: str | None = None) -> dict[str, Any]:
    """A pod as a user's controller writes it (labels, annotations, a sidecar, some env): about
    2 KB of JSON, bare (no owner: nothing deletes it)."""
    gpus = {"gpu": 8, "gang": 1, "interruptable": 8 if index % 2 else 0}.get(kind, 0)
    resources: dict[str, Any] = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    if gpus:
        resources = {
            "requests": {"cpu": str(2 * gpus), "memory": f"{16 * gpus}Gi", "nvidia.com/gpu": str(gpus)},
            "limits": {"memory": f"{16 * gpus}Gi", "nvidia.com/gpu": str(gpus)},
        }
    labels = {
        "app": f"{kind}-work",
        "team": "ml",
        "app.kubernetes.io/name": f"{kind}-work",
        "app.kubernetes.io/part-of": "training",
        "app.kubernetes.io/version": "2.4.1",
    }
    spec: dict[str, Any] = {}
    if gang is not None:
        labels |= {GANG_LABEL: gang, "pod-group.scheduling.sigs.k8s.io/min-available": str(GANG_SIZE)}
        spec["schedulerName"] = "cw-coscheduler"
    if kind == "interruptable":
        labels[INTERRUPTABLE] = "true"
    env = [{"name": f"SETTING_{i}", "value": f"value-{i}-" + "x" * 20} for i in range(12)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
        },
        "spec": {
            **spec,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/ml/trainer:2.4.1",
                    "command": ["python", "-m", "trainer", "--config", "/etc/trainer/config.yaml"],
                    "env": env,
                    "resources": resources,
                    "ports": [{"containerPort": 9090, "name": "metrics"}],
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/trainer"}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 9090}, "periodSeconds": 10},
                },
                {
                    "name": "log-shipper",
                    "image": "registry.example.com/infra/shipper:1.9",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                },
            ],
            "volumes": [{"name": "config", "configMap": {"name": "trainer-config"}}],
        },
    }


def plan(total: int, prefix: str, seed: int = 14) -> list[PlannedPod]:
    """`total` pods of the mix in creation order: single pods and whole gangs (each gang's pods
    one after another) in a seeded shuffle, spread over the namespaces gang by gang."""
    counts = mix(total)
    units: list[list[tuple[str, int, str | None]]] = []
    for kind in ("cpu", "gpu", "interruptable"):
        units += [[(kind, i, None)] for i in range(counts[kind])]
    for g in range(counts["gang"] // GANG_SIZE):
        units.append([("gang", i, f"{prefix}-gang-{g:03d}") for i in range(GANG_SIZE)])
    random.Random(seed).shuffle(units)
    pods = []
    for u, unit in enumerate(units):
        namespace = NAMESPACES[u % len(NAMESPACES)]
        for kind, i, gang in unit:
            name = f"{gang}-{i}" if gang else f"{prefix}-{kind}-{i:04d}"
            pods.append(PlannedPod(namespace, kind, pod_body(name, kind, i, gang)))
    return pods


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# -- what the apiserver saw (pure) ---------------------------------------------------------


def apiserver_report(window: Samples) -> dict[str, dict[str, Any]]:
    """The admission figures of one window (the difference of two scrapes), by what they
    measure. Series are summed over the labels not named (e.g. `rejected`)."""

    def by(metric: str, labels: list[str], where: dict[str, str] | None = None) -> dict[str, Any]:
        found = histograms(window, metric, labels, where)
        return {" ".join(k): summary_ms(h) for k, h in sorted(found.items()) if h.count}

    plugins = by(PLUGIN, ["name", "operation"])
    return {
        "pod_create_request": by(REQUEST, ["verb"], {"verb": "POST", "resource": "pods", "subresource": ""}),
        "flowcontrol_wait": by(QUEUE, ["priority_level"], {"execute": "true"}),
        "admission_steps": by(STEP, ["type", "operation"]),
        "admission_plugins": {k: v for k, v in plugins.items() if k.split()[0] in PLUGINS},
        "webhooks": by(WEBHOOK, ["name", "operation"]),
        "match_conditions_excluding": by(MATCH, ["kind", "name", "operation"]),
        "policy_checks": by(POLICY_CHECK, ["policy", "enforcement_action"]),
    }


def server_report(window: Samples) -> dict[str, Any]:
    """quorum-webhooks' own answering time by webhook (`quorum_webhook_request_duration_seconds`)."""
    found = histograms(window, SERVER, ["webhook"])
    return {k[0]: summary_ms(h) for k, h in sorted(found.items()) if h.count}


# -- I/O -----------------------------------------------------------------------------------


def scrape(instance: Instance) -> Samples:
    status, body = instance.rest().get("/metrics", timeout=60)
    if status != 200:
        raise RuntimeError(f"GET /metrics: HTTP {status}: {body[:300]!r}")
    return parse_samples(body.decode(), APISERVER_HISTOGRAMS)


def scrape_webhook_server(instance: Instance) -> Samples:
    """quorum-webhooks' own /metrics (its time from request read to answer); none without it."""
    state = instance.state()
    assert state is not None
    if not state.spec.webhooks:
        return {}
    context = ssl.create_default_context(cafile=str(instance.layout.root / "webhooks-pki" / "ca.crt"))
    url = f"https://127.0.0.1:{state.ports.webhooks}/metrics"
    with urllib.request.urlopen(url, timeout=30, context=context) as response:
        return parse_samples(response.read().decode(), (SERVER,))


@dataclass
class Creates:
    latencies: list[float]
    errors: Counter[str]
    seconds: float
    capped: bool


async def create_all(api: client.ApiClient, pods: list[PlannedPod], cap: float) -> Creates:
    """Create the pods, IN_FLIGHT at a time, for at most `cap` seconds; each create's latency.
    Responses are read raw: the client's CPU (on the same 2 cores) stays small."""
    core, gate = client.CoreV1Api(api), asyncio.Semaphore(IN_FLIGHT)
    latencies: list[float] = []
    errors: Counter[str] = Counter()

    async def one(pod: PlannedPod) -> None:
        async with gate:
            sent = time.perf_counter()
            # kubernetes-asyncio types the result as a V1Pod; unpreloaded it is the raw response.
            response: Any = await core.create_namespaced_pod(pod.namespace, pod.body, _preload_content=False)
            body = await response.read()
            if response.status == 201:
                latencies.append(time.perf_counter() - sent)
            else:
                errors[f"HTTP {response.status}: {body[:120].decode(errors='replace')}"] += 1

    start, capped = time.perf_counter(), False
    tasks = [asyncio.create_task(one(p)) for p in pods]
    try:
        async with asyncio.timeout(cap):
            await asyncio.gather(*tasks)
    except TimeoutError:
        capped = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return Creates(latencies, errors, time.perf_counter() - start, capped)


async def what_quorum_did(api: client.ApiClient, pods: list[PlannedPod]) -> dict[str, int]:
    """Positive signs that admission ran (or not): gang pods carrying the gate, CPU pods the
    CPU toleration."""
    core = client.CoreV1Api(api)
    stored: dict[str, dict[str, Any]] = {}
    for namespace in NAMESPACES:
        listing = await raw_json(core.list_namespaced_pod(namespace, _preload_content=False))
        for item in listing["items"]:
            stored[item["metadata"]["name"]] = item["spec"]
    gang = [stored[p.name] for p in pods if p.kind == "gang" and p.name in stored]
    cpu = [stored[p.name] for p in pods if p.cpu_only and p.name in stored]
    return {
        "gang_pods": len(gang),
        "gang_pods_gated": sum(
            1 for s in gang if any(g["name"] == GATE for g in s.get("schedulingGates") or [])
        ),
        "cpu_pods": len(cpu),
        "cpu_pods_tolerating_cpu_nodes": sum(
            1 for s in cpu if any(t.get("key") == CPU_TOLERATION for t in s.get("tolerations") or [])
        ),
    }


@dataclass
class Run:
    """One way, one round: what the client and the apiserver saw over the 2,000 creates."""

    way: str
    round: int
    creates: Creates
    window: Samples  # the apiserver's histograms, after - before
    server_window: Samples  # quorum-webhooks' own
    cpu: dict[str, float]  # CPU seconds per process over the window
    stored: dict[str, int]
    load_average: tuple[float, float, float]
    settle_seconds: float  # from the instance up (and the way's policies applied) to quiet


async def measure(
    instance: Instance, total: int, cap: float
) -> tuple[Creates, Samples, Samples, dict[str, float], dict[str, int]]:
    admin = await api_client(instance.kubeconfig("admin"))
    customer = await api_client(instance.kubeconfig("customer"))
    async with admin, customer:
        for namespace in NAMESPACES:
            await create_namespace(admin, namespace, {"team": namespace})
        warm = await create_all(customer, plan(WARMUP, "warm", seed=1), cap)
        if warm.errors:
            raise RuntimeError(f"warm-up creates failed: {dict(warm.errors)}")
        pods = plan(total, "pod")
        before, cpu_before = await asyncio.to_thread(scrape, instance), cpu_seconds(instance)
        server_before = await asyncio.to_thread(scrape_webhook_server, instance)
        creates = await create_all(customer, pods, cap)
        after, cpu_after = await asyncio.to_thread(scrape, instance), cpu_seconds(instance)
        server_after = await asyncio.to_thread(scrape_webhook_server, instance)
        stored = await what_quorum_did(admin, pods)
    cpu = {k: v - cpu_before.get(k, 0.0) for k, v in cpu_after.items()}
    return creates, difference(after, before), difference(server_after, server_before), cpu, stored


def run_once(
    way: str, spec: ClusterSpec, round_: int, total: int, cap: float, say: Callable[[str], None]
) -> Run:
    """A fresh instance, kube-scheduler stopped, the creates; the instance is stopped after,
    whatever happens."""
    instance = Instance(spec.name)
    instance.down(quiet=True)
    load = os.getloadavg()
    try:
        say(f"round {round_}, {way}: starting instance {spec.name} ...")
        instance.up(spec, log=lambda _: None)
        instance.stop_component("kube-scheduler")
        if way == "cks":
            install_cks(instance)
        settled = settle(instance)
        say(f"round {round_}, {way}: creating {WARMUP} + {total} pods, {IN_FLIGHT} in flight ...")
        creates, window, server_window, cpu, stored = asyncio.run(measure(instance, total, cap))
    finally:
        instance.down(quiet=True)
    return Run(way, round_, creates, window, server_window, cpu, stored, load, settled)


QUIET_CORES, SETTLE_SECONDS = 0.25, 60.0


def settle(instance: Instance) -> float:
    """Wait until what installing a way sets off is over, so that the window measures pod
    creation alone: the apiserver's type check of every ValidatingAdmissionPolicy (written to its
    status when done; quorum installs more policies than `cks`), then the instance's processes
    using less than QUIET_CORES over a second. Bounded (SETTLE_SECONDS); the seconds it took."""
    start = time.monotonic()
    deadline = start + SETTLE_SECONDS
    instance.wait_type_checked(timeout=SETTLE_SECONDS)
    while time.monotonic() < deadline:
        before = cpu_seconds(instance)
        time.sleep(1.0)
        after = cpu_seconds(instance)
        busy = sum(v - before.get(k, 0.0) for k, v in after.items() if k != "benchmark client")
        if busy < QUIET_CORES:
            break
    return round(time.monotonic() - start, 1)


def install_cks(instance: Instance) -> None:
    """Apply the `cks` way's policies, and wait until a CPU pod created (dry run) gets the
    toleration: the apiserver compiles new policies in the background."""
    listed = {"apiVersion": "v1", "kind": "List", "items": cks_policies()}
    instance.kubectl("apply", "-f", "-", input_text=json.dumps(listed))
    probe = pod_body("cks-probe", "cpu", 0)
    probe["metadata"]["namespace"] = "default"
    deadline = time.monotonic() + 60
    while True:
        made = instance.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input_text=json.dumps(probe), check=False
        )
        tolerations = json.loads(made.stdout or "{}").get("spec", {}).get("tolerations") or []
        if any(t.get("key") == CPU_TOLERATION for t in tolerations):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cks policies did not take effect: {made.stderr.strip()}")
        time.sleep(0.5)


# -- summaries (pure) ----------------------------------------------------------------------


def client_summary(latencies: list[float]) -> dict[str, float | None]:
    ms = [s * 1000 for s in latencies]
    return {
        "p50_ms": round(percentile(ms, 0.5), 1) if ms else None,
        "p99_ms": round(percentile(ms, 0.99), 1) if ms else None,
        "mean_ms": round(statistics.fmean(ms), 1) if ms else None,
    }


def cpu_ms_per_pod(cpu: dict[str, float], pods: int) -> dict[str, float]:
    per_pod = {k: round(v * 1000 / max(pods, 1), 2) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])}
    return per_pod | {"all processes": round(sum(cpu.values()) * 1000 / max(pods, 1), 2)}


def round_summary(run: Run) -> dict[str, Any]:
    created = len(run.creates.latencies)
    post = apiserver_report(run.window)["pod_create_request"].get("POST", {})
    return {
        "round": run.round,
        "pods_created": created,
        "errors": dict(run.creates.errors),
        "capped": run.creates.capped,
        "seconds": round(run.creates.seconds, 2),
        "pods_per_second": round(created / run.creates.seconds, 1),
        "client": client_summary(run.creates.latencies),
        "apiserver_post_pods": post,
        "cpu_ms_per_pod": cpu_ms_per_pod(run.cpu, created),
        "stored": run.stored,
        "load_average_before": [round(x, 2) for x in run.load_average],
        "settle_seconds": run.settle_seconds,
    }


def way_summary(runs: list[Run]) -> dict[str, Any]:
    """The rounds of one way pooled: every create's latency, the histogram windows summed (one
    histogram of all rounds' observations), CPU per pod over all pods; pods/s the rounds'
    median."""
    created = sum(len(r.creates.latencies) for r in runs)
    cpu: dict[str, float] = {}
    for r in runs:
        for k, v in r.cpu.items():
            cpu[k] = cpu.get(k, 0.0) + v
    return {
        "pods_created": created,
        "pods_per_second_median": statistics.median(
            round(len(r.creates.latencies) / r.creates.seconds, 1) for r in runs
        ),
        "client": client_summary([x for r in runs for x in r.creates.latencies]),
        "apiserver": apiserver_report(total([r.window for r in runs]))
        | {"webhook_server": server_report(total([r.server_window for r in runs]))},
        "cpu_ms_per_pod": cpu_ms_per_pod(cpu, created),
        "rounds": [round_summary(r) for r in runs],
    }


# -- report --------------------------------------------------------------------------------

POD_CREATE_WEBHOOKS = ("mutate-pods", "validate-pods", "validate-interruptable")


def against(summaries: dict[str, dict[str, Any]], baseline: str) -> dict[str, dict[str, Any]]:
    """Each way with quorum beside `baseline` (`absent`, `cks`): CPU per pod (all processes),
    client p50 and pods/s as ratios; and how many calls quorum-webhooks answered for the webhooks
    that pod creation reaches."""
    base = summaries.get(baseline)
    if base is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for way, summary in summaries.items():
        if way in ("absent", "cks"):
            continue
        served = summary["apiserver"]["webhook_server"]
        out[way] = {
            "cpu": round(
                summary["cpu_ms_per_pod"]["all processes"] / base["cpu_ms_per_pod"]["all processes"], 2
            ),
            "p50": round(summary["client"]["p50_ms"] / base["client"]["p50_ms"], 2),
            "pods_per_second": round(summary["pods_per_second_median"] / base["pods_per_second_median"], 2),
            "pod_create_calls": sum(served.get(w, {}).get("count", 0) for w in POD_CREATE_WEBHOOKS),
        }
    return out


ROWS: tuple[tuple[str, str], ...] = (
    ("pod_create_request", "apiserver request POST pods"),
    ("flowcontrol_wait", "APF queue wait, priority level"),
    ("admission_steps", "admission step"),
    ("admission_plugins", "admission plugin"),
    ("webhooks", "webhook"),
    ("match_conditions_excluding", "matchConditions (excluding)"),
    ("policy_checks", "policy check"),
    ("webhook_server", "quorum-webhooks answering"),
)


def markdown(ways_: dict[str, dict[str, Any]]) -> str:
    """The pooled figures of each way side by side, then each round's headline figures."""
    names = list(ways_)
    lines = [
        "| | " + " | ".join(f"{n} p50 | {n} p99 | {n} mean | {n} n" for n in names) + " |",
        "|---|" + "---:|" * (4 * len(names)),
    ]

    def cells(figure: dict[str, Any] | None) -> str:
        if not figure:
            return "– | – | – | 0"
        first = figure.get("first_bucket_ms")

        def value(key: str) -> str:
            v = figure.get(key)
            if v is None:
                return "–"
            # In the first bucket: interpolated from 0, it only says "under that bound".
            in_first = key != "mean_ms" and first is not None and first > 0 and v <= first
            return f"{v:g}*" if in_first else f"{v:g}"

        count = figure.get("count")
        return " | ".join(value(k) for k in ("p50_ms", "p99_ms", "mean_ms")) + (
            f" | {count:,}" if count is not None else " | "
        )

    summaries = [ways_[n] for n in names]
    lines.append(
        "| client: pod create latency (ms) | "
        + " | ".join(cells(w["client"] | {"count": w["pods_created"]}) for w in summaries)
        + " |"
    )
    lines.append(
        "| client: pods/s (median of rounds) | "
        + " | ".join(f"{w['pods_per_second_median']:g} | | | " for w in summaries)
        + " |"
    )
    processes = sorted(
        {k for w in summaries for k in w["cpu_ms_per_pod"]},
        key=lambda k: (k == "all processes", -max(w["cpu_ms_per_pod"].get(k, 0) for w in summaries)),
    )
    for process in processes:
        lines.append(
            f"| CPU ms per pod: {process} | "
            + " | ".join(
                f"{w['cpu_ms_per_pod'][process]:g} | | | " if process in w["cpu_ms_per_pod"] else "– | | | "
                for w in summaries
            )
            + " |"
        )
    for section, title in ROWS:
        keys = sorted({k for w in summaries for k in w["apiserver"][section]})
        for key in keys:
            label = title if key == "POST" else f"{title} {key}"
            row = [w["apiserver"][section].get(key) for w in summaries]
            lines.append(f"| {label} (ms) | " + " | ".join(cells(f) for f in row) + " |")
    lines.append(
        "\n\\* in the histogram's first bucket (0 to its lowest bound: 5 ms for webhooks, steps and"
        " plugins, 1 ms for matchConditions, 0.1 ms for quorum-webhooks' own): interpolated from 0, so"
        ' it says only "under that bound"; the mean (from _sum and _count) is exact.\n'
    )
    lines += [
        "| round | way | pods/s | client p50 / p99 (ms) | apiserver POST pods p50 / p99 (ms)"
        " | CPU ms per pod (all) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    rounds = sorted((r["round"], n, r) for n in names for r in ways_[n]["rounds"])
    for number, name, r in rounds:
        post = r["apiserver_post_pods"]
        lines.append(
            f"| {number} | {name} | {r['pods_per_second']:g} | {r['client']['p50_ms']:g} / "
            f"{r['client']['p99_ms']:g} | {post.get('p50_ms', '–')} / {post.get('p99_ms', '–')} | "
            f"{r['cpu_ms_per_pod']['all processes']:g} |"
        )
    return "\n".join(lines) + "\n"


def round_order(ways_: tuple[str, ...], round_: int) -> tuple[str, ...]:
    """The order the ways run in round `round_` (from 1): as given, reversed every other round."""
    return ways_ if round_ % 2 else ways_[::-1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=PODS)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="each way this many times, in turn")
    parser.add_argument("--cap", type=float, default=CAP_SECONDS, help="seconds of creates per run, at most")
    parser.add_argument("--name-prefix", default="bench-admission", help="instance names: <prefix>-<way>")
    parser.add_argument(
        "--way",
        action="append",
        choices=WAYS,
        default=None,
        help=f"only these ways (default: {', '.join(WAYS)})",
    )
    args = parser.parse_args()
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.monotonic()
    specs = ways(args.name_prefix, tuple(args.way) if args.way else WAYS)
    runs: dict[str, list[Run]] = {way: [] for way in specs}
    for round_ in range(1, max(1, args.rounds) + 1):
        for way in round_order(tuple(specs), round_):
            runs[way].append(run_once(way, specs[way], round_, args.pods, args.cap, say))
    summaries = {way: way_summary(r) for way, r in runs.items()}
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    data = {
        "date": stamp,
        "pods_per_round": args.pods,
        "mix": mix(args.pods),
        "warm_up_pods": WARMUP,
        "in_flight": IN_FLIGHT,
        "cap_seconds": args.cap,
        "rounds": args.rounds,
        "seconds": round(time.monotonic() - started, 1),
        "instances": {way: spec.to_json() | {"feature_gates": "default"} for way, spec in specs.items()},
        "ways": summaries,
        "against_absent": against(summaries, "absent"),
        "against_cks": against(summaries, "cks"),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.pods == PODS and args.rounds == ROUNDS else f"-{args.pods}x{args.rounds}"
    out = RESULTS / f"{stamp}-admission{suffix}.json"
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(markdown(summaries))
    for baseline in ("absent", "cks"):
        for way, figures in data[f"against_{baseline}"].items():
            print(
                f"{way} / {baseline}: CPU per pod {figures['cpu']:g}x, client p50 {figures['p50']:g}x, "
                f"pods/s {figures['pods_per_second']:g}x; calls to quorum-webhooks for pod creation: "
                f"{figures['pod_create_calls']}"
            )
    for way, summary in summaries.items():
        for r in summary["rounds"]:
            print(
                f"{way} round {r['round']}: stored {r['stored']}; errors {r['errors'] or 'none'}; "
                f"capped {r['capped']}; load average before {r['load_average_before']}"
            )
    print(f"\nwritten to {out} ({data['seconds']} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
