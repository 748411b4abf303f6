"""`quorum uninstall` against a stateful fake apiserver (tests/unit/fake_objects.py): the order of
its writes, a run that fails midway and the run after it, quorum-operator stopped first (its
Lease taken, its last leader waited out), the probes' positive evidence and bounded waits, a
namespace quorum did not make left, pods their creator gated left, a late apiserver's gated
pods swept, the reservation taints (removed once the operator may not put them back, looked for
again), a dry run that writes nothing, and its docstring's RBAC as `removal.rights` derives it.
Against a recording apiserver (tests/unit/recording_apiserver.py): the probes' connections, the
count of a CRD's objects, and who `quorum release` says ran it."""

from __future__ import annotations

import getpass
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from quorum.cli import main
from quorum.commands import uninstall as command
from quorum.commands.uninstall import UninstallError, uninstall
from quorum.core import removal
from quorum.core.gangs import RESERVED_TAINT
from quorum.core.removal import Ref
from quorum.core.times import micro_time, timestamp
from quorum.k8s import objects
from quorum.k8s.client import api_client
from quorum.operator.leader import LeaseSettings
from tests.unit.fake_objects import LEADER, OPERATOR, FakeCluster, refused
from tests.unit.recording_apiserver import RecordingApiserver

NS = "quorum-system"
LEASE = Ref(removal.LEASE, removal.OPERATOR_LEASE, NS)
RESERVED = RESERVED_TAINT
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
        **{"sleep": no_sleep, **kwargs},  # type: ignore[arg-type]
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
    assert order[0] == removal.UNINSTALL_HOLDER  # the Lease first: quorum-operator stops acting
    assert order.index("ValidatingAdmissionPolicyBinding quorum-gang-backstop") == 1
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
                "nothing to check",
                "nothing to take",
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
    # 1 refusal before the binding's deletion (the evidence that the probe namespace is covered),
    # 4 after it, then 3 acceptances in a row before the webhook goes (its dry-run deletion,
    # asking whether it is there, is the first).
    assert probes_when_deleted == [1 + 4 + command.ACCEPTED_IN_A_ROW] * 2


async def test_the_release_waits_until_the_apiserver_no_longer_calls_the_mutating_webhook() -> None:
    cluster = installed({"ml/a": 1})
    cluster.mutating_lag = 5
    original = cluster.release_gated
    probes_when_released: list[int] = []

    async def release(reason: str, by: str, created_before: float | None) -> tuple[str, list[str]]:
        probes_when_released.append(cluster.mutating_probes)
        return await original(reason, by, created_before)

    cluster.release_gated = release  # type: ignore[method-assign]
    await run(cluster, admission_only=True)
    # 1 gated before the deletion (the evidence that the webhook applies there), 5 after it, 3 ungated.
    assert probes_when_released == [1 + 5 + command.ACCEPTED_IN_A_ROW]


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

    async def regated(reason: str, by: str, created_before: float | None) -> tuple[str, list[str]]:
        who, lines = await original(reason, by, created_before)
        cluster.gated["ml/a"] = 1  # a pod quorum gated stays gated (its release refused, say)
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
    assert report.lines[0] == (
        f"0. Lease {NS}/quorum-operator: would take it from {LEADER} (its lease 15 s) and wait 15 s until "
        "it can no longer act"
    )
    assert report.lines[2] == "1. ValidatingAdmissionPolicyBinding quorum-gang-backstop: would delete"
    assert (
        report.lines[9].startswith("2. would release 2 gated pods of 1 gangs as system:")
        and "ml/a (2)" in report.lines[9]
    )
    assert report.lines[-1] == (
        f"4. delete if labelled quorum's Namespace {NS}: would be refused: 403 Forbidden: no"
    )
    assert cluster.holder() == LEADER
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
        "MutatingAdmissionPolicy quorum-pod-defaults",
        "MutatingAdmissionPolicyBinding quorum-pod-defaults",
        "ValidatingAdmissionPolicy quorum-gang-pods",
    ):
        assert gone not in left
    assert cluster.gated == {}
    assert cluster.taints == {"gpu-1": []}  # as the operator, after everything of admission
    assert report.lines[-3:] == [
        f"3. node gpu-1: removed {RESERVED}=abc (as {OPERATOR})",
        f"3. 1 nodes no longer reserved by quorum: none seen in 5 looks in a row (as {OPERATOR})",
        f"3. Lease {NS}/quorum-operator: held for 60 s more: past the operator pods' termination as Helm "
        "deletes them; an operator installed again acts after that",
    ]
    assert cluster.writes[-2:] == [("untaint", "gpu-1"), ("lease", removal.UNINSTALL_HOLDER)]
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
    assert order.index("gpu-2") < order.index(f"Lease {NS}/quorum-operator") < order.index(f"Namespace {NS}")
    assert order[-1] == f"Namespace {NS}"
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
    assert (
        f"4. no node has quorum's reservation taint {RESERVED} (none seen in 5 looks in a row, "
        f"as {OPERATOR}): nothing to remove"
    ) in third.lines


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


