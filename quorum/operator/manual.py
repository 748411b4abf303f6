"""`quorum release`: the escape hatch. Releases a gang's gated pods now, without a plan, as
quorum's operator identity (impersonated), and records who did it and why on the Gang
(`status.manualRelease`) and in a warning Event. Each release is the same conditional patch the
operator makes (pod uid and gate tested), so racing the operator cannot release a pod twice;
pods are not pinned to a node, kube-scheduler places them as it would any pod.

`quorum release --all` releases every gated gang pod in the cluster: the step of the uninstall
order that guarantees no pod is left gated once quorum is gone (README, "Uninstall").
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections import defaultdict
from dataclasses import replace
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.record import GangRecord, ManualRelease
from quorum.core.times import timestamp
from quorum.install import DEFAULT_NAMESPACE, operator_username
from quorum.k8s import objects, reads, writes
from quorum.k8s.api import LiveApi
from quorum.k8s.client import KubeconfigError, command_client
from quorum.operator.events import pod_object
from quorum.operator.gangs import Store, is_gated, store_gangs
from quorum.operator.status import GangRecords


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "release",
        help="release a gang's gated pods now (escape hatch), or every gated gang pod with --all",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("gang", nargs="?", help="<namespace>/<gang>, as `kubectl get gangs -A` shows it")
    parser.add_argument("--all", action="store_true", help="every gated gang pod in every namespace")
    parser.add_argument("--reason", required=True, help="why: recorded on the Gang and in an Event")
    parser.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, else ~/.kube/config")
    parser.add_argument(
        "--namespace",
        default=os.environ.get("QUORUM_NAMESPACE", DEFAULT_NAMESPACE),
        help=f"where quorum is installed (default $QUORUM_NAMESPACE, else {DEFAULT_NAMESPACE})",
    )
    parser.add_argument(
        "--as",
        dest="as_user",
        default=None,
        help=(
            f"identity to act as (impersonated; default quorum's operator, "
            f"{operator_username('<namespace>')}); '' to act as yourself"
        ),
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if bool(args.gang) == bool(args.all):
        print("quorum release: name one gang as <namespace>/<gang>, or pass --all")
        return 2
    target: tuple[str, str] | None = None
    if args.gang:
        namespace, _, name = args.gang.partition("/")
        if not namespace or not name:
            print(f"quorum release: {args.gang!r} is not <namespace>/<gang> (e.g. ml/pg-train)")
            return 2
        target = (namespace, name)
    if args.as_user is None:
        args.as_user = operator_username(args.namespace)
    try:
        lines = asyncio.run(_main(args.kubeconfig, args.as_user, target, args.reason))
    except KubeconfigError as err:
        print(f"quorum release: {err}")
        return 2
    except ApiException as err:
        print(f"quorum release: the apiserver refused: {err.status} {err.reason}: {err.body!s}")
        if err.status == 403:
            print(
                f"acting as {args.as_user or 'yourself'}: impersonating needs the `impersonate` verb on "
                "serviceaccounts; or pass --as '' as a member of the break-glass group quorum:break-glass"
            )
        return 1
    for line in lines:
        print(line)
    return 0


async def _main(
    kubeconfig: str | None, as_user: str, target: tuple[str, str] | None, reason: str
) -> list[str]:
    async with (await command_client(kubeconfig)).api as api:
        # Who runs it, as `quorum uninstall` records it: the apiserver's answer, asked before
        # impersonating (getpass.getuser() raises KeyError in the image: its uid has no name).
        by = await objects.caller_name(api) or "someone"
        if as_user:
            api.set_default_header("Impersonate-User", as_user)
        return await release_gangs(api, target, reason, by=by)


async def release_gangs(
    api: client.ApiClient,
    target: tuple[str, str] | None,
    reason: str,
    by: str,
    created_before: float | None = None,
) -> list[str]:
    """Release the gated pods of one gang (or of all gangs); one summary line per gang.
    `created_before` (epoch seconds): only pods created no later than that (`quorum uninstall`:
    those quorum's webhook gated, not those their creator gated after it was gone)."""
    # Through the operator's own writer of Gang records and its Event recorder, as its identity.
    live = LiveApi(api)
    store = Store()  # the Gangs only: which of them keep a legacy name (Store.aliases)
    gangs = store_gangs(store)
    if target is None:
        gangs.replace_all(await live.list_gangs())
        pods = await reads.gang_pods(api, None, None)
    else:
        if (gang := await live.read_gang(*target)) is not None:
            gangs.upsert(gang)
        else:
            # Named as its pods are labelled today: the gang may keep the name an earlier
            # release gave it (Store.aliases), and its record is there.
            gangs.replace_all(await live.list_gangs())
            target = (target[0], store.aliases.get(target, target[1]))
            gangs.replace_all([g for g in [store.gangs.get(target)] if g is not None])
        # Its group's pods made since the upgrade carry the name the group has now.
        pods = await reads.gang_pods(api, target[0], *store.labels_of(target))
    by_gang: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for pod in pods:
        if created_before is not None and created(pod) > created_before:
            continue
        if is_gated(pod) and (name := store.gang_of(pod)):
            by_gang[(pod["metadata"]["namespace"], name)].append(pod)
    if target is not None and target not in by_gang:
        return [f"{target[0]}/{target[1]}: no gated pods (nothing to release)"]
    records = GangRecords(live, store)
    lines = []
    for (namespace, name), members in sorted(by_gang.items()):
        # Recorded first, naming the decision of quorum's it overrides (recovery compares
        # attempts, never this machine's clock with the operator's): a later decision of
        # quorum's is quorum's again.
        gang = await live.read_gang(namespace, name)
        record = ManualRelease(writes.now(), by, reason, len(members), GangRecord.of(gang).attempt)
        if gang is not None and not await records.patch(
            (namespace, name), {"manualRelease": record.to_json()}
        ):
            gang = None
        released = [p for p in members if await live.release_pod(p, None)]
        message = (
            f"{len(released)} of {len(members)} gated pods released by hand by {by}, without a plan: {reason}"
        )
        if gang is not None:
            if len(released) != len(members):
                record = replace(record, pods=len(released))
                await records.patch((namespace, name), {"manualRelease": record.to_json()})
            await records.events.post(gang, "ReleasedByHand", message, warning=True)
        else:
            for pod in released:
                await records.events.post(pod_object(pod), "ReleasedByHand", message, warning=True)
        lines.append(f"{namespace}/{name}: {message}")
    return lines or ["no gated gang pods anywhere (nothing to release)"]


def created(pod: dict[str, Any]) -> float:
    """The pod's creationTimestamp (the apiserver's clock), in epoch seconds."""
    return timestamp(pod["metadata"].get("creationTimestamp"))
