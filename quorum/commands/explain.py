"""`quorum explain <gang> [-n NS]` (or `NS/gang`): why a gang waits, on one screen.

Members present and needed; why it waits, in the planner's words; per resource, what the plan is
short of; per node (or per topology domain) the first reason it cannot take one of its pods, alike
nodes together; whether it may preempt and whom, or why not; capacity held for it, or held by
other gangs on nodes it wants; its backoff; the last Events of the Gang and its group object.

The planned view uses the installed operator's settings (its Deployment's QUORUM_OPERATOR_*
variables with a plain `value`, e.g. the org whose nodes it uses; valueFrom and envFrom are not
followed), or this shell's where that Deployment cannot be read. Its reads are paged and bounded
in time; when they fail or run out of time, the recorded view is shown, with why.

Two views. Who may list nodes, pods and Gangs in every namespace gets the answer planned now:
quorum-operator's own pass replayed on what they read (`quorum.operator.replay`), so it works while
the operator is down. Anyone else (a namespace's tenant) gets what quorum-operator last recorded on
the Gang's status, and is told which view it is: explain reads only what the caller's own
credentials may read.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.commands import session
from quorum.commands.session import CommandError
from quorum.core.diagnosis import Diagnosis, event_lines, plural, recorded, render
from quorum.core.gangs import PLACED_BY_LABEL, PLACED_BY_SLURM, GangSource
from quorum.install import DEFAULT_NAMESPACE
from quorum.k8s import command_reads
from quorum.k8s.command_reads import Forbidden
from quorum.operator.replay import replay
from quorum.operator.settings import LoopSettings, OperatorSettings, loop_settings

JSON = dict[str, Any]
# What planning needs to read, in every namespace, and how to say it is missing.
PLANNING_READS = (
    ("list", "nodes", "", "you cannot read nodes"),
    ("list", "pods", "", "you cannot list pods in every namespace"),
    ("list", "gangs", "quorum.dev", "you cannot list Gangs in every namespace"),
)
PLANNING_SECONDS = 60.0  # the planning reads together, at most; then the recorded view
GANG_PREFIXES = tuple(f"{source}-" for source in GangSource)  # a Gang is named <prefix>-<group>
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="why a gang waits, on one screen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("gang", help="the Gang's name (`quorum get` lists them), or <namespace>/<name>")
    parser.add_argument("-n", "--namespace", default=None, help="default: the kubeconfig context's namespace")
    parser.add_argument(
        "--quorum-namespace",
        default=os.environ.get("QUORUM_NAMESPACE", DEFAULT_NAMESPACE),
        help="where quorum is installed: its operator's settings are read there "
        f"(default $QUORUM_NAMESPACE, else {DEFAULT_NAMESPACE})",
    )
    session.add_connection_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return session.run("quorum explain", lambda: explain(args))


def target(gang: str, namespace: str | None, default: str) -> tuple[str, str]:
    """(namespace, name) from `NS/gang` or `gang` and -n."""
    ns, slash, name = gang.rpartition("/")
    if slash and namespace and ns != namespace:
        raise CommandError(f"{gang!r} names namespace {ns!r} but -n says {namespace!r}: give one of them")
    ns = ns if slash else (namespace or default)
    for what, value in (("namespace", ns), ("gang name", name)):
        if not _NAME.fullmatch(value):
            raise CommandError(
                f"{value!r} is not a valid {what}: write the Gang as <name> or <namespace>/<name>, as "
                "`quorum get -A` lists it"
            )
    return ns, name


async def explain(args: argparse.Namespace) -> list[str]:
    connected = await session.connect(args)
    async with connected.api as api:
        namespace, name = target(args.gang, args.namespace, connected.namespace)
        return render(await diagnose(api, namespace, name, time.time(), args.quorum_namespace))


async def diagnose(
    api: client.ApiClient, namespace: str, name: str, now: float, install_namespace: str = DEFAULT_NAMESPACE
) -> Diagnosis:
    """Everything explain says of the gang, in the view the caller's rights allow."""
    gang = await command_reads.gang(api, namespace, name)
    if gang is None:
        raise CommandError(await not_found(api, namespace, name))
    if ((gang.get("metadata") or {}).get("labels") or {}).get(PLACED_BY_LABEL) == PLACED_BY_SLURM:
        why = "Slurm places this gang: quorum-operator does not plan it"
        return await with_events(api, recorded(gang, now, why, "quorum-sunk-scheduler"), gang, now)
    diagnosis = await planned(api, (namespace, name), now, install_namespace)
    if isinstance(diagnosis, NotPlanned):
        shown = recorded(gang, now, diagnosis.why)
        diagnosis = replace(shown, notes=(*shown.notes, diagnosis.note)) if diagnosis.note else shown
    return await with_events(api, diagnosis, gang, now)