# -- quorum's namespace: deleted only if quorum made it ---------------------------------------


async def test_a_namespace_quorum_did_not_make_stays_and_quorums_objects_in_it_go_by_name() -> None:
    """quorum installed into a shared namespace (Helm's --create-namespace, or `--namespace
    team-a` given by mistake): the namespace and a tenant's object in it stay."""
    cluster = installed()
    cluster.objects[Ref(removal.NAMESPACE, NS)]["metadata"]["labels"] = {"team": "a"}
    theirs = Ref(removal.CONFIG_MAP, "team-a-settings", NS)
    cluster.add(theirs)
    report = await run(cluster)
    assert cluster.has(removal.NAMESPACE, NS) and theirs in cluster.objects
    assert set(cluster.objects) == {Ref(removal.NAMESPACE, NS), theirs}  # quorum's, by name: gone
    assert f"4. Lease {NS}/quorum-operator: deleted" in report.lines
    assert f"4. ServiceAccount {NS}/quorum-operator: deleted" in report.lines
    assert (
        f"4. Namespace {NS}: left: not labelled app.kubernetes.io/part-of=quorum, so quorum did not make"
        in (report.lines[-1])
    )
    assert command.summary(report, dry_run=False, admission_only=False) == "quorum is uninstalled"


async def test_the_namespace_quorum_made_goes_after_its_objects_and_the_hook_identities() -> None:
    cluster = installed()
    report = await run(cluster)
    assert cluster.objects == {}
    order = [w[1] for w in cluster.writes]
    for left_by_a_killed_hook in (
        "ClusterRoleBinding quorum-uninstall-hook",
        "ClusterRole quorum-certs-hook",
        f"ServiceAccount {NS}/quorum-uninstall-hook",
        f"Role {command.DEFAULT_PROBE_NAMESPACE}/quorum-uninstall-hook",
    ):
        assert left_by_a_killed_hook in order
    assert report.lines[-1] == f"4. Namespace {NS}: deleted"


# -- step 0: quorum-operator stops acting first -----------------------------------------------


class Clock:
    def __init__(self, at: float = 1_800_000_000.0) -> None:
        self.at = at
        self.slept: list[tuple[float, list[tuple[str, str]]]] = []  # (seconds, the writes made before)

    def __call__(self) -> float:
        return self.at


