"""Who may connect to quorum-sunk-scheduler (manifests/optional/sunk-scheduler.yaml): its hook
port only the Slurm nodes (Slurm's namespace, or the address blocks `quorum manifests
--slurm-cidr` puts in its place), its metrics port only scrapers, as for quorum's other pods. The
two are ports of their own, so neither admits the other's callers."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from quorum.cli import main
from quorum.install import SUNK_MANIFEST, render_files
from quorum.sunk.hooks import make_app, make_metrics_app
from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.settings import SunkSettings
from tests.unit.sunk.fakes import FakeSlurm, FakeSunkApi

JSON = dict[str, Any]
NAME = "quorum-sunk-scheduler"
SCRAPERS = {"namespaceSelector": {"matchLabels": {"quorum.dev/metrics-scraper": "true"}}}
SLURM_NAMESPACE = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tenant-slurm"}}}


def documents(apiserver_cidrs: tuple[str, ...] = (), slurm_cidrs: tuple[str, ...] = ()) -> list[JSON]:
    rendered = render_files(
        [SUNK_MANIFEST], "quorum-system", apiserver_cidrs=apiserver_cidrs, slurm_cidrs=slurm_cidrs
    )
    return [d for d in yaml.safe_load_all(rendered) if d]


def ingress(docs: list[JSON]) -> dict[int, list[JSON]]:
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == NAME]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == NAME)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items(), "it selects the scheduler"
    found: dict[int, list[JSON]] = {}
    for rule in policy["spec"]["ingress"]:
        (port,) = rule["ports"]
        assert port["protocol"] == "TCP"
        found[port["port"]] = rule["from"]
    return found


def test_the_hook_port_admits_the_slurm_nodes_and_the_metrics_port_the_scrapers() -> None:
    docs = documents()
    assert ingress(docs) == {8091: [SLURM_NAMESPACE], 8092: [SCRAPERS]}
    container = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"hooks": 8091, "metrics": 8092}
    assert container["args"] == ["--address=0.0.0.0:8091", "--metrics-address=0.0.0.0:8092"]
    service = next(d for d in docs if d["kind"] == "Service")
    assert [p["name"] for p in service["spec"]["ports"]] == ["hooks"], "the Slurm nodes reach only the hooks"


def test_slurm_nodes_outside_the_pod_network_are_admitted_by_address_block_instead() -> None:
    narrowed = ingress(documents(slurm_cidrs=("10.20.0.0/16", "fd00::7")))
    assert narrowed == {
        8091: [{"ipBlock": {"cidr": "10.20.0.0/16"}}, {"ipBlock": {"cidr": "fd00::7/128"}}],
        8092: [SCRAPERS],
    }
    assert ingress(documents(apiserver_cidrs=("10.0.0.5",))) == ingress(documents()), "not the webhook's"
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        documents(slurm_cidrs=("slurm-nodes",))


def test_the_command_prints_the_sunk_scheduler_only_when_asked_for_its_slurm_nodes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["manifests"]) == 0
    kinds = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(capsys.readouterr().out) if d}
    assert ("Deployment", "quorum-sunk-scheduler") not in kinds
    assert main(["manifests", "--namespace", "ml-platform", "--slurm-cidr", "192.168.7.0/24"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert ingress(docs)[8091] == [{"ipBlock": {"cidr": "192.168.7.0/24"}}]
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] == "NetworkPolicy"} == {"ml-platform"}
    assert ingress(docs)[8092] == [SCRAPERS]


async def status(app: Any, method: str, path: str) -> int:
    async with TestClient(TestServer(app)) as http:
        return (await http.request(method, path)).status


async def test_metrics_are_served_apart_from_the_hooks_when_the_process_has_a_metrics_port() -> None:
    scheduler = SunkScheduler(SunkSettings(), FakeSunkApi(), FakeSlurm())
    hooks, metrics = make_app(scheduler, "t" * 32, with_metrics=False), make_metrics_app(scheduler)
    assert await status(hooks, "GET", "/metrics") == 404
    assert await status(hooks, "POST", "/hooks/stop?job=1") == 401
    assert await status(metrics, "GET", "/metrics") == 200
    assert await status(metrics, "POST", "/hooks/stop?job=1") == 404
    assert await status(make_app(scheduler, "t" * 32), "GET", "/metrics") == 200, "one port by default"
