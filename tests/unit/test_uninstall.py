"""`quorum uninstall` against a stateful fake apiserver (tests/unit/fake_objects.py): the order of
its writes, a run that fails midway and the run after it, the backstop's bounded wait, the
reservation taints (removed once the operator may not put them back, looked for again), a dry
run that writes nothing, and its docstring's RBAC as `removal.rights` derives it."""

from __future__ import annotations

import re

import pytest
import yaml

from quorum.cli import main
from quorum.commands import uninstall as command
from quorum.commands.uninstall import UninstallError, uninstall
from quorum.core import removal
from quorum.core.removal import Ref
from tests.unit.fake_objects import OPERATOR, FakeCluster, refused

NS = "quorum-system"
RESERVED = removal.RESERVED_TAINT
LOCK = {"key": "sunk.coreweave.com/lock", "value": "true", "effect": "NoExecute"}


def reservation(token: str) -> dict[str, str]:
    return {"key": RESERVED, "value": token, "effect": "NoSchedule"}


async def no_sleep(_: float) -> None:
    return None


async def run(cluster: FakeCluster, admission_only: bool = False, **kwargs: object) -> command.Report:
    lines: list[str] = []
    return await uninstall(
        cluster,
        removal.removal_plan(NS, admission_only),
        say=lines.append,
        sleep=no_sleep,
        **kwargs,  # type: ignore[arg-type]
    )


def installed(gated: dict[str, int] | None = None) -> FakeCluster:
    cluster = FakeCluster(gated=dict(gated or {}))
    cluster.install(NS)
    cluster.custom_objects = {"gangs.quorum.dev": 2, "podgroups.scheduling.sigs.k8s.io": 0}
    return cluster


async def test_a_podgroup_crd_with_tenants_podgroups_stays_unless_asked() -> None:
    """Deleting a CRD deletes its objects: quorum's Gangs go, tenants' PodGroups only on request."""
    cluster = installed()
    cluster.custom_objects["podgroups.scheduling.sigs.k8s.io"] = 3
    report = await run(cluster)
    assert cluster.has(removal.CRD, "podgroups.scheduling.sigs.k8s.io")
    assert not cluster.has(removal.CRD, "gangs.quorum.dev")
    assert (
        "4. CustomResourceDefinition podgroups.scheduling.sigs.k8s.io: left: it holds 3 PodGroup object(s) "
        "of tenants, which would go with it (--delete-crds deletes them too)" in report.lines
    )
    report = await run(cluster, delete_tenant_objects=True)
    assert not cluster.has(removal.CRD, "podgroups.scheduling.sigs.k8s.io")
    assert (
        "4. CustomResourceDefinition podgroups.scheduling.sigs.k8s.io: deleted, and with it 3 PodGroup "
        "object(s)" in report.lines
    )


async def test_the_writes_follow_the_order_and_the_release_is_recorded() -> None:
    cluster = installed({"ml/pg-held": 2, "ml/lbl-lone": 1})
    report = await run(cluster, reason="moving to another scheduler")
    order = [w[1] for w in cluster.writes]
    assert order.index("ValidatingAdmissionPolicyBinding quorum-gang-backstop") == 0
    assert order.index("MutatingWebhookConfiguration quorum-webhooks") < order.index("ml/lbl-lone")
    assert order.index("ml/pg-held") < order.index("ValidatingAdmissionPolicyBinding quorum-gate-protection")
    assert order.index("ml/pg-held") < order.index(f"Deployment {NS}/quorum-operator")
    assert order[-1] == f"Namespace {NS}"
    assert cluster.released == [("moving to another scheduler", "admin (quorum uninstall)")]
    assert cluster.objects == {} and cluster.gated == {}
    assert report.changed and not report.refused
    assert (
        "4. CustomResourceDefinition gangs.quorum.dev: deleted, and with it 2 Gang object(s)" in report.lines
    )
    assert any(
        line.startswith("2. released the gated pods of 2 gangs (3 pods) as system:") for line in report.lines
    )
    assert "   ml/pg-held: 2 of 2 gated pods released by hand by admin (quorum uninstall)" in report.lines


