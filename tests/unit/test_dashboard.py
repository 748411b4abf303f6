"""dashboards/quorum.json queries only what quorum's processes export, and is a dashboard Grafana
can load.

The names come from the processes' real registries, served the way their main() serves them:
quorum-operator's health app (after importing its handlers, as `quorum.operator.main` does),
quorum-webhooks' app (`make_app`, which makes every webhook's children) and
quorum-sunk-scheduler's metrics app (its module-level metrics, on prometheus_client's default
registry). Each `/metrics` body is read with prometheus_client's parser; a family with no
sample yet (labelled children made on first use: the SUNK counters, `quorum_operator_gangs`)
still has its `# TYPE` line. Labels come from the samples and from the collectors' label names.
tests/integration/test_dashboard_metrics.py checks the same names against the running processes
of the local control plane.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.metrics import MetricWrapperBase

# What the processes' main() import: every metric they register.
import quorum.operator.handlers
import quorum.sunk.main  # noqa: F401
from quorum.operator import health as operator_health
from quorum.operator import metrics as operator_metrics
from quorum.sunk import hooks as sunk_hooks
from quorum.sunk import scheduler as sunk_scheduler
from quorum.sunk.settings import SunkSettings
from quorum.webhooks.server import METRICS_KEY
from quorum.webhooks.server import make_app as webhooks_app
from quorum.webhooks.settings import WebhookSettings
from tests.dashboard_check import (
    Exported,
    Query,
    expressions,
    problems,
    references,
    structure_problems,
)
from tests.unit.sunk.fakes import FakeSlurm, FakeSunkApi

DASHBOARD = Path(__file__).parents[2] / "dashboards" / "quorum.json"
PROCESS_OF_ROW = {
    "quorum-operator": "operator",
    "quorum-webhooks": "webhooks",
    "quorum-sunk-scheduler": "sunk",
}
"""A row's title starts with the name of the process whose metrics it shows."""
NOT_ON_DASHBOARD: frozenset[str] = frozenset()
"""quorum's own metric families deliberately left off the dashboard."""


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def labelnames(*owners: object) -> dict[str, tuple[str, ...]]:
    """Family name -> label names of the metrics that are attributes of `owners`."""
    return {
        value._name: tuple(value._labelnames)
        for owner in owners
        for value in vars(owner).values()
        if isinstance(value, MetricWrapperBase)
    }


async def scrape(app: web.Application) -> str:
    http: TestClient[Any, Any] = TestClient(TestServer(app))
    await http.start_server()
    try:
        response = await http.get("/metrics")
        assert response.status == 200
        return await response.text()
    finally:
        await http.close()


@pytest.fixture
async def exported() -> AsyncIterator[dict[str, Exported]]:
    """What each process exports: 'operator', 'webhooks', 'sunk'."""
    operator = await scrape(operator_health.make_app(operator_health.Health()))
    webhooks_server = webhooks_app(WebhookSettings())
    webhooks = await scrape(webhooks_server)
    scheduler = sunk_scheduler.SunkScheduler(SunkSettings(), FakeSunkApi(), FakeSlurm())
    sunk = await scrape(sunk_hooks.make_metrics_app(scheduler))
    yield {
        "operator": Exported().add_text(operator, labelnames(operator_metrics)),
        "webhooks": Exported().add_text(webhooks, labelnames(webhooks_server[METRICS_KEY])),
        "sunk": Exported().add_text(sunk, labelnames(sunk_scheduler, sunk_hooks)),
    }


def everything(exported: dict[str, Exported]) -> Exported:
    union = Exported()
    for one in exported.values():
        for name, labels in one.labels.items():
            union.labels.setdefault(name, set()).update(labels)
        for name, series in one.families.items():
            union.families.setdefault(name, set()).update(series)
    return union


def test_the_dashboard_is_what_grafana_loads() -> None:
    assert structure_problems(dashboard()) == []


async def test_every_query_names_only_what_the_processes_export(exported: dict[str, Exported]) -> None:
    queries = expressions(dashboard())
    assert len(queries) > 40
    assert problems(queries, everything(exported)) == []


async def test_each_row_shows_the_metrics_of_its_process(exported: dict[str, Exported]) -> None:
    queries = [q for q in expressions(dashboard()) if q.row is not None]
    rows = {q.row for q in queries}
    assert {r.split(":")[0].split(" ")[0] for r in rows if r} == set(PROCESS_OF_ROW)
    for query in queries:
        assert query.row is not None
        process = PROCESS_OF_ROW[query.row.split(":")[0].split(" ")[0]]
        assert problems([query], exported[process]) == [], query.row


async def test_every_metric_of_quorum_has_a_panel(exported: dict[str, Exported]) -> None:
    """A metric added to a process gets a panel (or a place in NOT_ON_DASHBOARD)."""
    used = set().union(*(references(q.expr).metrics for q in expressions(dashboard())))
    families = {name: series for one in exported.values() for name, series in one.families.items()}
    missing = {name for name, series in families.items() if name.startswith("quorum_") and not series & used}
    assert missing - NOT_ON_DASHBOARD == set()


# -- the checker can fail -------------------------------------------------------------------------


