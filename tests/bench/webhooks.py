"""Benchmark of quorum-webhooks alone on loopback, with wrk over keep-alive TLS connections.

The server runs as its own process pinned to CPU 0, wrk to CPU 1. For each review (a ~5 KB
labelled CPU pod, which takes the patch path; a GPU pod; a Node label update that is denied):

1. maximum rate: 16 connections for 10 s -> reviews/s, and CPU microseconds per review (the
   server's utime+stime over the run / reviews answered);
2. half load: the same connections paced (wrk's `delay()`) to about half the maximum rate ->
   p50 / p99 latency.

Bounded: six 10-second wrk runs. Writes bench/results/<date>-webhooks.json, prints a table.

    make bench-webhooks
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quorum.webhooks.tls import dev_certificates

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
DURATION = 10
CONNECTIONS = 16


def realistic_pod(gpu: bool) -> dict[str, Any]:
    """A pod as a ReplicaSet creates it and the apiserver sends it to mutating webhooks."""
    env = [{"name": f"SETTING_{i}", "value": f"value-{i}-" + "x" * 20} for i in range(12)]
    resources: dict[str, Any] = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    if gpu:
        resources["limits"]["nvidia.com/gpu"] = "8"
        resources["requests"]["nvidia.com/gpu"] = "8"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "trainer-7d9f8c6b5-",
            "namespace": "ml-team",
            "labels": {
                "app": "trainer",
                "pod-template-hash": "7d9f8c6b5",
                "team": "ml",
                "app.kubernetes.io/name": "trainer",
                "app.kubernetes.io/part-of": "llm",
                "app.kubernetes.io/version": "2.4.1",
            },
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
                "kubectl.kubernetes.io/restartedAt": "2026-11-20T10:00:00Z",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-7d9f8c6b5",
                    "uid": "6f1c2d7e-1111-4a4a-9b9b-0c0c0c0c0c0c",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-22T10:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {
                            "f:generateName": {},
                            "f:labels": {"f:app": {}, "f:pod-template-hash": {}, "f:team": {}},
                        }
                    },
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/ml/trainer:2.4.1",
                    "command": ["python", "-m", "trainer", "--config", "/etc/trainer/config.yaml"],
                    "env": env,
                    "resources": resources,
                    "ports": [{"containerPort": 9090, "name": "metrics", "protocol": "TCP"}],
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/trainer"},
                        {"name": "data", "mountPath": "/data"},
                        {
                            "name": "kube-api-access-abcde",
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        },
                    ],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 9090}, "periodSeconds": 10},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                },
                {
                    "name": "log-shipper",
                    "image": "registry.example.com/infra/shipper:1.9",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                },
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "trainer-config", "defaultMode": 420}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
                {
                    "name": "kube-api-access-abcde",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                },
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def review(
    kind: str, obj: dict[str, Any], old: dict[str, Any] | None = None, operation: str = "CREATE"
) -> str:
    group = {"Pod": "", "Node": ""}[kind]
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": group, "version": "v1", "kind": kind},
                "resource": {"group": group, "version": "v1", "resource": kind.lower() + "s"},
                "requestKind": {"group": group, "version": "v1", "kind": kind},
                "requestResource": {"group": group, "version": "v1", "resource": kind.lower() + "s"},
                "namespace": "ml-team" if kind == "Pod" else "",
                "operation": operation,
                "userInfo": {
                    "username": "system:serviceaccount:kube-system:replicaset-controller",
                    "uid": "a1b2c3",
                    "groups": [
                        "system:serviceaccounts",
                        "system:serviceaccounts:kube-system",
                        "system:authenticated",
                    ],
                },
                "object": obj,
                "oldObject": old,
                "dryRun": False,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        }
    )


def node_update() -> tuple[dict[str, Any], dict[str, Any]]:
    old = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-h100-001",
            "labels": {"kubernetes.io/hostname": "gpu-h100-001", "node.coreweave.cloud/state": "production"},
        },
        "spec": {},
        "status": {},
    }
    new = json.loads(json.dumps(old))
    new["metadata"]["labels"]["foo.coreweave.cloud/bar"] = "true"
    return new, old


CASES = {
    "cpu-pod (patch)": ("/mutate/pods", review("Pod", realistic_pod(gpu=False))),
    "gpu-pod (no patch)": ("/mutate/pods", review("Pod", realistic_pod(gpu=True))),
    "node label (denied)": ("/validate/reserved-labels", review("Node", *node_update(), operation="UPDATE")),
}

LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("{body}", "rb"); wrk.body = f:read("*a"); f:close()
{delay}
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_wrk(url: str, script: Path) -> dict[str, float]:
    out = subprocess.run(
        [
            "taskset",
            "-c",
            "1",
            "wrk",
            "-t1",
            f"-c{CONNECTIONS}",
            f"-d{DURATION}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=DURATION + 30,
    ).stdout
    requests = int(re.search(r"(\d+) requests in", out)[1])  # type: ignore[index]
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)

    def pct(p: str) -> float:
        m = re.search(rf"\s{p}%\s+([\d.]+)(us|ms|s)", out)
        if not m:
            return float("nan")
        return float(m[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m[2]]

    return {
        "requests": requests,
        "rate": rate,
        "p50_ms": pct("50"),
        "p99_ms": pct("99"),
        "non_2xx": int(non2xx[1]) if non2xx else 0,
        "socket_errors": bool(errors),
    }


def main() -> int:
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        print("needs wrk and taskset: apt-get install -y wrk util-linux", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="quorum-bench-"))
    _, cert, key = dev_certificates(work / "tls")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(
        [
            "taskset",
            "-c",
            "0",
            sys.executable,
            "-m",
            "quorum.webhooks.main",
            f"--port={port}",
            f"--cert-file={cert}",
            f"--key-file={key}",
            "--log-level=WARNING",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    results: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        for name, (path, body) in CASES.items():
            body_file = work / f"{len(results)}.json"
            body_file.write_text(body)
            url = f"https://127.0.0.1:{port}{path}"
            script = work / "max.lua"
            script.write_text(LUA.format(body=body_file, delay=""))
            run_wrk(url, script)  # warm-up (also checks the case answers 200)
            before = cpu_seconds(server.pid)
            peak = run_wrk(url, script)
            cpu = cpu_seconds(server.pid) - before
            delay_ms = max(1, round(CONNECTIONS * 1000 / (peak["rate"] / 2)))  # per connection
            # Random pauses (mean delay_ms) so that connections do not send in lock-step bursts.
            pace = f"function delay() return math.random(0, {2 * delay_ms}) end"
            script.write_text(LUA.format(body=body_file, delay=pace))
            half = run_wrk(url, script)
            results.append(
                {
                    "case": name,
                    "body_bytes": len(body),
                    "max_reviews_per_s": round(peak["rate"]),
                    "cpu_us_per_review": round(cpu / peak["requests"] * 1e6, 1),
                    "half_load_reviews_per_s": round(half["rate"]),
                    "p50_ms": half["p50_ms"],
                    "p99_ms": half["p99_ms"],
                    "non_2xx": peak["non_2xx"] + half["non_2xx"],
                }
            )
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out = RESULTS / f"{stamp}-webhooks.json"
    out.write_text(
        json.dumps(
            {"date": stamp, "connections": CONNECTIONS, "duration_s": DURATION, "results": results}, indent=2
        )
        + "\n"
    )
    print("| review | body (bytes) | max reviews/s | CPU µs/review | half-load rate | p50 (ms) | p99 (ms) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['case']} | {r['body_bytes']} | {r['max_reviews_per_s']} | {r['cpu_us_per_review']} | "
            f"{r['half_load_reviews_per_s']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |"
        )
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