async def test_a_run_that_fails_midway_is_finished_by_the_next_one_which_skips_what_is_done() -> None:
    cluster = installed({"ml/a": 1})
    validating = Ref(removal.VALIDATING_WEBHOOKS, removal.WEBHOOKS)
    cluster.fail("delete", when=lambda ref, dry_run: ref == validating, times=1)
    with pytest.raises(UninstallError) as failed:
        await run(cluster)
    assert "step 3, delete ValidatingWebhookConfiguration quorum-webhooks: the apiserver refused: 500" in str(
        failed.value
    )
    assert cluster.has(removal.VALIDATING_WEBHOOKS, removal.WEBHOOKS)
    assert not cluster.has(removal.POLICY_BINDING, removal.GATE_PROTECTION)  # done before it
    assert cluster.has(removal.POLICY, removal.BACKSTOP)  # not reached
    assert cluster.gated == {}

    again = await run(cluster)
    assert cluster.objects == {}
    assert "1. ValidatingAdmissionPolicyBinding quorum-gang-backstop: already gone" in again.lines
    assert "3. ValidatingWebhookConfiguration quorum-webhooks: deleted" in again.lines
    assert any("nothing to release" in line for line in again.lines)

    third = await run(cluster)
    assert not third.changed
    assert all(
        line.endswith(
            (
                "already gone",
                "nothing to release",
                "is no longer enforced",
                "is no longer called",
                "nothing to remove",
                "nothing to resume",
            )
        )
        for line in third.lines
    ), third.lines
    assert (
        command.summary(third, dry_run=False, admission_only=False) == "nothing of quorum was left to remove"
    )


async def test_the_mutating_webhook_waits_until_the_apiserver_no_longer_enforces_the_backstop() -> None:
    cluster = installed()
    cluster.backstop_lag = 4
    mutating = Ref(removal.MUTATING_WEBHOOKS, removal.WEBHOOKS)
    probes_when_deleted: list[int] = []
    original = cluster.delete

    async def delete(ref: Ref, dry_run: bool) -> bool:
        if ref == mutating:
            probes_when_deleted.append(cluster.probes)
        return await original(ref, dry_run)

    cluster.delete = delete  # type: ignore[method-assign]
    await run(cluster, admission_only=True)
    # 4 refusals after the binding's deletion, then 3 acceptances in a row before the webhook goes.
    assert probes_when_deleted == [4 + command.ACCEPTED_IN_A_ROW]


async def test_the_release_waits_until_the_apiserver_no_longer_calls_the_mutating_webhook() -> None:
    cluster = installed({"ml/a": 1})
    cluster.mutating_lag = 5
    original = cluster.release_gated
    probes_when_released: list[int] = []

    async def release(reason: str, by: str) -> tuple[str, list[str]]:
        probes_when_released.append(cluster.mutating_probes)
        return await original(reason, by)

    cluster.release_gated = release  # type: ignore[method-assign]
    await run(cluster, admission_only=True)
    assert probes_when_released == [5 + command.ACCEPTED_IN_A_ROW]


async def test_a_mutating_webhook_still_called_stops_the_run_before_any_release() -> None:
    cluster = installed({"ml/a": 1})
    cluster.mutating_lag = 10**6
    with pytest.raises(UninstallError) as failed:
        await run(cluster, timeout=0.05)
    assert "no longer gates a probe gang pod" in str(failed.value) and "No pod was released" in str(
        failed.value
    )
    assert cluster.gated == {"ml/a": 1}
    assert not cluster.has(removal.MUTATING_WEBHOOKS, removal.WEBHOOKS)


async def test_a_backstop_that_stays_enforced_stops_the_run_before_the_mutating_webhook() -> None:
    cluster = installed({"ml/a": 1})
    cluster.backstop_lag = 10**6
    with pytest.raises(UninstallError) as failed:
        await run(cluster, timeout=0.0)
    message = str(failed.value)
    assert (
        "not yet: the apiserver admits a probe pod" in message
        and "The mutating webhook was left in place" in message
    )
    assert cluster.has(removal.MUTATING_WEBHOOKS, removal.WEBHOOKS) and cluster.gated == {"ml/a": 1}


