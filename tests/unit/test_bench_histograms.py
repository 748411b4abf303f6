"""The admission benchmark's histogram reading: /metrics text, scrape differences, series summed
by label, and `histogram_quantile` as Prometheus computes it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.bench.histograms import (
    Histogram,
    Samples,
    difference,
    histogram_quantile,
    histograms,
    parse_samples,
    summary_ms,
)

INF = math.inf

SCRAPE = """\
# HELP webhook_seconds [STABLE] Admission webhook latency.
# TYPE webhook_seconds histogram
webhook_seconds_bucket{name="a.quorum.dev",rejected="false",type="admit",le="0.005"} 2
webhook_seconds_bucket{name="a.quorum.dev",rejected="false",type="admit",le="0.025"} 6
webhook_seconds_bucket{name="a.quorum.dev",rejected="false",type="admit",le="+Inf"} 6
webhook_seconds_sum{name="a.quorum.dev",rejected="false",type="admit"} 0.05
webhook_seconds_count{name="a.quorum.dev",rejected="false",type="admit"} 6
webhook_seconds_bucket{name="a.quorum.dev",rejected="true",type="admit",le="0.005"} 1
webhook_seconds_bucket{name="a.quorum.dev",rejected="true",type="admit",le="0.025"} 2
webhook_seconds_bucket{name="a.quorum.dev",rejected="true",type="admit",le="+Inf"} 2
webhook_seconds_sum{name="a.quorum.dev",rejected="true",type="admit"} 0.01
webhook_seconds_count{name="a.quorum.dev",rejected="true",type="admit"} 2
apiserver_admission_webhook_request_total{code="200",name="a.quorum.dev"} 8
weird_label_bucket{msg="a \\"quoted\\", comma",le="1"} 3
"""


def test_only_the_named_histograms_are_read() -> None:
    samples = parse_samples(SCRAPE, ["webhook_seconds"])
    assert len(samples) == 10
    assert {name for name, _ in samples} == {
        "webhook_seconds_bucket",
        "webhook_seconds_sum",
        "webhook_seconds_count",
    }


def test_label_values_with_quotes_and_commas() -> None:
    ((key, value),) = parse_samples(SCRAPE, ["weird_label"]).items()
    assert key == ("weird_label_bucket", (("le", "1"), ("msg", 'a "quoted", comma')))
    assert value == 3


def test_series_are_summed_by_the_chosen_labels() -> None:
    samples = parse_samples(SCRAPE, ["webhook_seconds"])
    by_name = histograms(samples, "webhook_seconds", ["name"])
    ((group, summed),) = by_name.items()
    assert group == ("a.quorum.dev",)
    assert summed.buckets == ((0.005, 3), (0.025, 8), (INF, 8))
    assert summed.sum == pytest.approx(0.06)
    rejected = histograms(samples, "webhook_seconds", ["name"], {"rejected": "true"})
    assert rejected[("a.quorum.dev",)].count == 2


def test_the_difference_of_two_scrapes_is_what_happened_between_them() -> None:
    before: Samples = {("m_bucket", (("le", "1"),)): 5.0, ("m_bucket", (("le", "+Inf"),)): 7.0}
    after: Samples = {
        ("m_bucket", (("le", "1"),)): 9.0,
        ("m_bucket", (("le", "+Inf"),)): 12.0,
        ("m_sum", ()): 4.0,
    }
    assert difference(after, before) == {
        ("m_bucket", (("le", "1"),)): 4.0,
        ("m_bucket", (("le", "+Inf"),)): 5.0,
        ("m_sum", ()): 4.0,
    }


# Cases of Prometheus' own tests (promql/promqltest/testdata/histograms.test, classic buckets).
POSITIVE = [(0.1, 50.0), (0.2, 70.0), (1.0, 110.0), (INF, 120.0)]  # testhistogram{start="positive"}
NEGATIVE = [(-0.2, 10.0), (-0.1, 20.0), (0.3, 20.0), (INF, 30.0)]  # testhistogram{start="negative"}
MIDDLES = [(0.0, 0.0), (2.0, 1.0), (4.0, 2.0), (6.0, 3.0), (INF, 3.0)]  # testhistogram2
SUMMED = [(0.1, 10.0), (0.2, 19.0), (INF, 25.0)]  # sum by (le) (request_duration_seconds_bucket)


@pytest.mark.parametrize(
    ("buckets", "q", "expected"),
    [
        (POSITIVE, 0.0, 0.0),
        (POSITIVE, 0.2, 0.048),
        (POSITIVE, 0.5, 0.15),
        (POSITIVE, 0.8, 0.72),
        (POSITIVE, 1.0, 1.0),
        (NEGATIVE, 0.0, -0.2),
        (NEGATIVE, 0.2, -0.2),
        (NEGATIVE, 0.5, -0.15),
        (NEGATIVE, 0.8, 0.3),
        (NEGATIVE, 1.0, 0.3),
        (MIDDLES, 1 / 6, 1.0),
        (MIDDLES, 0.5, 3.0),
        (MIDDLES, 5 / 6, 5.0),
        (SUMMED, 0.3, 0.075),
        (SUMMED, 0.5, 0.1277777777777778),
    ],
)
def test_as_prometheus_computes_it(buckets: list[tuple[float, float]], q: float, expected: float) -> None:
    assert histogram_quantile(q, buckets) == pytest.approx(expected)


def test_the_first_bucket_interpolates_from_zero() -> None:
    assert histogram_quantile(0.5, [(0.005, 10.0), (INF, 10.0)]) == pytest.approx(0.0025)
    assert histogram_quantile(0.99, [(0.005, 10.0), (INF, 10.0)]) == pytest.approx(0.00495)


def test_a_rank_in_the_inf_bucket_answers_the_highest_finite_bound() -> None:
    assert histogram_quantile(0.99, [(0.005, 1.0), (0.025, 2.0), (INF, 10.0)]) == 0.025


def test_undefined_cases_are_nan_or_infinite() -> None:
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]))  # no observations
    assert math.isnan(histogram_quantile(0.5, [(0.1, 3.0), (1.0, 4.0)]))  # no +Inf bucket
    assert math.isnan(histogram_quantile(0.5, [(INF, 4.0)]))  # one bucket
    assert histogram_quantile(-0.1, POSITIVE) == -INF
    assert histogram_quantile(1.1, POSITIVE) == INF


def test_non_monotonic_counts_are_made_monotonic() -> None:
    assert histogram_quantile(0.5, [(1.0, 4.0), (2.0, 3.0), (INF, 8.0)]) == histogram_quantile(
        0.5, [(1.0, 4.0), (2.0, 4.0), (INF, 8.0)]
    )


def test_summary_in_milliseconds() -> None:
    summary = summary_ms(Histogram(((0.005, 10.0), (0.025, 20.0), (INF, 20.0)), 0.2))
    assert summary == {"count": 20, "p50_ms": 5.0, "p99_ms": 24.6, "mean_ms": 10.0, "first_bucket_ms": 5.0}
    assert summary_ms(Histogram(((0.005, 0.0), (INF, 0.0)), 0.0)) == {
        "count": 0,
        "p50_ms": None,
        "p99_ms": None,
        "mean_ms": None,
        "first_bucket_ms": 5.0,
    }


BOUNDS = [0.001, 0.005, 0.01, 0.025, 0.1, 0.5, 1.0, 2.5]


@st.composite
def bucketed(draw: st.DrawFn) -> list[tuple[float, float]]:
    """Cumulative buckets of some observations over fixed bounds, at least one observation."""
    per_bucket = draw(st.lists(st.integers(0, 50), min_size=len(BOUNDS) + 1, max_size=len(BOUNDS) + 1))
    if sum(per_bucket) == 0:
        per_bucket[0] = 1
    cumulative, total = [], 0
    for bound, n in zip([*BOUNDS, INF], per_bucket, strict=True):
        total += n
        cumulative.append((bound, float(total)))
    return cumulative


@given(bucketed(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_quantiles_grow_with_q_and_stay_within_the_finite_bounds(
    buckets: list[tuple[float, float]], a: float, b: float
) -> None:
    low, high = sorted((a, b))
    lo, hi = histogram_quantile(low, buckets), histogram_quantile(high, buckets)
    if math.isnan(lo):  # q = 0 with an empty first bucket: 0/0, as in Prometheus
        assert low == 0.0
        return
    assert 0.0 <= lo <= hi <= BOUNDS[-1]


@given(bucketed(), st.floats(0.01, 1.0))
def test_the_quantile_lies_in_the_bucket_that_holds_its_rank(
    buckets: list[tuple[float, float]], q: float
) -> None:
    value = histogram_quantile(q, buckets)
    rank = q * buckets[-1][1]
    index = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    if math.isinf(buckets[index][0]):
        assert value == BOUNDS[-1]
    else:
        lower = buckets[index - 1][0] if index else 0.0
        assert lower <= value <= buckets[index][0]
