"""What `quorum get`, `explain` and `version` share: how they find the cluster (as kubectl does,
`quorum.k8s.client.command_client`) and how a failure is told — one line on stderr that says what
went wrong and what to do, and an exit code (1: the cluster refused or could not be reached; 2:
bad input)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.k8s.client import CommandClient, KubeconfigError, command_client
from quorum.k8s.command_reads import Forbidden


class CommandError(Exception):
    """Input the command cannot act on; the message says what is wrong and how to fix it."""


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, else ~/.kube/config")
    parser.add_argument("--context", default=None, help="the kubeconfig context (default: its current one)")


async def connect(args: argparse.Namespace) -> CommandClient:
    return await command_client(args.kubeconfig, args.context)


def run(prog: str, lines: Callable[[], Coroutine[Any, Any, list[str]]]) -> int:
    """Print what `lines` makes; a failure as one line on stderr."""
    try:
        out = asyncio.run(lines())
    except CommandError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    except (KubeconfigError, Forbidden) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except ApiException as err:
        print(
            f"{prog}: the apiserver answered {err.status} {err.reason}: {str(err.body or '')[:300]}",
            file=sys.stderr,
        )
        return 1
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        print(f"{prog}: cannot reach the apiserver: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    for line in out:
        print(line)
    return 0