async def test_a_backstop_loaded_from_disk_is_named_with_what_to_do() -> None:
    cluster = installed()
    cluster.backstop_static = True
    with pytest.raises(UninstallError) as failed:
        await run(cluster)
    assert "staticManifestsDir" in str(failed.value)
    assert cluster.has(removal.MUTATING_WEBHOOKS, removal.WEBHOOKS)


async def test_a_pod_gated_again_after_the_release_fails_the_run_with_the_gangs_named() -> None:
    cluster = installed({"ml/a": 2})
    original = cluster.release_gated

    async def regated(reason: str, by: str) -> tuple[str, list[str]]:
        who, lines = await original(reason, by)
        cluster.gated["ml/a"] = 1  # something still gates it
        return who, lines

    cluster.release_gated = regated  # type: ignore[method-assign]
    with pytest.raises(UninstallError) as failed:
        await run(cluster)
    assert "still gated after 3 rounds" in str(failed.value) and "ml/a (1)" in str(failed.value)
    assert cluster.has(removal.POLICY_BINDING, removal.GATE_PROTECTION)  # the gate stays protected


async def test_a_namespace_being_deleted_is_said_so_and_not_deleted_again() -> None:
    cluster = FakeCluster()
    cluster.add(Ref(removal.NAMESPACE, NS), {"metadata": {"deletionTimestamp": "2026-11-26T00:00:00Z"}})
    report = await run(cluster)
    assert f"4. Namespace {NS}: being deleted already (what is in it goes first)" in report.lines
    assert cluster.writes == [] and not report.changed


async def test_a_crd_someone_else_installed_stays() -> None:
    theirs = {"metadata": {"labels": {}}, "spec": {"names": {"kind": "PodGroup"}, "versions": []}}
    cluster = FakeCluster()
    cluster.install(NS, crds={"podgroups.scheduling.x-k8s.io": theirs})
    report = await run(cluster)
    assert cluster.has(removal.CRD, "podgroups.scheduling.x-k8s.io")
    assert list(cluster.objects) == [Ref(removal.CRD, "podgroups.scheduling.x-k8s.io")]
    assert (
        "4. CustomResourceDefinition podgroups.scheduling.x-k8s.io: left: not labelled "
        "app.kubernetes.io/part-of=quorum, so someone else installed it" in report.lines
    )


async def test_a_dry_run_writes_nothing_says_every_step_and_every_refusal() -> None:
    cluster = installed({"ml/a": 2})
    cluster.taints = {"gpu-1": [reservation("abc")]}
    cluster.fail("delete", when=lambda ref, dry_run: ref.kind is removal.NAMESPACE, error=refused(403, "no"))
    report = await run(cluster, dry_run=True)
    assert cluster.writes == [] and cluster.gated == {"ml/a": 2}
    steps = [s for s in removal.removal_plan(NS)]
    assert len(report.lines) == len(steps)
    assert report.lines[0] == "1. ValidatingAdmissionPolicyBinding quorum-gang-backstop: would delete"
    assert (
        report.lines[4].startswith("2. would release 2 gated pods of 1 gangs as system:")
        and "ml/a (2)" in report.lines[4]
    )
    assert report.lines[-1] == f"4. delete Namespace {NS}: would be refused: 403 Forbidden: no"
    assert f"4. node gpu-1: would remove {RESERVED}=abc (as {OPERATOR})" in report.lines
    assert cluster.taints == {"gpu-1": [reservation("abc")]}
    assert report.refused
    assert "nothing was changed" in command.summary(report, dry_run=True, admission_only=False)


async def test_admission_only_leaves_the_deployments_fences_rbac_crds_and_namespace() -> None:
    cluster = installed({"ml/a": 1})
    cluster.taints = {"gpu-1": [reservation("abc")]}
    report = await run(cluster, admission_only=True)
    left = {str(ref) for ref in cluster.objects}
    assert f"Deployment {NS}/quorum-operator" in left and f"Namespace {NS}" in left
    assert "ValidatingAdmissionPolicy quorum-operator-fence" in left
    for gone in (
        "ValidatingAdmissionPolicyBinding quorum-gang-backstop",
        "MutatingWebhookConfiguration quorum-webhooks",
        "ValidatingAdmissionPolicy quorum-gate-protection",
        "ValidatingWebhookConfiguration quorum-webhooks",
        "ValidatingAdmissionPolicy quorum-gang-backstop",
    ):
        assert gone not in left
    assert cluster.gated == {}
    assert cluster.taints == {"gpu-1": []}  # as the operator, after everything of admission
    assert report.lines[-2:] == [
        f"3. node gpu-1: removed {RESERVED}=abc (as {OPERATOR})",
        f"3. 1 nodes no longer reserved by quorum: none seen in 5 looks in a row (as {OPERATOR})",
    ]
    assert cluster.writes[-1] == ("untaint", "gpu-1")
    assert "no longer gates pods" in command.summary(report, dry_run=False, admission_only=True)


