"""The SUNK scheduler's decisions with plain data: validation (hypothesis feeds it what a tenant
might write), the placeholder submission, who goes where in an allocation, node lock patches,
the Kubernetes <-> Slurm node sync, Slurm node lists, and the local Slurm cluster's files."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devcluster import slurm as devslurm
from quorum.sunk import model

KILL_WAIT = 30
TOKEN_PATH = "/etc/slurm/quorum-hook.token"


def pod(
    name: str = "p",
    cpu: Any = "2",
    memory: Any = "4Gi",
    gpus: Any = None,
    grace: Any = 5,
    annotations: dict[str, Any] | None = None,
) -> dict[str, Any]:
    requests = {
        k: v for k, v in (("cpu", cpu), ("memory", memory), ("nvidia.com/gpu", gpus)) if v is not None
    }
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": requests}}]}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": annotations or {}},
        "spec": spec,
    }


def apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 test/add/replace/remove on plain JSON (enough for the patches under test)."""
    result = copy.deepcopy(obj)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
        if op["op"] == "test":
            current = target[int(last)] if isinstance(target, list) else target.get(last)
            assert current == op["value"], f"test failed at {op['path']}"
        elif op["op"] in ("add", "replace"):
            if isinstance(target, list):
                target.insert(len(target) if last == "-" else int(last), op["value"])
            else:
                target[last] = op["value"]
        elif op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
    return result


# -- validation -----------------------------------------------------------------------------------


def test_a_good_pod_becomes_its_shape_and_options() -> None:
    request = model.validate(
        pod(
            cpu="1500m",
            memory="1Gi",
            gpus="2",
            annotations={model.PARTITION: "gpu-high", model.TIME_LIMIT: "1:30:00"},
        ),
        KILL_WAIT,
    )
    assert request.shape == model.Shape(cpus=2, memory_mib=1024, gpus=2)
    assert request.options.partition == "gpu-high" and request.options.time_limit_minutes == 90


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"cpu": None}, "requests no CPU"),
        ({"memory": "0"}, "requests no memory"),
        ({"grace": None}, "terminationGracePeriodSeconds is 30 (30 if unset); it must be below 25"),
        ({"grace": 25}, "must be below 25"),
        ({"gpus": "1.5"}, "whole number of GPUs"),
        ({"memory": "lots"}, "not a Kubernetes quantity"),
        ({"annotations": {model.EXCLUSIVE: "sometimes"}}, "must be none, user or ok"),
        ({"annotations": {model.PARTITION: "gpu;rm -rf /"}}, "is not a Slurm name"),
        ({"annotations": {model.TIME_LIMIT: "forever"}}, "not a Slurm time limit"),
        ({"annotations": {model.NODES: "a,,b"}}, "node names separated by commas"),
        ({"annotations": {model.COMMENT: "x\x00y"}}, "must be printable"),
    ],
)
def test_what_slurm_cannot_take_is_refused_with_the_fix(change: dict[str, Any], words: str) -> None:
    with pytest.raises(model.InvalidPod, match=words.replace("(", r"\(").replace(")", r"\)")):
        model.validate(pod(**change), KILL_WAIT)


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(model.InvalidPod) as err:
        model.validate(pod(cpu=None, memory=None, grace=60), KILL_WAIT)
    assert "CPU" in str(err.value) and "memory" in str(err.value) and "60" in str(err.value)


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("90", 90), ("5:30", 6), ("2:00:00", 120), ("1-0", 1440), ("1-2:3", 1563), ("0:0:1", 1)],
)
def test_slurm_time_forms(text: str, minutes: int) -> None:
    assert model.time_limit_minutes(text) == minutes


anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
quantities = st.one_of(
    st.sampled_from(["1", "0", "-1", "500m", "1e9", "4Gi", "1e400", "NaN", "0.0001", "99999999999999Ki"]),
    st.text(max_size=12),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True),
    anything,
)


