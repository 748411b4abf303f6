"""The Kueue way of the peer benchmark, its pure parts: the one-line patch of Kueue's main, its
webhooks for a local apiserver, its configuration and queues, and the pods it is given."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.build import BuildError
from devcluster.kueue import (
    METRICS_CERT_ENV,
    cluster_queue_objects,
    local_queue,
    local_webhooks,
    manager_config,
    patch_metrics_cert_dir,
    pool_quota,
)
from devcluster.nodes import load_pool, render_nodes
from tests.bench.peer_report import markdown
from tests.bench.peer_workloads import gang_pod, kueue_gang_pod, uniform_gangs, write_pool
from tests.bench.peers import gpu_node_labels

MAIN_GO = """\tvar metricsCertWatcher *certwatcher.CertWatcher
\tif cfg.InternalCertManagement == nil || !*cfg.InternalCertManagement.Enable {
\t\tmetricsCertPath := "/etc/kueue/metrics/certs"
\t\tsetupLog.Info("Initializing metrics certificate watcher using provided certificates",
"""


def test_patch_takes_the_metrics_cert_dir_from_the_environment_when_set() -> None:
    patched = patch_metrics_cert_dir(MAIN_GO)
    assert (
        f'if dir := os.Getenv("{METRICS_CERT_ENV}"); dir != "" {{\n\t\t\tmetricsCertPath = dir\n\t\t}}'
        in patched
    )
    assert patched.startswith(
        MAIN_GO.split("metricsCertPath")[0] + 'metricsCertPath := "/etc/kueue/metrics/certs"\n'
    )
    assert patched.endswith(
        'setupLog.Info("Initializing metrics certificate watcher using provided certificates",\n'
    )


def test_patch_refuses_a_main_it_does_not_recognise() -> None:
    with pytest.raises(BuildError):
        patch_metrics_cert_dir(MAIN_GO.replace("/etc/kueue", "/etc/other"))


def webhook(name: str, group: str, resource: str, path: str) -> dict[str, Any]:
    return {
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
        "failurePolicy": "Fail",
        "name": name,
        "rules": [
            {"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": [resource]}
        ],
        "sideEffects": "None",
    }


MANIFEST = yaml.safe_dump_all(
    [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mutating-webhook-configuration"},
            "webhooks": [
                webhook("mjob.kb.io", "batch", "jobs", "/mutate-batch-v1-job"),
                webhook("mpod.kb.io", "", "pods", "/mutate--v1-pod"),
                webhook(
                    "mworkload.kb.io",
                    "kueue.x-k8s.io",
                    "workloads",
                    "/mutate-kueue-x-k8s-io-v1beta2-workload",
                ),
            ],
        },
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "webhook-service"}},
    ]
)


def test_local_webhooks_keep_the_served_ones_pointed_at_the_url_with_the_ca() -> None:
    (config,) = local_webhooks(MANIFEST, "https://127.0.0.1:9443/", b"CA")
    assert config["metadata"] == {"name": "kueue-mutating-webhook-configuration"}
    assert [w["name"] for w in config["webhooks"]] == ["mpod.kb.io", "mworkload.kb.io"]
    pod, workload = config["webhooks"]
    assert pod["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate--v1-pod",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert pod["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kueue-system"]}
    ]
    assert "namespaceSelector" not in workload
    assert workload["clientConfig"]["url"].endswith("/mutate-kueue-x-k8s-io-v1beta2-workload")


def test_manager_config_runs_the_pod_integration_alone_out_of_cluster() -> None:
    config = manager_config(qps=500.0, burst=1000, webhook_port=1, health_port=2, cert_dir=Path("/c"))
    assert config["integrations"] == {"frameworks": ["pod"]}
    assert config["clientConnection"] == {"qps": 500.0, "burst": 1000}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 1, "certDir": "/c"}
    assert config["health"] == {"healthProbeBindAddress": "127.0.0.1:2"}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["metrics"] == {"bindAddress": "0"}


def test_pool_quota_is_the_schedulable_capacity(tmp_path: Path) -> None:
    nodes = render_nodes(load_pool(write_pool(tmp_path / "pool.yaml", 3, 2)))
    nodes.append({"spec": {"unschedulable": True}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    assert pool_quota(nodes) == {
        "cpu": str(3 * 128 + 2 * 64),
        "memory": str(3 * 2**40 + 2 * 512 * 2**30),
        "nvidia.com/gpu": "24",
    }


def test_cluster_queue_covers_the_quota_in_one_flavor_and_the_local_queue_feeds_it() -> None:
    flavor, queue = cluster_queue_objects({"cpu": "4", "nvidia.com/gpu": "8"})
    assert flavor["kind"] == "ResourceFlavor"
    (group,) = queue["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "nvidia.com/gpu"]
    assert group["flavors"] == [
        {
            "name": flavor["metadata"]["name"],
            "resources": [
                {"name": "cpu", "nominalQuota": "4"},
                {"name": "nvidia.com/gpu", "nominalQuota": "8"},
            ],
        }
    ]
    lq = local_queue("bench")
    assert lq["metadata"] == {"name": queue["metadata"]["name"], "namespace": "bench"}
    assert lq["spec"] == {"clusterQueue": queue["metadata"]["name"]}


def test_topology_aware_flavor_is_the_labelled_nodes_with_the_pools_levels() -> None:
    topology, flavor, queue = cluster_queue_objects({"nvidia.com/gpu": "8"}, "q", {"gpu": "h100"})
    assert topology["kind"] == "Topology"
    assert [level["nodeLabel"] for level in topology["spec"]["levels"]] == [
        "topology.kubernetes.io/zone",
        "network.topology.kubernetes.io/block",
        "network.topology.kubernetes.io/rack",
        "kubernetes.io/hostname",
    ]
    assert flavor["spec"] == {"nodeLabels": {"gpu": "h100"}, "topologyName": topology["metadata"]["name"]}
    assert queue["metadata"]["name"] == "q"
    assert queue["spec"]["resourceGroups"][0]["flavors"][0]["name"] == flavor["metadata"]["name"]


def test_pool_quota_of_the_labelled_nodes_only(tmp_path: Path) -> None:
    pool = load_pool(write_pool(tmp_path / "pool.yaml", 3, 2))
    labels = gpu_node_labels(pool)
    assert labels == {"gpu.nvidia.com/class": "H100_NVLINK_80GB"}
    assert pool_quota(render_nodes(pool), labels) == {
        "cpu": str(3 * 128),
        "memory": str(3 * 2**40),
        "nvidia.com/gpu": "24",
    }


def test_kueue_pods_are_the_default_schedulers_pods_with_kueues_group_metadata() -> None:
    (gang,) = uniform_gangs(1, 8)
    pod, plain = kueue_gang_pod(gang, 3, 20, "bench"), gang_pod(gang, 3, "default-scheduler", 20)
    assert pod["spec"] == plain["spec"]
    assert pod["metadata"]["labels"] == {
        **plain["metadata"]["labels"],
        "kueue.x-k8s.io/queue-name": "bench",
        "kueue.x-k8s.io/pod-group-name": "g000",
    }
    assert pod["metadata"]["annotations"] == {
        **plain["metadata"]["annotations"],
        "kueue.x-k8s.io/pod-group-total-count": "8",
    }
    topology_aware = kueue_gang_pod(gang, 3, 20, "bench", "network.topology.kubernetes.io/block")
    assert topology_aware["metadata"]["annotations"] == {
        **pod["metadata"]["annotations"],
        "kueue.x-k8s.io/podset-preferred-topology": "network.topology.kubernetes.io/block",
    }


def test_report_gives_quorum_over_kueue_beside_quorum_over_scheduler_plugins() -> None:
    def round_of(quorum: float, coscheduling: float, kueue: float) -> list[dict[str, Any]]:
        return [
            {"mode": "quorum", "pods_bound_per_second": quorum, "finished": True},
            {"mode": "coscheduling", "pods_bound_per_second": coscheduling, "finished": True},
            {"mode": "kueue", "pods_bound_per_second": kueue, "finished": True},
        ]

    rounds = [round_of(100.0, 200.0, 50.0), round_of(90.0, 100.0, 90.0)]
    scenario = {"gpu_nodes": 5, "gangs": 1, "pods": 8, "runs": rounds[0], "rounds": rounds}
    text = markdown({"date": "d", "scenarios": {"throughput": scenario}})
    assert "| | quorum | scheduler-plugins | Kueue | quorum / scheduler-plugins | quorum / Kueue |" in text
    assert "|---|---:|---:|---:|---:|---:|" in text
    assert "| pods bound per second | 100.0 | 200.0 | 50.0 | 0.50 | 2.00 |" in text
    assert "| 2 | 90.0 | 100.0 | 90.0 | 0.90 | 1.00 |" in text
    assert "| median |  |  |  | 0.70 | 1.50 |" in text