async def test_jobs_quorum_suspended_are_resumed_after_the_release_each_once_its_pods_are_gone() -> None:
    cluster = installed({"ml/a": 1})
    cluster.suspend("ml/victim", "pg-low")  # a preemption's: its pods are gone
    cluster.suspend("ml/train", "pg-train", pods=2)  # a recovery's: 2 pods still terminating

    def pods_go(c: FakeCluster) -> None:
        if c.job_lists == 2:
            c.jobs["ml/train"]["pods"] = 0

    cluster.on_jobs = pods_go
    report = await run(cluster)
    assert not any(job["suspended"] for job in cluster.jobs.values())
    order = [w[1] for w in cluster.writes]
    gate = order.index("ValidatingAdmissionPolicyBinding quorum-gate-protection")
    assert order.index("ml/a") < order.index("ml/victim") < order.index("ml/train") < gate
    assert [line for line in report.lines if "Job" in line] == [
        "2. Job ml/train (suspended by quorum, gang ml/pg-train): 2 pods left; resumed once they are gone",
        f"2. Job ml/victim (suspended by quorum, gang ml/pg-low): resumed (as {OPERATOR})",
        f"2. Job ml/train (suspended by quorum, gang ml/pg-train): resumed (as {OPERATOR})",
    ]


async def test_a_job_whose_pods_stay_stops_the_run_before_gate_protection_and_a_rerun_resumes_it() -> None:
    cluster = installed()
    cluster.suspend("ml/train", "pg-train", pods=1)
    with pytest.raises(UninstallError) as failed:
        await run(cluster, timeout=0.05)
    assert "Jobs quorum suspended still have pods: ml/train (1 pods)" in str(failed.value)
    assert cluster.jobs["ml/train"]["suspended"]
    assert cluster.has(removal.POLICY_BINDING, removal.GATE_PROTECTION)  # not reached

    cluster.jobs["ml/train"]["pods"] = 0
    again = await run(cluster)
    assert not cluster.jobs["ml/train"]["suspended"] and cluster.objects == {}
    assert f"2. Job ml/train (suspended by quorum, gang ml/pg-train): resumed (as {OPERATOR})" in again.lines


async def test_a_dry_run_says_which_jobs_it_would_resume_and_when() -> None:
    cluster = installed()
    cluster.suspend("ml/victim", "pg-low")
    cluster.suspend("ml/train", "pg-train", pods=2)
    report = await run(cluster, dry_run=True)
    assert cluster.writes == [] and all(job["suspended"] for job in cluster.jobs.values())
    assert [line for line in report.lines if "Job" in line] == [
        f"2. Job ml/train (suspended by quorum, gang ml/pg-train): would resume once its 2 pods are gone "
        f"(as {OPERATOR})",
        f"2. Job ml/victim (suspended by quorum, gang ml/pg-low): would resume now (as {OPERATOR})",
    ]


async def test_reservation_taints_go_once_the_operator_may_no_longer_write_a_node() -> None:
    cluster = installed({"ml/a": 1})
    cluster.taints = {
        "gpu-1": [reservation("abc")],
        "gpu-2": [LOCK, reservation("abc"), reservation("old")],  # Slurm's lock stays
        "gpu-3": [LOCK],
    }
    report = await run(cluster)
    assert cluster.taints == {"gpu-1": [], "gpu-2": [LOCK], "gpu-3": [LOCK]}
    order = [w[1] for w in cluster.writes]
    # After the operator's RBAC (its Deployment went in step 3): nothing of quorum can put one back.
    assert order.index("ClusterRoleBinding quorum-operator") < order.index("gpu-1")
    assert order.index("ClusterRole quorum-operator") < order.index("gpu-1")
    assert order[-3:] == ["gpu-1", "gpu-2", f"Namespace {NS}"]
    assert f"4. node gpu-1: removed {RESERVED}=abc (as {OPERATOR})" in report.lines
    assert f"4. node gpu-2: removed {RESERVED}=abc, {RESERVED}=old (as {OPERATOR})" in report.lines
    assert not any("gpu-3" in line for line in report.lines)
    # One look, then RESERVATION_QUIET looks in a row that find none.
    assert cluster.looks == 1 + removal.RESERVATION_QUIET


