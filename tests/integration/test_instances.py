"""Named instances: other flags, idempotent start, clean failure, `down` stops every PID."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import ClusterError, Instance
from devcluster.process import is_alive
from devcluster.versions import DEFAULT_RELEASE, RELEASES
from tests.kube import WorkloadApi, api_client, create_namespace, create_podgroup, eventually

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
WITHOUT_GANG_SCHEDULING = [
    {
        "schedulerName": "default-scheduler",
        "plugins": {"multiPoint": {"disabled": [{"name": "GangScheduling"}]}},
    }
]


async def quorum_dev(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m devcluster ...` as a person would (a separate process)."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "devcluster", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )


def live_processes_under(directory: Path) -> list[str]:
    """Command lines of live processes that mention an instance's directory."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(directory) in cmdline and state not in ("Z", "X"):
            found.append(f"{proc.name}: {cmdline[:120]}")
    return found


def pod_in_group(name: str, group: str) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulingGroup": {"podGroupName": group},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


async def test_instance_with_other_flags_then_down_leaves_no_pid(
    start_instance: Callable[..., Instance],
) -> None:
    """A second instance beside the shared one, with the WAS API off and a scheduler profile
    without GangScheduling; `up` again is a no-op; `python -m devcluster down` (f) stops every PID."""
    instance = start_instance(
        "t-flags",
        feature_gates=dict.fromkeys(RELEASES[DEFAULT_RELEASE].feature_gates, False),
        runtime_config="api/alpha=false",
        scheduler_profiles=WITHOUT_GANG_SCHEDULING,
    )
    state = instance.state()
    assert state is not None and len(state.processes) == 7  # with quorum-webhooks and quorum-operator

    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        groups = await client.ApisApi(api).get_api_versions()
        served = {v.group_version for g in groups.groups for v in g.versions}
        assert not {v for v in served if v.startswith("scheduling.k8s.io/v1") and v != "scheduling.k8s.io/v1"}
        core = client.CoreV1Api(api)
        await create_namespace(api, "flags")
        pod = await core.create_namespaced_pod("flags", pod_in_group("p", "missing"))
        # GenericWorkload is off: the apiserver drops the field at create, after quorum's webhook
        # gated the pod. Its group can never exist, so quorum releases it, with a warning.
        assert pod.spec.scheduling_group is None
        assert pod.metadata.labels["quorum.dev/gang"] == "wpg-missing"

        async def released() -> bool:
            found = await core.read_namespaced_pod("p", "flags")
            return bool(found.spec.node_name) and not found.spec.scheduling_gates

        await eventually(released, timeout=30, what="the dropped-group pod released and bound")
        events = (await core.list_namespaced_event("flags")).items
        assert any(e.reason == "GroupDropped" and e.type == "Warning" for e in events)

        # The seeds' PodGroups are served as usual without the Workload API.
        await create_podgroup(api, "flags", "seed", 2)
        for name in ("s0", "s1"):
            body = {
                "metadata": {"name": name, "labels": {"pod-group.scheduling.sigs.k8s.io": "seed"}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            }
            await core.create_namespaced_pod("flags", body)

        async def seed_admitted() -> bool:
            pods = [p for p in (await core.list_namespaced_pod("flags")).items if p.metadata.name != "p"]
            return len(pods) == 2 and all(p.spec.node_name for p in pods)

        await eventually(seed_admitted, timeout=30, what="the seed PodGroup's gang admitted")
    said = "serves no PodGroup version quorum reads"

    async def told() -> str | None:
        log = instance.layout.log("quorum-operator").read_text()
        return log if said in log else None

    # Held only once discovery said so twice (30 s apart); said once, though asked again.
    log = await eventually(told, timeout=75, what="the operator saying the API is not served")
    assert log.count(said) == 1

    # Already up: a no-op that keeps the same processes.
    again = await quorum_dev("up", "--name", "t-flags")
    assert "already up" in again.stderr
    after = instance.state()
    assert after is not None and after.processes == state.processes

    down = await quorum_dev("down", "--name", "t-flags")
    assert "stopped 7 processes" in down.stderr
    assert not [p.name for p in state.processes if is_alive(p)]
    assert live_processes_under(instance.layout.root) == []


async def test_scheduler_profile_without_gang_scheduling_binds_group_pods(
    start_instance: Callable[..., Instance],
) -> None:
    """kube-scheduler's own gang plugin, on instances without quorum: with the default profile
    (GangScheduling on) one pod of a `gang minCount: 2` PodGroup is held; with a profile that
    disables the plugin it binds alone. (Without the plugin a pod whose PodGroup does not exist
    is not bound either: the 1.36 pod-group cycle fails with SchedulerError "podgroup not found".)"""
    for name, profiles, binds in (("t-gang", None, False), ("t-nogang", WITHOUT_GANG_SCHEDULING, True)):
        instance = start_instance(
            name, scheduler_profiles=profiles, install_manifests=False, webhooks=False, operator=False
        )
        api = await api_client(instance.kubeconfig("admin"))
        async with api:
            core = client.CoreV1Api(api)
            await create_namespace(api, "work")
            await _one_pod_of_a_pair(api, "work")

            async def bound(core: client.CoreV1Api = core) -> str | None:
                pod = await core.read_namespaced_pod("one", "work")
                return str(pod.spec.node_name) if pod.spec.node_name else None

            if binds:
                await eventually(bound, timeout=30, what="group pod bound without GangScheduling")
            else:
                await asyncio.sleep(3)
                assert await bound() is None, "held by the GangScheduling plugin"
        instance.down(quiet=True)


async def _one_pod_of_a_pair(api: client.ApiClient, namespace: str) -> None:
    was = await WorkloadApi.of(api)
    await was.create(api, namespace, "podgroups", was.podgroup("pair", {"gang": {"minCount": 2}}))
    await client.CoreV1Api(api).create_namespaced_pod(namespace, pod_in_group("one", "pair"))


def test_component_that_fails_to_start_stops_the_rest() -> None:
    instance = Instance("t-broken")
    from devcluster.config import ClusterSpec

    spec = ClusterSpec(name="t-broken", extra_args={"kube-apiserver": ("--no-such-flag=1",)})
    try:
        with pytest.raises(ClusterError) as failed:
            instance.up(spec)
        message = str(failed.value)
        assert "kube-apiserver exited during start-up" in message
        assert "no-such-flag" in message  # the log's last lines say why
        assert live_processes_under(instance.layout.root) == []
        state = instance.state()
        assert state is not None and state.processes == []
    finally:
        instance.down(quiet=True)
