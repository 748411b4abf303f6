"""quorum_sunk_bind_latency_seconds: each pod the SUNK scheduler binds is observed once, with
the time from its creation to its Binding (its wait in Slurm's queue included)."""

from __future__ import annotations

import time

from quorum.core.times import iso
from quorum.sunk.scheduler import BIND_LATENCY
from tests.unit.sunk.test_reconcile import Cluster, pod, podgroup


def observed() -> tuple[float, float]:
    """(count, sum) of the histogram so far (the registry is the process's: compare, not absolute)."""
    samples = {s.name: s.value for metric in BIND_LATENCY.collect() for s in metric.samples}
    return samples["quorum_sunk_bind_latency_seconds_count"], samples["quorum_sunk_bind_latency_seconds_sum"]


async def test_each_bound_pod_is_observed_once_from_its_creation() -> None:
    cluster = Cluster()
    created = iso(time.time() - 120)  # made two minutes ago
    cluster.api.add_group("scheduling.sigs.k8s.io", "v1alpha1", podgroup("train", 2))
    for i in range(2):
        cluster.api.add_pod(pod(f"train-{i}", "train", created=created))
    count, total = observed()
    await cluster.reconcile()  # submitted: nothing bound yet
    assert observed() == (count, total)
    (group,) = cluster.slurm.components
    cluster.slurm.start(group, [("gpu-a", 2, 2), ("gpu-b", 2, 2)])

    assert (await cluster.reconcile()).bound == 2
    after_count, after_total = observed()
    assert after_count == count + 2
    assert 2 * 119 <= after_total - total <= 2 * 130
    await cluster.reconcile()  # bound already: not observed again
    assert observed() == (after_count, after_total)