async def test_the_operator_stops_acting_before_anything_else_its_lease_taken_and_waited_out() -> None:
    cluster = installed({"ml/a": 1})
    clock = Clock()

    async def sleep(seconds: float) -> None:
        clock.slept.append((seconds, list(cluster.writes)))

    report = await run(cluster, admission_only=True, sleep=sleep, now=clock)
    waited = LeaseSettings.for_duration(NS, 15).acts_at_most() + removal.LEASE_MARGIN
    assert waited == 15  # 2 retry periods of 1 s, the renew deadline of 8 s, a 2 s read, 3 s
    # The first wait is the Lease's, made before any deletion: only the Lease was written.
    assert clock.slept[0] == (waited, [("lease", removal.UNINSTALL_HOLDER)])
    lease = cluster.objects[LEASE]
    assert lease["spec"]["holderIdentity"] == removal.UNINSTALL_HOLDER
    assert lease["spec"]["leaseTransitions"] == 4
    assert lease["metadata"]["annotations"][command.PREVIOUS_HOLDER] == LEADER
    # Taken for a short hold (renewed while the run goes on), left held 60 s more at the end.
    assert removal.lease_hold_seconds(60) == removal.LEASE_HOLD_SECONDS == 120
    assert lease["spec"]["leaseDurationSeconds"] == removal.LEASE_LEFT_SECONDS == 60
    assert report.lines[:2] == [
        f"0. Lease {NS}/quorum-operator: taken from {LEADER} (its lease 15 s) for quorum-uninstall, held "
        "120 s; waiting 15 s: a leader acts at most 12 s after its last renewal (quorum/operator/leader.py), "
        "plus 3 s",
        f"0. Lease {NS}/quorum-operator: held by quorum-uninstall: no replica of quorum-operator acts now "
        "(each sees another holder, for 120 s at a time: renewed while the run goes on)",
    ]
    assert "acts (its Lease is held)" in command.summary(report, dry_run=False, admission_only=True)

    # A re-run finds it held: renewed, no wait (the replica it was taken from stopped long ago).
    clock.at += 300
    clock.slept.clear()
    again = await run(cluster, admission_only=True, sleep=sleep, now=clock)
    assert again.lines[0] == (
        f"0. Lease {NS}/quorum-operator: held by quorum-uninstall already (a run before took it): "
        "renewed for 120 s"
    )
    assert all(seconds != waited for seconds, _ in clock.slept)
    renewed = cluster.objects[Ref(removal.LEASE, removal.OPERATOR_LEASE, NS)]["spec"]
    assert renewed["renewTime"] == micro_time(clock.at) and renewed["holderIdentity"] == "quorum-uninstall"
    assert not again.changed


async def test_a_run_cut_off_while_it_waited_for_the_old_leader_waits_the_rest() -> None:
    cluster = installed()
    clock = Clock()
    cluster.fail("delete", when=lambda ref, dry_run: True, times=1)  # the run stops after step 0
    with pytest.raises(UninstallError):
        await run(cluster, now=clock)
    clock.at += 5
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    report = await run(cluster, admission_only=True, sleep=sleep, now=clock)
    assert slept[0] == 10  # 15 s from the first run's write
    assert (
        "renewed for 120 s; waiting 10 s more, until the replica it was taken from can no longer act"
        in (report.lines[0])
    )


async def test_a_lease_renewed_between_the_read_and_the_write_is_read_again() -> None:
    cluster = installed()
    cluster.fail("write_lease", times=1, error=refused(409, "the object has been modified"))
    report = await run(cluster, admission_only=True)
    assert cluster.holder() == removal.UNINSTALL_HOLDER
    assert report.lines[0].startswith(f"0. Lease {NS}/quorum-operator: taken from {LEADER}")


async def test_no_lease_is_made_held_so_that_no_replica_starting_now_acts() -> None:
    cluster = installed()
    del cluster.objects[Ref(removal.LEASE, removal.OPERATOR_LEASE, NS)]
    report = await run(cluster, admission_only=True)
    assert cluster.holder() == removal.UNINSTALL_HOLDER
    assert report.lines[0] == (
        f"0. Lease {NS}/quorum-operator: made it; held by quorum-uninstall for 120 s: no replica of "
        "quorum-operator acts"
    )