async def test_a_run_cut_off_among_the_nodes_is_finished_by_the_next_one() -> None:
    cluster = installed()
    cluster.taints = {"gpu-1": [reservation("abc")], "gpu-2": [reservation("abc")]}
    cluster.fail("unreserve", when=lambda node, dry_run: node == "gpu-2", times=1)
    with pytest.raises(UninstallError) as failed:
        await run(cluster)
    assert (
        f"step 4, remove quorum's reservation taint {RESERVED} from every node: the apiserver refused: 500"
        in str(failed.value)
    )
    assert cluster.taints == {"gpu-1": [], "gpu-2": [reservation("abc")]}
    assert cluster.has(removal.NAMESPACE, NS)  # not reached

    again = await run(cluster)
    assert cluster.taints == {"gpu-1": [], "gpu-2": []} and cluster.objects == {}
    assert f"4. node gpu-2: removed {RESERVED}=abc (as {OPERATOR})" in again.lines
    assert not any("gpu-1" in line for line in again.lines)

    third = await run(cluster)
    assert not third.changed
    assert third.lines[-2] == (
        f"4. no node has quorum's reservation taint {RESERVED} (none seen in 5 looks in a row, "
        f"as {OPERATOR}): nothing to remove"
    )


async def test_a_taint_put_back_by_an_operator_still_running_is_removed_again() -> None:
    cluster = installed()
    cluster.taints = {"gpu-1": [reservation("abc")]}

    def put_back(c: FakeCluster) -> None:
        if c.looks == 3:  # a preemption the operator decided before the release
            c.taints["gpu-1"].append(reservation("late"))

    cluster.on_look = put_back
    report = await run(cluster, admission_only=True)
    assert cluster.taints == {"gpu-1": []}
    assert (
        f"3. node gpu-1: removed {RESERVED}=late again: it was put back (quorum's operator still ran) "
        f"(as {OPERATOR})" in report.lines
    )
    assert cluster.looks == 4 + removal.RESERVATION_QUIET  # seen at the 4th look


async def test_taints_still_put_back_after_the_timeout_stop_the_run_saying_what_to_do() -> None:
    cluster = installed()
    cluster.taints = {"gpu-1": [reservation("abc")]}

    def always(c: FakeCluster) -> None:
        c.taints["gpu-1"] = [reservation("again")]

    cluster.on_look = always
    with pytest.raises(UninstallError) as failed:
        await run(cluster, admission_only=True, timeout=0.05)
    assert "reservation taints are still being put back (nodes gpu-1)" in str(failed.value)
    assert "scale its Deployment to 0" in str(failed.value)


def rbac_in_docstring() -> list[dict[str, object]]:
    block = re.search(r"\n    apiVersion: rbac.*?\n\n", command.__doc__ or "", re.S)
    assert block is not None
    return [d for d in yaml.safe_load_all(block.group(0).replace("\n    ", "\n")) if d]


def test_the_docstrings_rbac_is_exactly_what_admission_only_needs() -> None:
    rules = removal.rights(removal.removal_plan(NS, True), NS, command.DEFAULT_PROBE_NAMESPACE)
    derived = [
        d
        for d in removal.rbac_manifests(rules, "quorum-lifecycle", NS)
        if d["kind"] in ("ClusterRole", "Role")
    ]
    assert rbac_in_docstring() == derived


def test_bad_arguments_are_refused_before_any_call(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["uninstall", "--namespace", "Not_A_Namespace"]) == 2
    assert "is not a namespace name" in capsys.readouterr().err
    assert main(["uninstall", "--namespace", "q", "--probe-namespace", "q"]) == 2
    assert "--probe-namespace" in capsys.readouterr().err
