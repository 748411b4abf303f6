"""`quorum version`: this client's version; where the cluster answers, its Kubernetes version and
the images of quorum-operator and quorum-webhooks (their Deployments in quorum's namespace:
`--namespace`, default $QUORUM_NAMESPACE, else quorum-system), or that they are not installed."""

from __future__ import annotations

import argparse
import os
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from quorum import __version__
from quorum.commands import session
from quorum.install import DEFAULT_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, WEBHOOKS_SERVICE_ACCOUNT
from quorum.k8s import command_reads
from quorum.k8s.client import KubeconfigError

JSON = dict[str, Any]
GANG_CRD = "gangs.quorum.dev"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("version", help="this client's version, the cluster's and quorum's images")
    parser.add_argument(
        "--namespace",
        default=os.environ.get("QUORUM_NAMESPACE", DEFAULT_NAMESPACE),
        help=f"where quorum is installed (default $QUORUM_NAMESPACE, else {DEFAULT_NAMESPACE})",
    )
    parser.add_argument("--client", action="store_true", help="this client's version only")
    session.add_connection_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return session.run("quorum version", lambda: versions(args))


async def versions(args: argparse.Namespace) -> list[str]:
    lines = [f"client: quorum {__version__}"]
    if args.client:
        return lines
    try:
        target = await session.connect(args)
    except KubeconfigError as err:
        return [*lines, f"server: none configured ({err})"]
    async with target.api as api:
        try:
            kubernetes = await command_reads.server_version(api)
        except (aiohttp.ClientError, OSError, TimeoutError, ApiException, command_reads.Forbidden) as err:
            return [*lines, f"server: {target.server} not reachable ({type(err).__name__}: {err})"]
        lines.append(f"server: Kubernetes {kubernetes} at {target.server}")
        missing = 0
        for name in (OPERATOR_SERVICE_ACCOUNT, WEBHOOKS_SERVICE_ACCOUNT):
            try:
                found = await command_reads.deployment(api, args.namespace, name)
            except command_reads.Forbidden as err:
                lines.append(f"{name}: unknown ({err})")
                continue
            if found is None:
                missing += 1
                lines.append(f"{name}: not installed (no Deployment {args.namespace}/{name})")
            else:
                lines.append(f"{name}: {describe(found)}")
        if missing == 2:
            try:
                if await command_reads.crd_installed(api, GANG_CRD):
                    lines.append(f"(the CRD {GANG_CRD} is installed: quorum runs outside the cluster, as on")
                    lines.append(" the local control plane, or in another namespace: pass --namespace)")
            except command_reads.Forbidden:
                pass
    return lines


def describe(deployment: JSON) -> str:
    """ "ghcr.io/quorum-dev/quorum:0.1.0, 2 of 2 replicas ready"."""
    spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    images = sorted({str(c.get("image")) for c in spec.get("containers") or [] if c.get("image")})
    wanted = (deployment.get("spec") or {}).get("replicas")
    ready = (deployment.get("status") or {}).get("readyReplicas") or 0
    replicas = f"{ready} of {wanted if isinstance(wanted, int) else 1} replicas ready"
    return f"{', '.join(images) or 'no image'}, {replicas}"
