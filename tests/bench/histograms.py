"""Prometheus histograms read from a component's /metrics text: the samples of chosen metrics,
the difference of two scrapes, series summed by some labels, and quantiles interpolated from
the buckets exactly as PromQL's `histogram_quantile` does. Pure functions on plain data."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Samples = dict[tuple[str, Labels], float]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _unescape(value: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], value)


def parse_labels(text: str) -> Labels:
    labels, pos = [], 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if match is None:
            raise ValueError(f"bad label set: {text!r}")
        labels.append((match.group(1), _unescape(match.group(2))))
        pos = match.end()
    return tuple(sorted(labels))


def parse_samples(text: str, histograms: Collection[str]) -> Samples:
    """The _bucket, _sum and _count samples of the named histograms in Prometheus' text format
    (the other lines are skipped unparsed: an apiserver's /metrics is a few megabytes)."""
    wanted = {f"{h}{suffix}" for h in histograms for suffix in ("_bucket", "_sum", "_count")}
    samples: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or line.split("{", 1)[0].split(" ", 1)[0] not in wanted:
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"bad sample line: {line!r}")
        samples[(match.group(1), parse_labels(match.group(2) or ""))] = float(match.group(3))
    return samples


def difference(after: Samples, before: Samples) -> Samples:
    """What was observed between two scrapes of one process (a series first seen in `after`
    counts from zero)."""
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def total(windows: Iterable[Samples]) -> Samples:
    """Several windows as one (the observations of all of them)."""
    summed: Samples = defaultdict(float)
    for window in windows:
        for key, value in window.items():
            summed[key] += value
    return dict(summed)


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound `le`, cumulative count), by bound
    sum: float

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0


def histograms(
    samples: Samples, metric: str, by: Sequence[str], where: Mapping[str, str] | None = None
) -> dict[tuple[str, ...], Histogram]:
    """The series of `metric` that carry the labels `where`, summed by the values of the labels
    `by` (as `sum by (..., le) (...)` does before `histogram_quantile`)."""
    where = where or {}
    counts: dict[tuple[str, ...], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    sums: dict[tuple[str, ...], float] = defaultdict(float)
    for (name, labels), value in samples.items():
        tags = dict(labels)
        if any(tags.get(k) != v for k, v in where.items()):
            continue
        group = tuple(tags.get(k, "") for k in by)
        if name == f"{metric}_bucket":
            counts[group][float(tags["le"])] += value
        elif name == f"{metric}_sum":
            sums[group] += value
    return {
        group: Histogram(tuple(sorted(buckets.items())), sums.get(group, 0.0))
        for group, buckets in counts.items()
    }


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """The q-quantile of cumulative buckets (upper bound, count), as Prometheus computes it
    (promql/quantile.go `bucketQuantile`): the bucket where the rank falls, then linear
    interpolation inside it (from 0 in the first bucket if its bound is positive). A rank in
    the +Inf bucket answers the highest finite bound. NaN without observations or without a
    +Inf bucket."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = defaultdict(float)
    for bound, count in buckets:
        merged[bound] += count
    ordered = sorted(merged.items())
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return math.nan
    monotonic, highest = [], 0.0
    for bound, count in ordered:  # a scrape mid-update may be non-monotonic
        highest = max(highest, count)
        monotonic.append((bound, highest))
    observations = monotonic[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next((i for i, (_, count) in enumerate(monotonic[:-1]) if count >= rank), len(monotonic) - 1)
    if b == len(monotonic) - 1:
        return monotonic[-2][0]
    if b == 0 and monotonic[0][0] <= 0:
        return monotonic[0][0]
    start, end, count = 0.0, monotonic[b][0], monotonic[b][1]
    if b > 0:
        start = monotonic[b - 1][0]
        count -= monotonic[b - 1][1]
        rank -= monotonic[b - 1][1]
    if count == 0:
        return math.nan
    return start + (end - start) * (rank / count)


def summary_ms(histogram: Histogram) -> dict[str, float | int | None]:
    """Observations, p50, p99 (interpolated) and mean (exact, from _sum) in milliseconds, and
    the first bucket's bound: a quantile at or under it only says "under that bound"."""
    count = histogram.count

    def ms(seconds: float) -> float | None:
        return None if math.isnan(seconds) else round(seconds * 1000, 2)

    return {
        "count": round(count),
        "p50_ms": ms(histogram_quantile(0.5, histogram.buckets)),
        "p99_ms": ms(histogram_quantile(0.99, histogram.buckets)),
        "mean_ms": ms(histogram.sum / count) if count else None,
        "first_bucket_ms": ms(histogram.buckets[0][0]) if histogram.buckets else None,
    }
