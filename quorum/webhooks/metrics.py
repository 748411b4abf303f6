"""Prometheus metrics of the webhook server, in the text exposition format, without a client
library (a few counters and one histogram; cheap enough for the hot path)."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict

BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], int] = defaultdict(int)  # (webhook, result)
        self.denials: dict[str, int] = defaultdict(int)
        self.errors: dict[str, int] = defaultdict(int)
        self.mutations: dict[str, int] = defaultdict(int)
        self.buckets: dict[str, list[int]] = defaultdict(lambda: [0] * (len(BUCKETS) + 1))
        self.sums: dict[str, float] = defaultdict(float)
        self.cert_reloads = 0

    def observe(self, webhook: str, result: str, seconds: float) -> None:
        """result: allowed | denied | error | bad_request."""
        self.requests[(webhook, result)] += 1
        if result == "denied":
            self.denials[webhook] += 1
        self.buckets[webhook][bisect_left(BUCKETS, seconds)] += 1
        self.sums[webhook] += seconds

    def render(self) -> str:
        out = [
            "# HELP quorum_webhook_requests_total AdmissionReviews answered, by webhook and result.",
            "# TYPE quorum_webhook_requests_total counter",
        ]
        for (webhook, result), n in sorted(self.requests.items()):
            out.append(f'quorum_webhook_requests_total{{webhook="{webhook}",result="{result}"}} {n}')
        out += [
            "# HELP quorum_webhook_denials_total AdmissionReviews denied, by webhook.",
            "# TYPE quorum_webhook_denials_total counter",
        ]
        out += [f'quorum_webhook_denials_total{{webhook="{w}"}} {n}' for w, n in sorted(self.denials.items())]
        out += [
            "# HELP quorum_webhook_policy_errors_total Unexpected policy exceptions.",
            "# TYPE quorum_webhook_policy_errors_total counter",
        ]
        out += [
            f'quorum_webhook_policy_errors_total{{webhook="{w}"}} {n}' for w, n in sorted(self.errors.items())
        ]
        out += [
            "# HELP quorum_webhook_mutations_total AdmissionReviews answered with a patch.",
            "# TYPE quorum_webhook_mutations_total counter",
        ]
        out += [
            f'quorum_webhook_mutations_total{{webhook="{w}"}} {n}' for w, n in sorted(self.mutations.items())
        ]
        out += [
            "# HELP quorum_webhook_request_duration_seconds Time to answer an AdmissionReview.",
            "# TYPE quorum_webhook_request_duration_seconds histogram",
        ]
        for webhook, counts in sorted(self.buckets.items()):
            total = 0
            for bound, n in zip((*BUCKETS, float("inf")), counts, strict=True):
                total += n
                le = "+Inf" if bound == float("inf") else repr(bound)
                out.append(
                    f'quorum_webhook_request_duration_seconds_bucket{{webhook="{webhook}",le="{le}"}} {total}'
                )
            out.append(
                f'quorum_webhook_request_duration_seconds_sum{{webhook="{webhook}"}} {self.sums[webhook]:.6f}'
            )
            out.append(f'quorum_webhook_request_duration_seconds_count{{webhook="{webhook}"}} {total}')
        out += [
            "# HELP quorum_webhook_certificate_reloads_total Serving certificate reloads.",
            "# TYPE quorum_webhook_certificate_reloads_total counter",
            f"quorum_webhook_certificate_reloads_total {self.cert_reloads}",
        ]
        return "\n".join(out) + "\n"