async def operator_settings(api: client.ApiClient, install_namespace: str) -> tuple[LoopSettings, str]:
    """The installed operator's settings (its Deployment's QUORUM_OPERATOR_* values over this
    shell's), and a note when its Deployment could not be read."""
    note = ""
    try:
        found = await command_reads.deployment(api, install_namespace, "quorum-operator")
    except Forbidden:
        found = None
    if found is None:
        note = (
            f"no quorum-operator Deployment read in {install_namespace}: planned with this shell's "
            "QUORUM_OPERATOR_* settings (--quorum-namespace names quorum's namespace)"
        )
    try:
        config = OperatorSettings.from_deployment(found) if found else OperatorSettings.from_env()
    except ValueError as err:  # pydantic's ValidationError names the setting
        where = f"Deployment {install_namespace}/quorum-operator" if found else "this environment"
        raise CommandError(f"a QUORUM_OPERATOR_* variable of {where} is wrong: {err}") from None
    return loop_settings(config), note


@dataclass(frozen=True)
class NotPlanned:
    """Why the caller gets the recorded view (the view line says it), and a note when it is
    not the caller's rights but the planning reads that failed."""

    why: str
    note: str = ""


async def planned(
    api: client.ApiClient, key: tuple[str, str], now: float, install_namespace: str = DEFAULT_NAMESPACE
) -> Diagnosis | NotPlanned:
    """The planned view, or why the caller gets the recorded one: it may not read what planning
    needs, or reading it failed or took longer than `PLANNING_SECONDS` (a large cluster, a busy
    apiserver): the recorded view needs only the Gang, read already."""
    found = command_reads.ClusterObjects()
    try:
        async with asyncio.timeout(PLANNING_SECONDS):
            for verb, resource, group, missing in PLANNING_READS:
                if not await command_reads.may(api, verb, resource, group):
                    return NotPlanned(missing)
            objects = await command_reads.cluster_objects(api, found)
            settings, settings_note = await operator_settings(api, install_namespace)
    except Forbidden as err:
        return NotPlanned(str(err))
    except TimeoutError:
        return not_read(f"reading every node and pod took over {PLANNING_SECONDS:.0f}s", found)
    except (aiohttp.ClientError, OSError, ApiException) as err:
        return not_read(f"reading every node and pod failed ({failure(err)})", found)
    diagnosis = replay(objects, key, settings, now)
    if diagnosis is None:
        return NotPlanned("the gang has no pods now: nothing to plan")
    if settings_note:
        diagnosis = replace(diagnosis, notes=(*diagnosis.notes, settings_note))
    if not objects.pdbs_read:
        note = "you cannot list PodDisruptionBudgets: preemption was chosen without them"
        diagnosis = replace(diagnosis, notes=(*diagnosis.notes, note))
    return diagnosis


def not_read(why: str, found: command_reads.ClusterObjects) -> NotPlanned:
    read = f"{plural(len(found.nodes), 'node')} and {plural(len(found.pods), 'pod')} read"
    note = (
        f"not planned now: {why} ({read}); shown is what quorum-operator last recorded on the Gang "
        "(try again, or ask the platform for the apiserver's load)"
    )
    return NotPlanned(why, note)


def failure(err: BaseException) -> str:
    """An error of a read, in a few words."""
    if isinstance(err, ApiException):
        return f"the apiserver answered {err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"[:200]


async def with_events(api: client.ApiClient, diagnosis: Diagnosis, gang: JSON, now: float) -> Diagnosis:
    """The diagnosis with the Events of the Gang and of its group object."""
    meta, source = gang.get("metadata") or {}, (gang.get("spec") or {}).get("source") or {}
    uids = [u for u in (meta.get("uid"), source.get("uid")) if isinstance(u, str) and u]
    events: list[JSON] = []
    try:
        for uid in uids:
            events += await command_reads.events_about(api, diagnosis.namespace, uid)
    except Forbidden as err:
        return replace(diagnosis, notes=(*diagnosis.notes, f"no events shown: {err}"))
    return replace(diagnosis, events=event_lines(events, now))


async def not_found(api: client.ApiClient, namespace: str, name: str) -> str:
    """What to say when there is no such Gang: the Gangs whose group has that name, if any."""
    try:
        names = [
            str((g.get("metadata") or {}).get("name")) for g in await command_reads.gangs(api, namespace)
        ]
    except Forbidden:
        names = []
    alike = [n for n in names if n in {p + name for p in GANG_PREFIXES}]
    hint = f"; did you mean {' or '.join(alike)} (a Gang is named after its group)?" if alike else ""
    return f"no Gang {name} in namespace {namespace}{hint} (`quorum get -n {namespace}` lists them)"
