"""`quorum get [-n NS | -A]`: the Gangs, kubectl-style, with how long each has waited and why.

Columns: NAMESPACE (with -A), NAME, PHASE, SIZE (members/minMember), RELEASED/BOUND, WAIT (how
long it has not been admitted; `-` once it is), REASON (its Admitted condition's reason). Needs
`list gangs.quorum.dev` in the namespace (every namespace with -A), which the built-in `view`
role aggregates.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from quorum.commands import session
from quorum.core.diagnosis import gang_row, table
from quorum.k8s import command_reads


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "get",
        help="list Gangs: phase, size, how long each has waited, why",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace", default=None, help="default: the kubeconfig context's namespace")
    where.add_argument("-A", "--all-namespaces", action="store_true", help="the Gangs of every namespace")
    session.add_connection_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return session.run("quorum get", lambda: listing(args))


async def listing(args: argparse.Namespace) -> list[str]:
    target = await session.connect(args)
    async with target.api as api:
        namespace = None if args.all_namespaces else (args.namespace or target.namespace)
        gangs = await command_reads.gangs(api, namespace)
    now = time.time()
    rows = sorted((gang_row(g, now) for g in gangs), key=lambda r: (r.namespace, r.name))
    if not rows:
        return ["No gangs found." if namespace is None else f"No gangs found in namespace {namespace}."]
    return table(rows, all_namespaces=namespace is None)