# -- the Lease: a short hold, renewed while the run goes on ---------------------------------


class HeldThroughout:
    """A sleep on `clock` that checks, at every sleep, that the Lease held by the uninstall does
    not run out before the sleep ends (now + seconds < renewTime + leaseDurationSeconds), and
    records each renewal it sees (renewTime, leaseDurationSeconds)."""

    def __init__(self, cluster: FakeCluster, clock: Clock) -> None:
        self.cluster, self.clock = cluster, clock
        self.seen: list[tuple[str, int]] = []

    async def __call__(self, seconds: float) -> None:
        spec = (self.cluster.objects.get(LEASE) or {}).get("spec") or {}
        if spec.get("holderIdentity") == removal.UNINSTALL_HOLDER:
            until = timestamp(spec["renewTime"]) + spec["leaseDurationSeconds"]
            assert self.clock.at + seconds < until, (self.clock.at, seconds, spec)
            if not self.seen or self.seen[-1][0] != spec["renewTime"]:
                self.seen.append((spec["renewTime"], spec["leaseDurationSeconds"]))
        self.clock.at += seconds


def slow_cluster() -> FakeCluster:
    """Steps that each take longer than a quarter of the hold at 20 s a look: a Job whose pods
    go late, a taint put back once."""
    cluster = installed({"ml/a": 1})
    cluster.suspend("ml/train", "pg-train", pods=1)
    cluster.taints = {"gpu-1": [reservation("abc")]}

    def pods_go(c: FakeCluster) -> None:
        if c.job_lists == 4:
            c.jobs["ml/train"]["pods"] = 0

    def put_back(c: FakeCluster) -> None:
        if c.looks == 3:
            c.taints["gpu-1"].append(reservation("late"))

    cluster.on_jobs, cluster.on_look = pods_go, put_back
    return cluster


@pytest.mark.parametrize("admission_only", [False, True])
async def test_a_long_run_renews_the_lease_quietly_so_that_its_short_hold_never_runs_out(
    admission_only: bool,
) -> None:
    cluster, clock = slow_cluster(), Clock()
    held = HeldThroughout(cluster, clock)
    report = await run(cluster, admission_only, sleep=held, now=clock, interval=20.0)
    hold = removal.lease_hold_seconds(60)
    assert clock.at - Clock().at > 3 * hold  # the run took far longer than one hold
    times = [timestamp(t) for t, _ in held.seen]
    assert len(times) >= 8 and times == sorted(set(times))  # renewed, each renewTime later
    assert {seconds for _, seconds in held.seen} == {hold}
    assert all(b - a >= hold / 4 for a, b in itertools.pairwise(times))  # renewed when due, not more
    # Quiet: the same lines as a run on the same cluster that takes no time.
    quick = await run(slow_cluster(), admission_only)
    assert report.lines == quick.lines
    if admission_only:  # left held a short, stated time from the end of the run
        spec = cluster.objects[LEASE]["spec"]
        assert spec["holderIdentity"] == removal.UNINSTALL_HOLDER
        assert spec["leaseDurationSeconds"] == removal.LEASE_LEFT_SECONDS == 60
        assert spec["renewTime"] == micro_time(clock.at)
        assert report.lines[-1] == (
            f"3. Lease {NS}/quorum-operator: held for 60 s more: past the operator pods' termination as "
            "Helm deletes them; an operator installed again acts after that"
        )
    else:  # the full run deletes it, after the operator's Role, no longer renewed
        assert cluster.objects == {}
        order = [w[1] for w in cluster.writes]
        assert order.index(f"Lease {NS}/quorum-operator") > max(
            i for i, w in enumerate(order) if w == removal.UNINSTALL_HOLDER
        )


