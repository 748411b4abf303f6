"""Prometheus metrics of the webhook server (prometheus_client).

Each `Metrics` has its own `CollectorRegistry`, so several servers in one process (the tests)
keep their own counts. The request path touches only prebuilt children: `Metrics.webhook(name)`
looks a webhook's labelled counters and histogram up once (`make_app` does it for every webhook
at start, so their series exist, at 0, before the first review) and the handler keeps them.

`/metrics` is prometheus_client's `generate_latest` with two rewrites that keep the text this
server wrote before it used the library, which scripts read line by line (the integration tests
match `quorum_webhook_requests_total{webhook="...",` and read the count with `int()`): the
`webhook` label comes first (the library sorts label names: `{result=...,webhook=...}`), and an
integral value is written as an integer (`3` and `1234567`, where the library writes `3.0` and
`1.234567e+06`). Prometheus reads either form. Counters have no `_created` series.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest

BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
RESULTS = ("allowed", "denied", "error", "bad_request", "busy")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The exposition's content type (the Prometheus text format that `generate_latest` writes)."""

# One sample per counter, not two: no `<name>_created` series (a process-wide switch of
# prometheus_client, read at exposition time; quorum.operator.metrics sets it too).
disable_created_metrics()  # type: ignore[no-untyped-call]

# A sample line: "name{labels} value" (values are floats: "12.0", "1.234567e+06", "+Inf").
_SAMPLE = re.compile(rb"^([^#\n][^\n]* )([^ \n]+)$", re.MULTILINE)
# Labels sorted by name put `webhook` last: {le="0.001",webhook="w"}, {result="denied",webhook="w"}.
_WEBHOOK_LAST = re.compile(rb'\{([^{}\n]+),(webhook="[^"\n]*")\}')


def _integral(sample: re.Match[bytes]) -> bytes:
    try:
        value = float(sample[2])
    except ValueError:
        return sample[0]
    if value.is_integer() and abs(value) < 2**53:
        return sample[1] + b"%d" % value
    return sample[0]


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format (`CONTENT_TYPE`), `webhook` the first label,
    integral values as integers (see the module's docstring)."""
    return _SAMPLE.sub(_integral, _WEBHOOK_LAST.sub(rb"{\2,\1}", generate_latest(registry)))


class WebhookMetrics:
    """One webhook's children of the labelled metrics, looked up once."""

    __slots__ = ("denials", "duration", "errors", "mutations", "requests")

    def __init__(self, metrics: Metrics, webhook: str) -> None:
        self.requests = {result: metrics.requests.labels(webhook, result) for result in RESULTS}
        self.denials = metrics.denials.labels(webhook)
        self.errors = metrics.errors.labels(webhook)
        self.mutations = metrics.mutations.labels(webhook)
        self.duration = metrics.duration.labels(webhook)

    def observe(self, result: str, seconds: float) -> None:
        """One answered AdmissionReview. result: allowed | denied | error | bad_request | busy."""
        self.requests[result].inc()
        if result == "denied":
            self.denials.inc()
        self.duration.observe(seconds)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "quorum_webhook_requests_total",
            "AdmissionReviews answered, by webhook and result (allowed, denied, error, bad_request, "
            "busy: a large body refused unread, the budget for large bodies full).",
            ("webhook", "result"),
            registry=self.registry,
        )
        self.denials = Counter(
            "quorum_webhook_denials_total",
            "AdmissionReviews denied, by webhook.",
            ("webhook",),
            registry=self.registry,
        )
        self.errors = Counter(
            "quorum_webhook_policy_errors_total",
            "Unexpected policy exceptions (answered with the webhook's failure mode), by webhook.",
            ("webhook",),
            registry=self.registry,
        )
        self.mutations = Counter(
            "quorum_webhook_mutations_total",
            "AdmissionReviews answered with a patch, by webhook.",
            ("webhook",),
            registry=self.registry,
        )
        self.duration = Histogram(
            "quorum_webhook_request_duration_seconds",
            "Time to answer an AdmissionReview, in seconds (parse, policies, patch), by webhook.",
            ("webhook",),
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.cert_reloads = Counter(
            "quorum_webhook_certificate_reloads_total",
            "Serving certificate reloads (the files changed and the new pair was loaded).",
            registry=self.registry,
        )
        self._webhooks: dict[str, WebhookMetrics] = {}

    def webhook(self, name: str) -> WebhookMetrics:
        """The children of webhook `name` (made on first use; their series start at 0)."""
        found = self._webhooks.get(name)
        if found is None:
            found = self._webhooks[name] = WebhookMetrics(self, name)
        return found

    def observe(self, webhook: str, result: str, seconds: float) -> None:
        """result: allowed | denied | error | bad_request | busy."""
        self.webhook(webhook).observe(result, seconds)

    def certificate_reloaded(self) -> None:
        self.cert_reloads.inc()

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 if it does not exist), e.g.
        `value("quorum_webhook_policy_errors_total", webhook="mutate-pods")`."""
        return self.registry.get_sample_value(name, labels) or 0.0

    def render(self) -> bytes:
        """The /metrics body (content type `CONTENT_TYPE`)."""
        return exposition(self.registry)