@given(
    cpu=quantities,
    memory=quantities,
    gpus=quantities,
    grace=anything,
    annotations=st.dictionaries(
        st.sampled_from([*model.ANNOTATIONS, "other"]), anything | st.text(), max_size=8
    ),
)
@settings(max_examples=400, deadline=None)
def test_any_pod_a_tenant_writes_is_either_valid_or_refused_in_words(
    cpu: Any, memory: Any, gpus: Any, grace: Any, annotations: dict[str, Any]
) -> None:
    try:
        request = model.validate(
            pod(cpu=cpu, memory=memory, gpus=gpus, grace=grace, annotations=annotations), KILL_WAIT
        )
    except model.InvalidPod as err:
        assert str(err)
        return
    shape = request.shape
    assert shape.cpus >= 1 and shape.memory_mib >= 1 and shape.gpus >= 0
    assert isinstance(grace, int) and not isinstance(grace, bool) and grace < KILL_WAIT - 5
    body = model.submission(model.plan_placeholder([request]), "http://hooks", 25, TOKEN_PATH)
    assert body["job"]["tasks"] == 1 and body["job"]["cpus_per_task"] == shape.cpus


# -- the placeholder job ----------------------------------------------------------------------------


def requests_of(*pods: dict[str, Any]) -> list[model.PodRequest]:
    return [model.validate(p, KILL_WAIT) for p in pods]


def test_one_pod_is_one_job_whose_comment_names_the_pod() -> None:
    (request,) = requests_of(
        pod("a", gpus="2", annotations={model.PARTITION: "gpu", model.EXCLUSIVE: "user"})
    )
    placeholder = model.plan_placeholder([request])
    body = model.submission(placeholder, "http://hooks:8091", 25, TOKEN_PATH)
    job = body["job"]
    assert job["gpus_per_task"] == "2" and job["partition"] == "gpu" and job["exclusive"] == "user"
    assert job["name"] == "ml/a" and job["memory_per_cpu"] * job["cpus_per_task"] >= 4096
    assert model.key_of_comment(job["comment"]) == "pod/ml/a/uid-a"
    assert model.key_of_comment(job["comment"] + model.STARTED) == "pod/ml/a/uid-a"
    assert model.started(job["comment"] + model.STARTED) and not model.started(job["comment"])
    assert "http://hooks:8091/hooks/stop" in body["script"]
    assert job["environment"]["QUORUM_HOOK_TOKEN_FILE"] == TOKEN_PATH, "the path, never the token"
    assert '"$(cat "$QUORUM_HOOK_TOKEN_FILE"' in body["script"] and "-H @-" in body["script"]
    assert model.key_of_comment("someone else's job") is None


def test_a_gang_of_two_shapes_is_a_heterogeneous_job_and_one_shape_a_job_of_tasks() -> None:
    workers = [pod(f"w{i}", gpus="8") for i in range(3)]
    launcher = pod("launcher", cpu="1", memory="1Gi")
    mixed = model.plan_placeholder(requests_of(launcher, *workers), "ml/pg-train")
    body = model.submission(mixed, "http://hooks", 25, TOKEN_PATH)
    assert [c["tasks"] for c in body["jobs"]] == [1, 3]
    assert all(model.key_of_comment(c["comment"]) == "gang/ml/pg-train" for c in body["jobs"])
    uniform = model.submission(
        model.plan_placeholder(requests_of(*workers), "ml/pg-w"), "http://hooks", 25, TOKEN_PATH
    )
    assert uniform["job"]["tasks"] == 3 and uniform["job"]["gpus_per_task"] == "8"


@given(
    shape=st.builds(model.Shape, st.integers(1, 64), st.integers(1, 4096), st.integers(0, 8)),
    shares=st.lists(
        st.builds(model.NodeShare, st.sampled_from("abcdef"), st.integers(0, 256), st.integers(0, 16)),
        max_size=6,
    ),
    count=st.integers(1, 40),
)
def test_an_allocation_never_gets_more_pods_on_a_node_than_its_share_holds(
    shape: model.Shape, shares: list[model.NodeShare], count: int
) -> None:
    pods = tuple(model.PodRequest("ml", f"p{i}", f"u{i}", shape, model.Options()) for i in range(count))
    where = model.assign(model.Component(shape, model.Options(), pods), shares)
    capacity = model.tasks_on(shares, shape)
    if where is None:
        assert len(capacity) < count
        return
    assert len(where) == count
    for node in set(where.values()):
        used = sum(1 for n in where.values() if n == node)
        share_cpus = sum(s.cpus for s in shares if s.node == node)
        share_gpus = sum(s.gpus for s in shares if s.node == node)
        assert used * shape.cpus <= share_cpus and used * shape.gpus <= share_gpus