async def test_a_renewal_refused_for_a_conflict_is_read_again_and_a_forbidden_one_stops_renewing() -> None:
    cluster, clock = slow_cluster(), Clock()

    def renewal(ref: Ref, body: dict[str, object]) -> bool:
        return cluster.holder() == removal.UNINSTALL_HOLDER  # not step 0's taking it

    cluster.fail("write_lease", when=renewal, times=2, error=refused(409, "the object has been modified"))
    held = HeldThroughout(cluster, clock)
    await run(cluster, admission_only=True, sleep=held, now=clock, interval=20.0)
    assert cluster.faults[0].times == 0 and len(held.seen) >= 6  # read again, and renewed on from there

    # The operator's RBAC gone (403): none of its replicas can lead; the run stops renewing.
    cluster, clock = slow_cluster(), Clock()
    tried: list[str] = []
    write_lease = cluster.write_lease

    async def counted(ref: Ref, body: dict[str, Any], create: bool, dry_run: bool) -> None:
        tried.append(body["spec"]["holderIdentity"])
        await write_lease(ref, body, create, dry_run)

    cluster.write_lease = counted  # type: ignore[method-assign]
    cluster.fail("write_lease", when=renewal, error=refused(403, "cannot update leases"))

    async def sleep(seconds: float) -> None:  # no replica can lead: the hold may run out
        clock.at += seconds

    report = await run(cluster, admission_only=True, sleep=sleep, now=clock, interval=20.0)
    assert len(tried) == 2  # step 0's, and the one renewal refused: none after it
    assert cluster.gated == {} and cluster.taints == {"gpu-1": []}
    assert report.lines[-1] == (
        f"3. Lease {NS}/quorum-operator: not held by quorum-uninstall: quorum-operator may not write it (its "
        "RBAC or namespace is gone), so none of its replicas can lead: nothing to leave held"
    )


async def test_a_lease_taken_back_by_a_replica_mid_run_stops_the_run() -> None:
    cluster, clock = slow_cluster(), Clock()

    async def sleep(seconds: float) -> None:
        clock.at += seconds
        if clock.at - Clock().at > 100:  # the hold ran out (a run held up), a replica took it
            cluster.objects[LEASE]["spec"]["holderIdentity"] = LEADER

    with pytest.raises(UninstallError) as failed:
        await run(cluster, admission_only=True, sleep=sleep, now=clock, interval=20.0)
    assert f"Lease {NS}/quorum-operator is held by {LEADER} now" in str(failed.value)
    assert "Run quorum uninstall again: it takes the Lease again" in str(failed.value)


async def test_a_dry_run_takes_renews_and_leaves_nothing() -> None:
    cluster = slow_cluster()
    clock = Clock()

    def jumping() -> float:  # 40 s pass between any two looks at the clock: a renewal is always due
        clock.at += 40
        return clock.at

    report = await run(cluster, admission_only=True, dry_run=True, now=jumping, interval=20.0)
    assert cluster.writes == [] and cluster.holder() == LEADER
    assert "renewTime" not in cluster.objects[LEASE]["spec"]
    assert report.lines[-1] == (
        f"3. Lease {NS}/quorum-operator: would be held for 60 s more: past the operator pods' termination "
        "as Helm deletes them; an operator installed again acts after that"
    )


# -- step 1: positive evidence before each deletion -------------------------------------------


async def test_a_probe_namespace_the_backstop_leaves_out_stops_the_run_before_any_deletion() -> None:
    cluster = installed({"ml/a": 1})
    cluster.backstop_covers = False  # its probe is admitted at once, binding or not
    with pytest.raises(UninstallError) as failed:
        await run(cluster)
    assert "the backstop does not cover namespace default" in str(failed.value)
    assert "Nothing was deleted" in str(failed.value)
    assert [w[0] for w in cluster.writes] == ["lease"]
    assert cluster.has(removal.POLICY_BINDING, removal.BACKSTOP) and cluster.gated == {"ml/a": 1}

    dry = await run(cluster, dry_run=True)
    assert dry.refused and any(line.startswith("1. would fail: step 1: ") for line in dry.lines)