def edited(old: str, new: str) -> dict[str, Any]:
    """The dashboard with `old` replaced by `new` in the first query that has it."""
    loaded = dashboard()
    variables = loaded["templating"]["list"]
    holders = [t for p in loaded["panels"] for t in p.get("targets", [])] + [
        v["query"] for v in variables[1:]
    ]
    for holder in holders:
        key = "expr" if "expr" in holder else "query"
        if old in holder[key]:
            holder[key] = holder[key].replace(old, new, 1)
            return loaded
    raise AssertionError(f"no query has {old!r}")


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        # a misspelt metric
        ("quorum_operator_pass_duration_seconds_bucket", "quorum_operator_pass_duraton_seconds_bucket",
         "not exported: 'quorum_operator_pass_duraton_seconds_bucket'"),
        ("quorum_webhook_request_duration_seconds_bucket", "quorum_webhooks_request_duration_seconds_bucket",
         "not exported: 'quorum_webhooks_request_duration_seconds_bucket'"),
        ("quorum_sunk_bind_latency_seconds_bucket", "quorum_sunk_bind_latency_bucket",
         "not exported: 'quorum_sunk_bind_latency_bucket'"),
        # the wrong suffix: a counter without _total, a gauge as a histogram, _created switched off
        ("quorum_operator_releases_total", "quorum_operator_releases",
         "not exported: 'quorum_operator_releases'"),
        ("quorum_operator_leader{", "quorum_operator_leader_bucket{",
         "not exported: 'quorum_operator_leader_bucket'"),
        ("quorum_operator_releases_total", "quorum_operator_releases_created",
         "not exported: 'quorum_operator_releases_created'"),
        # a label the metric does not have
        ("sum by (phase)", "sum by (phaze)", "has the label 'phaze'"),
        ('code=~"5..', 'status=~"5..', "has the label 'status'"),
        # a misspelt function, an undefined variable, a variable outside a string
        ("histogram_quantile(0.5", "histogram_quantil(0.5", "unknown function 'histogram_quantil'"),
        ('namespace=~"$namespace"', 'namespace=~"$namespce"', "$namespce is not a template variable"),
        ('namespace=~"$namespace"', "namespace=~$namespace", "cannot read the matchers"),
        # the variable's own query
        ("label_values(quorum_operator_leader, namespace)", "label_values(quorum_operator_lead, namespace)",
         "not exported: 'quorum_operator_lead'"),
    ],
)  # fmt: skip
async def test_a_wrong_query_is_rejected(
    exported: dict[str, Exported], old: str, new: str, complaint: str
) -> None:
    broken = edited(old, new)
    found = problems(expressions(broken), everything(exported)) + structure_problems(broken)
    assert any(complaint in p for p in found), found


def test_references_tell_names_from_labels_functions_and_variables() -> None:
    found = references(
        'histogram_quantile(0.99, sum by (instance, le) (rate(a_bucket{namespace=~"$namespace", '
        'x!="y,z"}[$__rate_interval] offset 5m))) / on (instance) group_left () '
        '(b == 1) and {__name__="c_total"} > bool 1e3 + max(d) by (k) + sum(rate(e[1h:5m]))'
    )
    assert found.metrics == {"a_bucket", "b", "c_total", "d", "e"}
    assert found.functions == {"histogram_quantile", "sum", "rate", "max"}
    assert found.labels == {"instance", "le", "namespace", "x", "k"}
    assert found.problems == []
    assert references("rate(a[5x])").problems  # not a duration


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda d: d["panels"][2].update(id=d["panels"][1]["id"]), "is not unique"),
        (lambda d: d["panels"][1].pop("gridPos"), "needs integer h, w, x, y"),
        (lambda d: d["panels"][1]["gridPos"].update(x=20), "outside the 24 columns"),
        (lambda d: d["panels"][2]["gridPos"].update(x=0), "overlaps"),
        (lambda d: d["panels"][1]["targets"][0].pop("refId"), "must be present and unique"),
        (lambda d: d["panels"][1].update(datasource={"uid": "p"}), "is not $datasource"),
        (lambda d: d["panels"][1]["targets"][0].update(datasource={"uid": "prom"}), "is not $datasource"),
        (lambda d: d["panels"][1].update(targets=[]), "no targets"),
        (lambda d: d.update(schemaVersion=36), "schemaVersion 36"),
        (lambda d: d["templating"]["list"].pop(0), "no template variable of type datasource"),
    ],
)  # fmt: skip
def test_a_broken_structure_is_rejected(change: Any, complaint: str) -> None:
    broken = copy.deepcopy(dashboard())
    change(broken)
    found = structure_problems(broken)
    assert any(complaint in p for p in found), found


def test_queries_are_found_in_collapsed_rows_too() -> None:
    loaded = dashboard()
    row = next(p for p in loaded["panels"] if p["type"] == "row")
    index = loaded["panels"].index(row)
    nested = loaded["panels"].pop(index + 1)
    row.update(collapsed=True, panels=[nested])
    found = expressions(loaded)
    assert Query(row["title"], f"panel {nested['title']!r} A", nested["targets"][0]["expr"]) in found
    assert structure_problems(loaded) == []


def test_the_namespace_variable_is_all_by_default_and_matches_unlabelled_series() -> None:
    (variable,) = [v for v in dashboard()["templating"]["list"] if v["name"] == "namespace"]
    assert (variable["includeAll"], variable["allValue"], variable["multi"]) == (True, ".*", True)
    assert all('namespace=~"$namespace"' in q.expr for q in expressions(dashboard()) if q.row)
