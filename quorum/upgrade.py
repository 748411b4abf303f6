"""`quorum upgrade-workloads save|restore`: carry Kubernetes 1.36's Workloads and PodGroups
(scheduling.k8s.io/v1alpha2) across the control-plane upgrade to 1.37, which no longer serves
v1alpha2 and cannot read such objects (its changelog: remove them before upgrading). The
steps (docs/workloads.md, "Upgrading from 1.36"):

1. On 1.36, `quorum upgrade-workloads save --to FILE`: waits until no gang of a Kubernetes
   PodGroup is halfway released (released pods not yet bound), writes every v1alpha2 Workload
   and PodGroup to FILE as v1beta1, then deletes them with propagationPolicy Orphan (quorum's
   Gang records lose their owner but stay, with what they record) and takes off the
   `scheduling.k8s.io/podgroup-protection` finalizer, which would keep a PodGroup whose pods run
   from going. Running pods keep running; gated ones wait for their PodGroup.
2. Upgrade the control plane to 1.37 with `--runtime-config=scheduling.k8s.io/v1beta1=true` and
   the `GenericWorkload` gate.
3. On 1.37, `quorum upgrade-workloads restore --from FILE`: makes them again (Workloads first).
   quorum reads them at v1beta1 without a restart; each orphaned Gang is adopted by its PodGroup
   made again, its records kept; the waiting gangs are planned.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.workloads import WAS_GROUP, to_v1beta1
from quorum.k8s import reads
from quorum.k8s.client import KubeconfigError, command_client
from quorum.operator.gangs import is_gated

OLD, NEW = "v1alpha2", "v1beta1"
PROTECTION_FINALIZER = "scheduling.k8s.io/podgroup-protection"
PLURALS = (("workloads", "Workload"), ("podgroups", "PodGroup"))


class UpgradeError(RuntimeError):
    """A step cannot be done now; the message says why and what to do."""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "upgrade-workloads",
        help="carry Kubernetes 1.36 Workloads and PodGroups (v1alpha2) across an upgrade to 1.37",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    steps = parser.add_subparsers(dest="step", required=True)
    save = steps.add_parser("save", help="on 1.36: write them to a file as v1beta1, then remove them")
    save.add_argument("--to", type=Path, required=True, help="the file to write (YAML)")
    save.add_argument("--wait", type=float, default=300, help="seconds to wait for gangs halfway released")
    restore = steps.add_parser("restore", help="on 1.37: make them again from the file")
    restore.add_argument("--from", dest="source", type=Path, required=True, help="the file `save` wrote")
    for step in (save, restore):
        step.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, else ~/.kube/config")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        lines = asyncio.run(_main(args))
    except (UpgradeError, KubeconfigError, ApiException, OSError, ValueError) as err:
        print(f"quorum upgrade-workloads {args.step}: {err}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


async def _main(args: argparse.Namespace) -> list[str]:
    async with (await command_client(args.kubeconfig)).api as api:
        if args.step == "save":
            return await save(api, args.to, args.wait)
        return await restore(api, args.source)


async def save(api: client.ApiClient, to: Path, wait_seconds: float = 300) -> list[str]:
    if OLD not in await reads.served_versions(api, WAS_GROUP):
        raise UpgradeError(
            f"this cluster does not serve {WAS_GROUP}/{OLD}: nothing to save (is it 1.37 already?)"
        )
    await wait_for_no_half_release(api, wait_seconds)
    custom = client.CustomObjectsApi(api)
    objects: list[dict[str, Any]] = []
    for plural, _ in PLURALS:
        listing = await custom.list_cluster_custom_object(WAS_GROUP, OLD, plural)
        objects += [{**o, "kind": dict(PLURALS)[plural]} for o in listing["items"]]
    converted = [to_v1beta1(o) for o in objects]
    await asyncio.to_thread(write_whole, to, yaml.safe_dump_all(converted, sort_keys=False))
    for plural, _ in reversed(PLURALS):  # PodGroups first: a Workload's go with it otherwise
        for obj in [o for o in objects if o["kind"] == dict(PLURALS)[plural]]:
            await remove(custom, plural, obj)
    await wait_gone(custom, objects)
    return [f"saved {len(converted)} objects to {to} as {WAS_GROUP}/{NEW} and removed them from {OLD}"]


def write_whole(to: Path, text: str) -> None:
    """Written whole (a rename), before anything is deleted."""
    to.parent.mkdir(parents=True, exist_ok=True)
    partial = to.with_suffix(to.suffix + ".partial")
    partial.write_text(text)
    partial.replace(to)


async def wait_for_no_half_release(api: client.ApiClient, wait_seconds: float) -> None:
    """A Kubernetes PodGroup's gang whose released pods are not all bound yet would have to bind
    without its PodGroup: wait until none is (bounded), or say which."""
    deadline = time.monotonic() + wait_seconds
    while True:
        pods = await reads.gang_pods(api, None, None)
        halfway = sorted(
            f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for p in pods
            if (p.get("spec") or {}).get("schedulingGroup")
            and not is_gated(p)
            and not (p.get("spec") or {}).get("nodeName")
            and (p.get("status") or {}).get("phase") in (None, "Pending")
            and not p["metadata"].get("deletionTimestamp")
        )
        if not halfway:
            return
        if time.monotonic() > deadline:
            raise UpgradeError(
                f"{len(halfway)} released pods of Kubernetes PodGroups are not bound yet "
                f"({', '.join(halfway[:5])}{', ...' if len(halfway) > 5 else ''}); run `save` again once "
                f"they are (or --wait longer)"
            )
        await asyncio.sleep(2)


async def remove(custom: client.CustomObjectsApi, plural: str, obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    try:
        await custom.delete_namespaced_custom_object(
            WAS_GROUP, OLD, meta["namespace"], plural, meta["name"], propagation_policy="Orphan"
        )
        if PROTECTION_FINALIZER in (meta.get("finalizers") or []):
            patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": [PROTECTION_FINALIZER]}}
            await custom.patch_namespaced_custom_object(
                WAS_GROUP,
                OLD,
                meta["namespace"],
                plural,
                meta["name"],
                patch,
                _content_type="application/strategic-merge-patch+json",  # type: ignore[call-arg]
            )
    except ApiException as err:
        if err.status != 404:
            raise


async def wait_gone(
    custom: client.CustomObjectsApi, objects: list[dict[str, Any]], timeout: float = 120
) -> None:
    """Until every removed object is gone (the garbage collector has orphaned its dependents)."""
    deadline = time.monotonic() + timeout
    left = list(objects)
    while left:
        still = []
        for obj in left:
            meta, plural = obj["metadata"], {k: p for p, k in PLURALS}[obj["kind"]]
            try:
                await custom.get_namespaced_custom_object(
                    WAS_GROUP, OLD, meta["namespace"], plural, meta["name"]
                )
                still.append(obj)
            except ApiException as err:
                if err.status != 404:
                    raise
        left = still
        if left and time.monotonic() > deadline:
            names = ", ".join(
                f"{o['kind']} {o['metadata']['namespace']}/{o['metadata']['name']}" for o in left[:5]
            )
            raise UpgradeError(f"still there after {timeout:.0f}s: {names} (see their finalizers)")
        if left:
            await asyncio.sleep(1)


async def restore(api: client.ApiClient, source: Path) -> list[str]:
    if NEW not in await reads.served_versions(api, WAS_GROUP):
        raise UpgradeError(
            f"this cluster does not serve {WAS_GROUP}/{NEW}: turn it on (--runtime-config="
            f"{WAS_GROUP}/{NEW}=true and the GenericWorkload gate) first"
        )
    objects = [d for d in yaml.safe_load_all(await asyncio.to_thread(source.read_text)) if d]
    custom = client.CustomObjectsApi(api)
    made = kept = 0
    for plural, kind in PLURALS:  # Workloads first: a PodGroup names its Workload
        for obj in [o for o in objects if o.get("kind") == kind]:
            try:
                await custom.create_namespaced_custom_object(
                    WAS_GROUP, NEW, obj["metadata"]["namespace"], plural, obj
                )
                made += 1
            except ApiException as err:
                if err.status != 409:
                    message = json.loads(err.body or "{}").get("message", err.reason)
                    raise UpgradeError(f"{kind} {obj['metadata']['name']}: {err.status} {message}") from None
                kept += 1
    return [
        f"made {made} objects again at {WAS_GROUP}/{NEW}" + (f" ({kept} were there already)" if kept else "")
    ]