async def test_a_mutating_webhook_whose_server_is_down_is_said_to_change_nothing_and_goes() -> None:
    cluster = installed({"ml/a": 1})
    cluster.webhook_down = True
    report = await run(cluster, admission_only=True)
    assert not cluster.has(removal.MUTATING_WEBHOOKS, removal.WEBHOOKS) and cluster.gated == {}
    assert (
        "1. MutatingWebhookConfiguration quorum-webhooks: a probe gang pod comes back ungated while it is "
        "there (server-side dry run in namespace default): its server does not answer and it fails open "
        "(failurePolicy Ignore), so deleting it changes nothing for pods; going on" in report.lines
    )


def test_bad_probe_namespaces_are_refused_by_the_one_rule(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    for probe in ("kube-system", "kube-node-lease"):
        assert main(["uninstall", "--probe-namespace", probe]) == 2
        assert f"--probe-namespace {probe}: quorum's backstop does not apply there" in capsys.readouterr().err
    assert main(["uninstall", "--quorum-namespace", "a", "--namespace", "b"]) == 2
    assert "differ" in capsys.readouterr().err


# -- steps 2 and 3: the pods quorum gated -----------------------------------------------------


async def test_pods_gated_after_the_webhooks_drop_are_released_and_a_tenant_cannot_block_the_run() -> None:
    """Pods created with quorum's gate after the cutoff (the drop seen, plus GATED_MARGIN: an
    apiserver late to drop the webhook, a skewed clock, or a tenant) are released too; a tenant
    who keeps creating them does not keep the run going or fail it: they are named, and left."""
    cluster = installed({"ml/a": 2})
    cluster.self_gated = {"ml/own": 2}

    def more(c: FakeCluster) -> None:
        c.self_gated["ml/own"] = c.self_gated.get("ml/own", 0) + 1

    cluster.on_release = more
    report = await run(cluster, admission_only=True)
    assert cluster.gated == {} and cluster.self_gated == {"ml/own": 1}  # only the last one made
    assert (
        "2. 2 pods gated after quorum's mutating webhook was seen no longer called (by their creator, or an "
        "apiserver late to drop it): ml/own-0, ml/own-1: released too; they fail nothing" in report.lines
    )
    assert any(line.startswith("2. released the gated pods of 2 gangs (4 pods)") for line in report.lines)
    assert (
        "2. gated pods created after quorum's mutating webhook was no longer called keep coming (their "
        "creator gates them): ml/own (1): left gated" in report.lines
    )


async def test_a_pod_a_late_apiserver_gated_after_the_cutoff_is_not_left_gated() -> None:
    cluster = installed({"ml/a": 1})
    cluster.self_gated = {"ml/late": 1}  # created after the cutoff, gated by a lagging apiserver
    await run(cluster, admission_only=True)
    assert cluster.gated == {} and cluster.self_gated == {}


async def test_pods_an_apiserver_late_to_drop_the_webhook_gated_are_swept_after_gate_protection() -> None:
    cluster = installed({"ml/a": 1})
    original = cluster.delete

    async def delete(ref: Ref, dry_run: bool) -> bool:
        gone = await original(ref, dry_run)
        if ref == Ref(removal.POLICY, removal.GATE_PROTECTION) and not dry_run:
            cluster.gated["ml/late"] = 1  # created before the drop was seen, released by nobody yet
        return gone

    cluster.delete = delete  # type: ignore[method-assign]
    report = await run(cluster, admission_only=True)
    assert cluster.gated == {}
    order = [w[1] for w in cluster.writes]
    assert order.index("ValidatingAdmissionPolicy quorum-gate-protection") < order.index("ml/late")
    assert order.index("ml/late") < order.index("ValidatingWebhookConfiguration quorum-webhooks")
    assert (
        f"3. 1 pods gated since the release were released: none seen in 5 looks in a row, as {OPERATOR}"
        in report.lines
    )


async def test_a_job_whose_status_says_none_but_whose_pod_is_listed_waits_for_it() -> None:
    """quorum's recovery's rule (`lifecycle.job_may_resume`): its status lags behind its pods."""
    cluster = installed()
    cluster.suspend("ml/train", "pg-train", pods=0, listed=1)

    def pod_goes(c: FakeCluster) -> None:
        if c.job_lists == 2:
            c.jobs["ml/train"]["listed"] = 0

    cluster.on_jobs = pod_goes
    report = await run(cluster)
    assert [line for line in report.lines if "Job" in line] == [
        "2. Job ml/train (suspended by quorum, gang ml/pg-train): 1 pods left; resumed once they are gone",
        f"2. Job ml/train (suspended by quorum, gang ml/pg-train): resumed (as {OPERATOR})",
    ]


# -- the live API: probes on connections of their own, counts, who ran it ---------------------


async def test_each_probe_is_made_on_a_connection_of_its_own(tmp_path: Path) -> None:
    """Behind a load balancer each may reach another apiserver: 3 acceptances on one keep-alive
    connection would all be one apiserver's."""
    with RecordingApiserver(tmp_path) as fake:
        api = await api_client(str(fake.kubeconfig))
        async with api:
            live = command.LiveUninstallApi(api, api, OPERATOR)
            for _ in range(3):
                await live.probe_mutating("default")
                await live.probe_backstop("default")
            await live.read(Ref(removal.NAMESPACE, "default"))  # any other request
            await live.read(Ref(removal.NAMESPACE, "default"))
    probes = [r for r in fake.requests if r.method == "POST" and r.path.endswith("/pods")]
    others = [r for r in fake.requests if r.method == "GET"]
    assert len(probes) == 6 and len({r.peer for r in probes}) == 6
    assert len({r.peer for r in others}) == 1  # the rest keeps its connection


class Listed:
    def __init__(self, answer: dict[str, object]) -> None:
        self.status, self.answer = 200, answer

    async def read(self) -> bytes:
        return json.dumps(self.answer).encode()


class CountingApi:
    """What `objects.count` asks, and the pages it is answered with."""

    def __init__(self, *pages: dict[str, object]) -> None:
        self.pages = list(pages)
        self.queries: list[dict[str, str]] = []

    async def call_api(
        self, url: str, method: str, query_params: list[tuple[str, str]], **_: object
    ) -> Listed:
        self.queries.append(dict(query_params))
        return Listed(self.pages.pop(0))


async def test_a_crds_objects_are_counted_without_listing_them() -> None:
    api = CountingApi({"items": [{}], "metadata": {"remainingItemCount": 41, "continue": "x"}})
    kind = removal.Kind("scheduling.sigs.k8s.io", "v1alpha1", "podgroups", "PodGroup", namespaced=True)
    assert await objects.count(api, kind) == 42  # type: ignore[arg-type]
    assert api.queries == [{"limit": "1"}]
    # An apiserver that leaves the count out: the rest page by page.
    api = CountingApi(
        {"items": [{}], "metadata": {"continue": "a"}},
        {"items": [{}] * 500, "metadata": {"continue": "b"}},
        {"items": [{}] * 7, "metadata": {}},
    )
    assert await objects.count(api, kind) == 508  # type: ignore[arg-type]
    assert api.queries[1:] == [{"limit": "500", "continue": "a"}, {"limit": "500", "continue": "b"}]


def test_quorum_release_names_who_ran_it_where_the_uid_has_no_user_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In the image (uid 65532, no passwd entry) getpass.getuser() raises KeyError: the
    apiserver says who it is (a SelfSubjectReview, made before impersonating)."""

    def no_user() -> str:
        raise KeyError("getpwuid(): uid not found: 65532")

    monkeypatch.setattr(getpass, "getuser", no_user)
    monkeypatch.delenv("QUORUM_NAMESPACE", raising=False)
    with RecordingApiserver(tmp_path) as fake:
        pod = {
            "metadata": {
                "name": "p",
                "namespace": "ml",
                "labels": {"quorum.dev/gang": "lbl-x"},
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"schedulingGates": [{"name": "quorum.dev/gang"}], "containers": []},
        }
        fake.put("", "pods", pod)
        code = main(["release", "--all", "--reason", "test", "--kubeconfig", str(fake.kubeconfig)])
    assert code == 0, capsys.readouterr()
    assert "ml/lbl-x: 1 of 1 gated pods released by hand by recorded-user" in capsys.readouterr().out
    review = [r for r in fake.requests if r.path.endswith("/selfsubjectreviews")]
    assert len(review) == 1 and review[0].impersonate is None


# -- the Lease renewed in the background, during a step that runs long --------------------------


async def test_a_step_that_runs_long_has_the_lease_renewed_from_the_background() -> None:
    import asyncio

    cluster, clock = installed({"ml/a": 1}), Clock()
    renewals: list[str] = []
    original = cluster.release_gated

    async def tick(seconds: float) -> None:  # the background's sleep: the hold's quarter passes
        await asyncio.sleep(0.01)
        clock.at += seconds

    async def slow(reason: str, by: str, created_before: float | None) -> tuple[str, list[str]]:
        while len(renewals) < 4:  # a release of many pods, one call each: 4 quarters of the hold
            spec = cluster.objects[LEASE]["spec"]
            if not renewals or renewals[-1] != spec["renewTime"]:
                renewals.append(spec["renewTime"])
            assert clock.at < timestamp(spec["renewTime"]) + spec["leaseDurationSeconds"]
            await asyncio.sleep(0.005)
        return await original(reason, by, created_before)

    cluster.release_gated = slow  # type: ignore[method-assign]
    await asyncio.wait_for(run(cluster, admission_only=True, now=clock, background_sleep=tick), 10)
    assert cluster.gated == {} and len(renewals) >= 4

    # Taken by another meanwhile: the running step is cancelled and the run stops, saying so.
    cluster, clock = installed({"ml/a": 1}), Clock()

    async def hung(reason: str, by: str, created_before: float | None) -> tuple[str, list[str]]:
        cluster.objects[LEASE]["spec"]["holderIdentity"] = "replica-2"
        await asyncio.sleep(3600)
        raise AssertionError("not cancelled")

    cluster.release_gated = hung  # type: ignore[method-assign]
    with pytest.raises(UninstallError) as failed:
        await asyncio.wait_for(run(cluster, admission_only=True, now=clock, background_sleep=tick), 10)
    assert f"Lease {NS}/quorum-operator is held by replica-2 now" in str(failed.value)


async def test_an_absent_lease_is_waited_out_when_the_operator_has_ready_replicas() -> None:
    """Someone deleted the Lease while a leader acted: that leader may act until its renewals fail."""
    cluster, clock = installed(), Clock()
    del cluster.objects[LEASE]
    cluster.objects[Ref(removal.DEPLOYMENT, "quorum-operator", NS)]["status"] = {"readyReplicas": 2}
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    report = await run(cluster, admission_only=True, sleep=sleep, now=clock)
    waited = LeaseSettings.for_duration(NS, 15).acts_at_most() + removal.LEASE_MARGIN
    assert slept[0] == waited == 15
    assert report.lines[0].startswith(f"0. Lease {NS}/quorum-operator: made it, held by quorum-uninstall")
    assert "waiting 15 s" in report.lines[0]


def test_the_uninstalls_hold_never_exceeds_what_replicas_honour() -> None:
    assert removal.lease_hold_seconds(60) == 120
    assert removal.lease_hold_seconds(1000) == removal.MAX_UNINSTALL_HOLD == 600