def test_gres_details_and_node_lists() -> None:
    assert model.gpus_of_gres("gpu:2(IDX:0-1)") == 2 and model.gpus_of_gres("gpu:h100:8(IDX:0-7)") == 8
    assert model.expand_nodelist("slurm-gpu-[000-002,005],slurm-cpu-000") == [
        "slurm-gpu-000", "slurm-gpu-001", "slurm-gpu-002", "slurm-gpu-005", "slurm-cpu-000",
    ]  # fmt: skip
    assert model.expand_nodelist(None) == [] and model.expand_nodelist("x-[a-b]") == []


@pytest.mark.parametrize(
    ("state", "reason", "preempted", "event"),
    [
        ("CANCELLED", None, False, "SlurmJobCancelled"),
        ("COMPLETING", None, False, "SlurmJobCancelled"),
        ("COMPLETING", None, True, "SlurmJobPreempted"),
        ("PREEMPTED", None, False, "SlurmJobPreempted"),
        ("COMPLETING", "TimeLimit", False, "SlurmJobTimeLimit"),
        ("NODE_FAIL", None, False, "SlurmNodeFailed"),
        ("WEIRD", None, False, "SlurmJobEnded"),
    ],
)
def test_why_a_job_ended(state: str, reason: str | None, preempted: bool, event: str) -> None:
    end = model.ended(7, state, reason, preempted)
    assert end.reason == event and "Slurm job 7" in end.message


# -- nodes ------------------------------------------------------------------------------------------


def node(
    taints: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "n", "annotations": annotations, "labels": {}},
        "spec": {"taints": taints, **spec},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


@given(
    taints=st.lists(
        st.fixed_dictionaries(
            {
                "key": st.sampled_from(["a", "is_gpu", model.LOCK]),
                "effect": st.sampled_from(["NoSchedule", "NoExecute"]),
            }
        ),
        max_size=3,
    ),
    annotations=st.none()
    | st.dictionaries(st.sampled_from(["x", model.LOCK]), st.sampled_from(model.LOCK_STATES), max_size=2),
    states=st.lists(st.sampled_from(model.LOCK_STATES), min_size=1, max_size=4),
)
def test_a_lock_patch_puts_the_node_in_the_state_and_only_touches_the_lock(
    taints: list[dict[str, Any]], annotations: dict[str, str] | None, states: list[str]
) -> None:
    current = node(taints or None, annotations)
    others = [t for t in taints if t["key"] != model.LOCK]
    for state in states:
        ops = model.lock_patch(current, state)
        if ops is not None:
            current = apply(current, ops)
        assert model.lock_patch(current, state) is None
        locked = [t for t in current["spec"]["taints"] or [] if t["key"] == model.LOCK]
        assert bool(locked) == (state != "false")
        assert (current["metadata"]["annotations"] or {}).get(model.LOCK, "false") == state
        assert [t for t in current["spec"]["taints"] or [] if t["key"] != model.LOCK] == others


@pytest.mark.parametrize(
    ("tolerations", "tolerated"),
    [
        ([], False),
        ([{"operator": "Exists"}], True),
        ([model.LOCK_TOLERATION], True),
        ([{"key": model.LOCK, "operator": "Exists"}], True),
        ([{"key": model.LOCK, "operator": "Equal", "value": "false", "effect": "NoExecute"}], False),
        ([{"key": model.LOCK, "operator": "Exists", "effect": "NoSchedule"}], False),
        ([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}], False),
    ],
)
def test_who_tolerates_the_lock(tolerations: list[dict[str, Any]], tolerated: bool) -> None:
    assert model.tolerates_lock({"spec": {"tolerations": tolerations}}) is tolerated


NOW, LATER = "2026-11-24T10:00:00Z", "2026-11-24T10:05:00Z"


