"""The peer benchmark's pure parts: its workloads (contention-dra's and together-dra's devices,
claims and Kubernetes PodGroups among them), the cw-coscheduler build module and configuration,
the claim watch's double-allocation check, what became of each gang, why pods wait, and the
Markdown report."""

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
from tests.bench.gang_metrics import PodRecord, gang_outcomes, gang_report
from tests.bench.peer_report import markdown
from tests.bench.peer_workloads import (
    GANG_SIZES,
    GangSpec,
    claim_templates,
    device_objects,
    dra_gang_pod,
    gang_pod,
    in_sequence,
    interleaved,
    linked_device_names,
    mixed_gangs,
    together_gangs,
    uniform_gangs,
    workload_podgroup,
    write_pool,
)
from tests.bench.peers import (
    MODES,
    SeenClaims,
    gpu_node_names,
    pending_summary,
    pod_waits,
    reason_parts,
    refusal_summary,
    scenario_pods,
    scenarios,
    waves,
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


# -- contention-dra: GPUs through DRA, and Kubernetes' own gang scheduling ----------------------


def test_contention_dra_is_contention_on_devices_in_its_own_ways() -> None:
    for quick in (False, True):
        chosen = scenarios(quick)
        plain, dra = chosen["contention"], chosen["contention-dra"]
        assert (dra.gpu_nodes, dra.gangs, dra.interleave, dra.run_seconds, dra.wait_for) == (
            plain.gpu_nodes,
            plain.gangs,
            plain.interleave,
            plain.run_seconds,
            plain.wait_for,
        )
        assert dra.dra and not plain.dra
        assert dra.modes == ("quorum", "default", "was") and "was" not in plain.modes
        assert set(dra.modes) <= set(MODES) and dra.kubernetes in RELEASES


def test_dra_pool_has_no_gpus_in_allocatable(tmp_path: Path) -> None:
    pool = load_pool(write_pool(tmp_path / "pool.yaml", 4, 2, gpus_in_allocatable=False))
    (gpu,) = [g for g in pool.groups if g.name == "gpu"]
    assert "nvidia.com/gpu" not in gpu.capacity and gpu.capacity["cpu"] == "128"
    assert gpu_node_names(tmp_path / "pool.yaml") == [f"{gpu.prefix}-{i:03d}" for i in range(4)]


def test_the_test_driver_publishes_8_devices_per_gpu_node_and_a_class_of_its_driver() -> None:
    device_class, *slices = device_objects(["n-1", "n-2"])
    assert device_class["kind"] == "DeviceClass"
    (selector,) = device_class["spec"]["selectors"]
    assert selector["cel"]["expression"] == 'device.driver == "gpu.example.com"'
    assert [s["spec"]["nodeName"] for s in slices] == ["n-1", "n-2"]
    for found in slices:
        assert found["kind"] == "ResourceSlice" and found["spec"]["driver"] == "gpu.example.com"
        assert [d["name"] for d in found["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]


def test_dra_pods_ask_their_gpus_through_a_template_of_their_count() -> None:
    gangs = [GangSpec("a", 2), GangSpec("b", 4, gpus=2), GangSpec("c", 2)]
    templates = claim_templates(gangs)
    assert [t["metadata"]["name"] for t in templates] == ["gpus-1", "gpus-2"]
    counts = [t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] for t in templates]
    assert counts == [1, 2]
    pod = dra_gang_pod(gangs[1], 3, SCHEDULER_NAME, 20)
    plain = gang_pod(gangs[1], 3, SCHEDULER_NAME, 20)
    assert plain["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    (container,) = pod["spec"]["containers"]
    assert "limits" not in container["resources"], "no nvidia.com/gpu"
    assert container["resources"]["claims"] == [{"name": "gpus"}]
    assert pod["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "gpus-2"}]
    assert pod["metadata"] == plain["metadata"]


def test_each_way_gets_its_pods() -> None:
    scenario = scenarios(True)["contention-dra"]
    order = interleaved(scenario.gangs)
    for mode, scheduler in (("quorum", SCHEDULER_NAME), ("default", "default-scheduler")):
        pods = scenario_pods(mode, scenario)
        assert [p["metadata"]["name"] for p in pods] == [f"{g.name}-{i}" for g, i in order]
        assert {p["spec"]["schedulerName"] for p in pods} == {scheduler}
        assert all(p["spec"]["resourceClaims"] and "schedulingGroup" not in p["spec"] for p in pods)
    was = scenario_pods("was", scenario)
    assert {p["spec"]["schedulerName"] for p in was} == {"default-scheduler"}
    assert [p["spec"]["schedulingGroup"]["podGroupName"] for p in was] == [g.name for g, _ in order]
    group = workload_podgroup(scenario.gangs[0], "v1beta1")
    assert group["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": scenario.gangs[0].size}}}


def claim(uid: str, *devices: str) -> dict[str, Any]:
    results = [{"request": "gpus", "driver": "d", "pool": "n", "device": d} for d in devices]
    status = {"allocation": {"devices": {"results": results}}} if devices else {}
    return {"metadata": {"uid": uid}, "status": status}


def test_the_claim_watch_tells_a_device_allocated_twice_from_one_freed_and_taken_again() -> None:
    seen = SeenClaims()
    seen.upsert(claim("a", "gpu-0", "gpu-1"))
    seen.upsert(claim("a"))  # deallocated
    seen.upsert(claim("b", "gpu-0"))
    seen.delete(claim("b", "gpu-0"))
    seen.upsert(claim("c", "gpu-0"))
    seen.upsert(claim("c", "gpu-0"))  # a new version of the same allocation
    assert not seen.twice and seen.allocated == {"a", "b", "c"}
    seen.upsert(claim("d", "gpu-1", "gpu-0"))
    assert seen.twice == {("d", "n", "gpu-0")}
    seen.replace_all([claim("e", "gpu-2")])
    assert seen.holders == {("d", "n", "gpu-2"): "e"}


def test_unfinished_gangs_and_gangs_partial_at_the_end() -> None:
    pods = [
        PodRecord("done", 1, 0.0, 20.0),
        PodRecord("done", 1, 1.0, 21.0),
        PodRecord("stuck", 1, 5.0, None),
        PodRecord("stuck", 1, None, None),
        PodRecord("never", 1, None, None),
    ]
    report = gang_report(pods, {"done": 2, "stuck": 2, "never": 1}, 8, 0.0, 100.0)
    assert report.gangs_unfinished == 2
    assert report.gangs_partial_at_end == 1
    assert report.gangs_partially_placed == 1


def test_report_of_contention_dra_puts_kubernetes_gang_scheduling_beside_quorum() -> None:
    runs = [
        {"mode": "quorum", "gangs_partially_placed": 0, "gangs_unfinished": 0, "finished": True},
        {"mode": "default", "gangs_partially_placed": 30, "gangs_unfinished": 12, "finished": False},
        {"mode": "was", "gangs_partially_placed": 2, "gangs_unfinished": 4, "finished": False},
    ]
    scenario = {"kubernetes": "1.37", "gpu_nodes": 25, "gangs": 20, "pods": 300, "runs": runs}
    text = markdown({"date": "d", "scenarios": {"contention-dra": scenario}})
    assert "## Contention on DRA devices" in text
    assert "25 GPU nodes x 8 GPUs, 20 gangs, 300 pods, Kubernetes 1.37." in text
    assert "| quorum | kube-scheduler alone | kube-scheduler, Workload PodGroups | quorum / " in text
    assert "| gangs not finished within the deadline | 0 | 12 | 4 | 0.00 |" in text


# -- together-dra: a gang fits only if its devices are chosen together --------------------------


def test_together_dra_nodes_publish_their_2_linked_devices_first() -> None:
    device_class, *slices = device_objects(["n-1", "n-2"], linked=2)
    assert device_class["kind"] == "DeviceClass"
    for found in slices:
        devices = found["spec"]["devices"]
        assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
        assert [d["attributes"]["nvlink"] for d in devices] == [{"bool": True}] * 2 + [{"bool": False}] * 6
    assert linked_device_names(2) == {"gpu-0", "gpu-1"}
    _, plain = device_objects(["n-1"])
    assert all("nvlink" not in d["attributes"] for d in plain["spec"]["devices"]), (
        "contention-dra's as before"
    )


def test_together_dra_gangs_ask_6_any_devices_then_2_linked_ones_one_nodes_worth() -> None:
    gangs = together_gangs(3)
    assert [(g.size, g.gpus, g.linked) for g in gangs] == [(8, 1, 2)] * 3
    any_1, linked_1 = claim_templates(gangs)
    assert any_1["metadata"]["name"] == "any-1" and linked_1["metadata"]["name"] == "linked-1"
    (anything,) = any_1["spec"]["spec"]["devices"]["requests"]
    assert anything["exactly"] == {"deviceClassName": "gpu.example.com", "count": 1}
    (linked,) = linked_1["spec"]["spec"]["devices"]["requests"]
    assert linked["exactly"]["count"] == 1
    assert linked["exactly"]["selectors"] == [
        {"cel": {"expression": 'device.attributes["gpu.example.com"].nvlink'}}
    ]
    pods = [dra_gang_pod(g, i, SCHEDULER_NAME, 20) for g, i in in_sequence(gangs)]
    templates = [p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] for p in pods]
    assert templates == (["any-1"] * 6 + ["linked-1"] * 2) * 3, "in each gang, its any pods first"


def test_together_dra_runs_two_waves_of_a_gang_per_node_each_created_pod_by_pod() -> None:
    for quick, nodes in ((False, 16), (True, 4)):
        scenario = scenarios(quick)["together-dra"]
        assert scenario.gpu_nodes == nodes and len(scenario.gangs) == 2 * nodes
        assert scenario.dra and scenario.linked == 2 and scenario.ordered and not scenario.interleave
        assert scenario.modes == ("quorum", "default", "was") and scenario.deadline <= 300
        for mode in scenario.modes:
            first, second = waves(scenario, scenario_pods(mode, scenario))
            assert len(first) == len(second) == 8 * nodes
            assert {p["metadata"]["name"] for p in first} == {
                f"g{g:03d}-{i}" for g in range(nodes) for i in range(8)
            }
            assert [p["metadata"]["name"] for p in first[:8]] == [f"g000-{i}" for i in range(8)]
    assert (
        len(waves(scenarios(True)["contention-dra"], scenario_pods("was", scenarios(True)["contention-dra"])))
        == 1
    )


def test_the_claim_watch_counts_claims_without_a_selector_given_a_linked_device() -> None:
    seen = SeenClaims(linked=linked_device_names(2))
    linked_claim = claim("l", "gpu-0")
    linked_claim["spec"] = {
        "devices": {"requests": [{"name": "gpus", "exactly": {"selectors": [{"cel": {}}]}}]}
    }
    seen.upsert(linked_claim)
    seen.upsert(claim("a", "gpu-2"))
    assert not seen.any_on_linked
    seen.upsert(claim("b", "gpu-1"))
    assert seen.any_on_linked == {"b"}


def test_what_became_of_each_gang() -> None:
    pods = [
        PodRecord("whole", 1, 0.0, 20.0),
        PodRecord("whole", 1, 5.0, 25.0),  # together for 15 s
        PodRecord("glimpse", 1, 0.0, 20.0),  # together for 5 s only: ran in pieces
        PodRecord("glimpse", 1, 15.0, 35.0),
        PodRecord("pieces", 1, 0.0, 20.0),  # one after the other, never together
        PodRecord("pieces", 1, 20.0, 40.0),
        PodRecord("stuck", 1, 3.0, None),
        PodRecord("stuck", 1, None, None),
        PodRecord("never", 1, None, None),
        PodRecord("never", 1, None, None),
        PodRecord("late", 1, 150.0, None),  # bound after the end
        PodRecord("running", 1, 80.0, None),  # whole from 80 s to the end
    ]
    sizes = {"whole": 2, "glimpse": 2, "pieces": 2, "stuck": 2, "never": 2, "late": 1, "running": 1}
    outcomes = gang_outcomes(pods, sizes, 100.0)
    assert outcomes.gangs_ran_whole == 2
    assert outcomes.gangs_ran_in_part == 3
    assert outcomes.gangs_never_started == 2
    assert outcomes.gangs_not_fully_bound == 3
    assert outcomes.pods_pending_at_end == 4


def event(pod: str, reason: str, message: str, when: str) -> dict[str, Any]:
    return {
        "involvedObject": {"kind": "Pod", "name": pod},
        "reason": reason,
        "message": message,
        "source": {"component": "default-scheduler"},
        "lastTimestamp": when,
        "metadata": {},
    }


def test_why_pods_waited_over_the_run_and_at_the_end() -> None:
    claims = "0/6 nodes are available: 2 node(s) had untolerated taint(s), 4 cannot allocate all claims."
    group = "pod group is unschedulable, 0/1 placements are available, first placement status: 7 remaining"
    pods: list[dict[str, Any]] = [
        {"metadata": {"name": "a"}, "spec": {"nodeName": "n"}},
        {"metadata": {"name": "b"}, "spec": {}},
        {"metadata": {"name": "c"}, "spec": {"schedulingGates": [{"name": "quorum.dev/gang"}]}},
    ]
    events = [
        event("a", "FailedScheduling", claims, "2026-01-01T00:00:01Z"),
        event("a", "Scheduled", "assigned", "2026-01-01T00:00:09Z"),
        event("b", "FailedScheduling", group, "2026-01-01T00:00:05Z"),
        event("b", "FailedScheduling", claims, "2026-01-01T00:00:02Z"),
    ]
    waits = pod_waits(pods, events)
    assert waits.pods_refused == 2
    assert waits.refused == {
        "node(s) had untolerated taint(s)": 2,
        "cannot allocate all claims": 2,
        "pod group is unschedulable": 1,
        "remaining": 1,
    }
    assert waits.pending == {
        "default-scheduler: FailedScheduling: " + group.replace("0/1", "N/N").replace("7", "N"): 1,
        "gated (quorum.dev/gang); no event": 1,
    }
    assert (
        refusal_summary(waits.refused)
        == "cannot allocate all claims (2); pod group is unschedulable (1); remaining (1)"
    )


def test_why_pods_wait_is_kube_schedulers_reasons_without_their_counts() -> None:
    message = (
        "0/6 nodes are available: 2 node(s) had untolerated taint {is_cpu_compute: }, 4 cannot allocate "
        "all claims. preemption: 0/6 nodes are available: 6 Preemption is not helpful for scheduling."
    )
    assert reason_parts(message) == [
        "node(s) had untolerated taint {is_cpu_compute: }",
        "cannot allocate all claims",
    ]
    group = (
        "pod group is unschedulable, pod group is unschedulable, 0/1 placements are available, first "
        "placement status: minCount (8) cannot be satisfied: 6 scheduled, 1 remaining, pod group "
        "preemption: No preemption victims found for incoming preemptor"
    )
    assert reason_parts(group) == [
        "pod group is unschedulable",
        "minCount (N) cannot be satisfied: N scheduled, N remaining",
    ]
    reasons = {
        "default-scheduler: FailedScheduling: " + message.replace("0/6", "N/N"): 5,
        "default-scheduler: FailedScheduling: " + group: 3,
        "gated (quorum.dev/gang); no event": 1,
    }
    assert pending_summary(reasons) == (
        "cannot allocate all claims; pod group is unschedulable; "
        "minCount (N) cannot be satisfied: N scheduled, N remaining; gated (quorum.dev/gang); no event"
    )
    assert pending_summary({}) == "-"


def test_report_of_together_dra_tells_what_became_of_the_gangs() -> None:
    runs = [
        {"mode": "quorum", "gangs_ran_whole": 8, "pending_reason": "-", "finished": True},
        {
            "mode": "default",
            "gangs_ran_whole": 1,
            "pending_reason": "cannot allocate all claims",
            "finished": True,
        },
        {"mode": "was", "gangs_ran_whole": 8, "pending_reason": "-", "finished": True},
    ]
    scenario = {"kubernetes": "1.37", "gpu_nodes": 4, "gangs": 8, "pods": 64, "runs": runs}
    text = markdown({"date": "d", "scenarios": {"together-dra": scenario}})
    assert "## Gangs whose DRA devices must be chosen together" in text
    assert "| gangs that ran whole (all pods at once, over 10 s) | 8 | 1 | 8 | 1.00 |" in text
    assert "the CPU nodes' taint left out) | - | cannot allocate all claims | - | - |" in text
