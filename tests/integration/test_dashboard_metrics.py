"""dashboards/quorum.json against the `/metrics` of the running processes of the local control
plane: quorum-operator (its health address) and quorum-webhooks (their HTTPS port), and
quorum-sunk-scheduler when the instance runs Slurm (`make up SLURM=1`; otherwise its row is
checked in-process only, by tests/unit/test_dashboard.py). Each row's queries must name series
its process serves. Names only: labels of children made on first use (a gang's phase, an API
request's code) appear in a scrape only once something happened, so tests/unit/test_dashboard.py
checks the labels against the processes' collectors."""

from __future__ import annotations

import dataclasses
import json
import ssl
import urllib.request
from pathlib import Path

import pytest

from devcluster.cluster import Instance
from tests.dashboard_check import Exported, expressions, problems

pytestmark = pytest.mark.cluster

DASHBOARD = Path(__file__).parents[2] / "dashboards" / "quorum.json"


def scrape(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, context=context, timeout=10) as response:
        assert response.status == 200
        return str(response.read().decode())


def test_every_query_names_what_the_running_processes_export(cluster: Instance) -> None:
    state = cluster.state()
    assert state is not None
    ports = state.ports
    webhooks_ca = ssl.create_default_context(cafile=str(cluster.layout.root / "webhooks-pki" / "ca.crt"))
    exported = {
        "quorum-operator": Exported().add_text(scrape(f"http://127.0.0.1:{ports.operator}/metrics")),
        "quorum-webhooks": Exported().add_text(
            scrape(f"https://127.0.0.1:{ports.webhooks}/metrics", webhooks_ca)
        ),
    }
    if ports.sunk:
        exported["quorum-sunk-scheduler"] = Exported().add_text(
            scrape(f"http://127.0.0.1:{ports.sunk}/metrics")
        )
    dashboard = json.loads(DASHBOARD.read_text())
    checked = 0
    for query in expressions(dashboard):
        process = (query.row or "quorum-operator").split(":")[0].split(" ")[0]
        if process not in exported:
            continue
        assert problems([query], exported[process], check_labels=False) == [], query.row
        checked += 1
    assert checked >= 40
    # The scrape is not trivially satisfied: a misspelt name is not found in it.
    wrong = next(q for q in expressions(dashboard) if "quorum_operator_leader" in q.expr)
    misspelt = dataclasses.replace(
        wrong, expr=wrong.expr.replace("quorum_operator_leader", "quorum_operator_leadr")
    )
    assert problems([misspelt], exported["quorum-operator"], check_labels=False)