def test_kubernetes_drains_and_resumes_slurm_and_a_slurm_drain_shows_on_the_node() -> None:
    cordoned = node(unschedulable=True)
    assert model.sync_node(cordoned, "idle", [], None).drain == "quorum: Kubernetes node cordoned"
    assert (
        model.sync_node(cordoned, "idle", ["DRAIN"], "quorum: Kubernetes node cordoned") == model.NodeSync()
    )
    assert model.sync_node(node(), "idle", ["DRAIN"], "quorum: Kubernetes node cordoned").resume
    not_ready = node()
    not_ready["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    assert model.sync_node(not_ready, "idle", [], None).drain == "quorum: Kubernetes node not Ready"
    by_admin = model.sync_node(node(), "idle", ["DRAIN"], "bad GPU", NOW)
    assert by_admin.annotate == "bad GPU", "someone else's drain is shown, not undone"
    assert not by_admin.drain and not by_admin.resume
    assert by_admin.condition == {
        "type": "SlurmCordon",
        "status": "True",
        "reason": "SlurmDrain",
        "message": "bad GPU",
        "lastHeartbeatTime": NOW,
        "lastTransitionTime": NOW,
    }
    shown = node(annotations={model.DRAIN_ANNOTATION: "bad GPU"})
    shown["status"]["conditions"].append(by_admin.condition)
    assert model.sync_node(shown, "idle", ["DRAIN"], "bad GPU", LATER) == model.NodeSync()
    back = model.sync_node(shown, "idle", [], None, LATER)
    assert back.annotate == "" and back.condition is not None
    assert (back.condition["status"], back.condition["reason"]) == ("False", "SlurmAvailable")
    assert back.condition["lastTransitionTime"] == LATER


def test_a_slurm_node_down_shows_on_the_kubernetes_node_and_a_missed_ping_does_not() -> None:
    down = model.sync_node(node(), "down", ["NOT_RESPONDING"], "Not responding", NOW)
    assert down.annotate == "Not responding" and not down.drain
    assert down.condition is not None
    assert (down.condition["status"], down.condition["reason"]) == ("True", "SlurmDown")
    unnamed = model.sync_node(node(), "fail", [], None, NOW)
    assert unnamed.annotate == "down in Slurm"
    # Slurm flags a node NOT_RESPONDING for a moment after every RESUME (slurmctld logs DRAINED*):
    # an admin's drain stays a drain, and a missed ping alone is nothing until Slurm says DOWN.
    drained = model.sync_node(node(), "idle", ["DRAIN", "NOT_RESPONDING"], "bad DIMM", NOW)
    assert drained.condition is not None and drained.condition["reason"] == "SlurmDrain"
    assert model.sync_node(node(), "idle", ["NOT_RESPONDING"], None, NOW) == model.NodeSync()
    ours = model.sync_node(node(), "idle", ["DRAIN"], "quorum: Kubernetes node not Ready", NOW)
    assert ours.condition is None, "a node quorum drained for its Kubernetes node is not Slurm's cordon"
    # Slurm had the node down, then quorum drained it for its NotReady Kubernetes node: the drain
    # replaced Slurm's reason, not its state, and the node is still down in Slurm.
    both = model.sync_node(node(), "down", ["DRAIN"], "quorum: Kubernetes node not Ready", NOW)
    assert both.condition is not None and both.condition["reason"] == "SlurmDown"
    assert model.sync_node(node(), "idle", [], None, NOW) == model.NodeSync(), (
        "no condition on a node never out"
    )


SLURM_STATES = st.sampled_from(
    ["idle", "allocated", "mixed", "down", "drain", "draining", "fail", "", "IDLE"]
)
SLURM_FLAGS = st.lists(
    st.sampled_from(["DRAIN", "NOT_RESPONDING", "COMPLETING", "drain", "RESERVED"]), max_size=3
)
SLURM_REASONS = st.one_of(
    st.none(), st.text(max_size=40), st.just("quorum: Kubernetes node cordoned"), st.just("x" * 5000)
)


@given(
    state=SLURM_STATES,
    flags=SLURM_FLAGS,
    reason=SLURM_REASONS,
    unschedulable=st.booleans(),
    before=st.one_of(st.none(), st.tuples(SLURM_STATES, SLURM_FLAGS, SLURM_REASONS)),
)
def test_the_slurm_cordon_condition_says_what_slurm_did_and_is_written_once(
    state: str,
    flags: list[str],
    reason: str | None,
    unschedulable: bool,
    before: tuple[str, list[str], str | None] | None,
) -> None:
    current = node(unschedulable=unschedulable)
    if before is not None:  # the condition an earlier Slurm state left on the node
        earlier = model.sync_node(current, *before, NOW).condition
        if earlier is not None:
            current["status"]["conditions"].append(earlier)
    step = model.sync_node(current, state, flags, reason, LATER)
    taken_out = model.taken_out_in_slurm(state, flags, reason)
    if step.condition is not None:
        assert step.condition["status"] == ("True" if taken_out else "False")
        assert len(step.condition["message"]) <= 1024
        kept = [c for c in current["status"]["conditions"] if c["type"] != "SlurmCordon"]
        current["status"]["conditions"] = [*kept, step.condition]
    again = model.sync_node(current, state, flags, reason, LATER)
    assert again.condition is None, "once written, the same state writes nothing"
    cordon = [c for c in current["status"]["conditions"] if c["type"] == "SlurmCordon"]
    assert (cordon[0]["status"] == "True") == bool(taken_out) if cordon else not taken_out
    if (reason or "").startswith(model.OUR_DRAIN):  # quorum's own drain is never shown as Slurm's
        assert taken_out is None or taken_out[0] == "SlurmDown"
        assert (taken_out is None) != state.lower().startswith(("down", "fail"))


# -- the local Slurm cluster's files ----------------------------------------------------------------


def test_slurm_conf_mirrors_the_pool_with_a_high_partition_beside_each(tmp_path: Path) -> None:
    nodes = [
        {
            "metadata": {"name": "g-000", "labels": {}},
            "spec": {},
            "status": {"capacity": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "8"}},
        },
        {
            "metadata": {"name": "c-000", "labels": {}},
            "spec": {"unschedulable": True},
            "status": {"capacity": {"cpu": "64", "memory": "512Gi"}},
        },
    ]
    found = devslurm.slurm_nodes(nodes, [7001, 7002], {"g-000": "gpu", "c-000": "cpu"})
    assert found[0] == devslurm.SlurmNode("g-000", 128, 1024 * 1024, 8, "gpu", 7001, None)
    assert found[1].down_reason == "quorum: Kubernetes node cordoned"
    layout = devslurm.SlurmLayout(tmp_path)
    conf = devslurm.slurm_conf(found, layout, 6817, "http://127.0.0.1:8091", "host")
    assert (
        "NodeName=g-000 NodeAddr=127.0.0.1 NodeHostname=host Port=7001 CPUs=128 RealMemory=1048576 Gres=gpu:8"
        in conf
    )
    assert "PartitionName=gpu Nodes=g-000 Default=YES PriorityTier=1" in conf
    assert "PartitionName=gpu-high Nodes=g-000 PriorityTier=10" in conf
    assert "PreemptType=preempt/partition_prio" in conf and f"KillWait={devslurm.KILL_WAIT_SECONDS}" in conf
    assert (
        devslurm.gres_conf(found, layout)
        == f"NodeName=g-000 Name=gpu File={tmp_path}/dev/g-000/nvidia[0-7]\n"
    )
    prolog = devslurm.hook_script("http://127.0.0.1:8091", "prolog", layout.hook_token)
    assert "http://127.0.0.1:8091/hooks/prolog?job=$SLURM_JOB_ID&node=$SLURMD_NODENAME" in prolog
    assert f'"$(cat {layout.hook_token})" | curl' in prolog and "-H @-" in prolog


def test_a_job_key_an_earlier_release_wrote_says_todays() -> None:
    """A gang whose group name ends like a hashed one had another name before (quorum.core.gangs):
    its job, submitted then, is still its job after the upgrade, not one to cancel
    (`SunkScheduler.reconcile` falls back on it for a job no pod claims)."""
    from quorum.core.gangs import GangSource, gang_name

    now = gang_name(GangSource.SIGS_POD_GROUP, "train-0badcafe")
    assert model.key_now("gang/ml/pg-train-0badcafe") == f"gang/ml/{now}"
    # `pg-a-b-9b17870e` is PodGroup a.b's name today and PodGroup a-b-9b17870e's then: read as
    # the second, which is why the scheduler falls back on it only for a job no pod claims.
    assert model.key_now("gang/ml/pg-a-b-9b17870e") != "gang/ml/pg-a-b-9b17870e"
    assert model.key_now("pod/ml/a/uid-a") == "pod/ml/a/uid-a"
