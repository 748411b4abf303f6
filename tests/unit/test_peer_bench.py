"""The peer benchmark's pure parts: its workloads, the cw-coscheduler build module and
configuration, and the Markdown report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from devcluster.build import BinaryCache
from devcluster.coscheduler import (
    CONTROLLER_RUNTIME_VERSION,
    SCHEDULER_NAME,
    SCHEDULER_PLUGINS_VERSION,
    build_module,
    exported_names,
    port_moved_framework_names,
    scheduler_config,
)
from devcluster.nodes import load_pool
from devcluster.versions import RELEASES
from tests.bench.peer_report import markdown
from tests.bench.peer_workloads import (
    GANG_SIZES,
    gang_pod,
    interleaved,
    mixed_gangs,
    uniform_gangs,
    write_pool,
)


@given(st.integers(2, 3000), st.integers(0, 5))
def test_mixed_gangs_add_up_to_the_demand_exactly(total: int, seed: int) -> None:
    gangs = mixed_gangs(total, seed)
    assert sum(g.size for g in gangs) == total
    assert all(g.size >= 2 for g in gangs)
    assert all(g.size in GANG_SIZES for g in gangs[:-1])
    assert len({g.name for g in gangs}) == len(gangs)


def test_interleaved_arrival_grows_every_gang_at_once() -> None:
    gangs = mixed_gangs(20, 1)
    order = interleaved(gangs)
    assert sorted((g.name, i) for g, i in order) == sorted((g.name, i) for g in gangs for i in range(g.size))
    assert [g.name for g, i in order[: len(gangs)]] == [g.name for g in gangs]  # pod 0 of each first


def test_gang_pods_differ_only_in_scheduler_name() -> None:
    (gang,) = uniform_gangs(1, 8)
    ours, baseline = gang_pod(gang, 3, SCHEDULER_NAME, 20), gang_pod(gang, 3, "default-scheduler", 20)
    assert ours["metadata"] == baseline["metadata"]
    assert ours["metadata"]["labels"] == {"scheduling.x-k8s.io/pod-group": "g000"}
    assert ours["metadata"]["annotations"] == {"pod-complete.stage.kwok.x-k8s.io/delay": "20s"}
    assert {**ours["spec"], "schedulerName": "x"} == {**baseline["spec"], "schedulerName": "x"}


def test_bench_pool_has_exactly_the_asked_production_nodes(tmp_path: Path) -> None:
    pool = load_pool(write_pool(tmp_path / "pool.yaml", 500, 8))
    assert {g.name: g.count for g in pool.groups} == {"gpu": 500, "cpu": 8}


def test_cw_coscheduler_build_module_pins_kubernetes_and_its_staging_modules() -> None:
    text = build_module(
        BinaryCache(RELEASES["1.36"].pins, root=Path("/nonexistent")), ["k8s.io/api", "k8s.io/client-go"]
    )
    assert text.startswith("module quorum.dev/build/cw-coscheduler\n")
    assert f"sigs.k8s.io/scheduler-plugins {SCHEDULER_PLUGINS_VERSION}" in text
    assert f"sigs.k8s.io/controller-runtime {CONTROLLER_RUNTIME_VERSION}" in text
    assert "k8s.io/client-go => k8s.io/client-go v0.36." in text


def test_cw_coscheduler_profile_runs_coscheduling_with_the_instances_client_limits() -> None:
    config = scheduler_config(Path("/k"), 500.0, 1000, 60)
    assert config["clientConnection"] == {"kubeconfig": "/k", "qps": 500.0, "burst": 1000}
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "cw-coscheduler"
    assert profile["plugins"]["queueSort"] == {
        "enabled": [{"name": "Coscheduling"}],
        "disabled": [{"name": "*"}],
    }
    assert profile["pluginConfig"] == [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 60}}]


def test_report_puts_schedulers_side_by_side_with_the_ratio() -> None:
    runs = [
        {"mode": "quorum", "pods_bound_per_second": 150.0, "finished": True},
        {"mode": "coscheduling", "pods_bound_per_second": 100.0, "finished": True},
        {"mode": "default", "pods_bound_per_second": 300.0, "finished": True},
    ]
    data = {"date": "d", "scenarios": {"throughput": {"gpu_nodes": 5, "gangs": 1, "pods": 8, "runs": runs}}}
    text = markdown(data)
    assert "| quorum | scheduler-plugins | kube-scheduler alone |" in text
    assert "| pods bound per second | 150.0 | 100.0 | 300.0 | 1.50 |" in text


def test_report_of_rounds_gives_each_ratio_within_its_round_and_their_median() -> None:
    def round_of(quorum: float, coscheduling: float) -> list[dict[str, Any]]:
        return [
            {"mode": "quorum", "pods_bound_per_second": quorum, "finished": True},
            {"mode": "coscheduling", "pods_bound_per_second": coscheduling, "finished": True},
        ]

    rounds = [round_of(100.0, 200.0), round_of(90.0, 100.0), round_of(120.0, 160.0)]
    scenario = {"gpu_nodes": 5, "gangs": 1, "pods": 8, "runs": rounds[0], "rounds": rounds}
    text = markdown({"date": "d", "scenarios": {"throughput": scenario}})
    assert "| 2 | 90.0 | 100.0 | 0.90 |" in text
    assert "| median |  |  | 0.75 |" in text
    assert "| pods bound per second | 100.0 | 200.0 | 0.50 |" in text, "the main table: round 1"


PLUGIN_SOURCE = """import (
\tfwk "k8s.io/kube-scheduler/framework"
\t"k8s.io/kubernetes/pkg/scheduler/framework"
)

var _ framework.PermitPlugin = &Coscheduling{}

func New(ctx context.Context, obj runtime.Object, handle framework.Handle) (framework.Plugin, error) {
\treturn nil, nil // framework.Handle in a comment moves too
}
"""


def test_port_renames_only_the_names_that_moved_and_drops_the_unused_import() -> None:
    moved = {"PermitPlugin", "Handle", "Plugin"}
    ported = port_moved_framework_names(PLUGIN_SOURCE, moved)
    assert "framework." not in ported
    assert '"k8s.io/kubernetes/pkg/scheduler/framework"' not in ported
    assert "var _ fwk.PermitPlugin = &Coscheduling{}" in ported
    assert "handle fwk.Handle) (fwk.Plugin, error)" in ported


def test_port_keeps_the_old_import_while_a_name_still_lives_there() -> None:
    source = PLUGIN_SOURCE + "\nvar key = framework.PodsToActivateKey\n"
    ported = port_moved_framework_names(source, {"PermitPlugin", "Handle", "Plugin"})
    assert "framework.PodsToActivateKey" in ported
    assert '"k8s.io/kubernetes/pkg/scheduler/framework"' in ported


def test_exported_names_of_go_sources() -> None:
    source = "type Handle interface {\n\tSharedLister() SharedLister\n}\nconst (\n\tWait Code = iota\n)\n"
    assert exported_names([source, "func NewStatus(c Code) *Status {}\nvar ErrX = 1\n"]) == {
        "Handle",
        "Wait",
        "NewStatus",
        "ErrX",
    }
