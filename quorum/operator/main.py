"""Entry point of the `quorum-operator` process: kopf, standalone, cluster-wide."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from quorum import __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="quorum-operator",
        description="quorum's gang admission operator: holds gang pods at the quorum.dev/gang gate and "
        "releases each gang when all of it fits. Settings: QUORUM_OPERATOR_* variables.",
    )
    parser.add_argument("--version", action="version", version=f"quorum-operator {__version__}")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    parser.add_argument(
        "--health-address",
        default=None,
        help="host:port to serve /healthz (liveness), /readyz (caches listed) and /metrics "
        "(e.g. 0.0.0.0:8080)",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import kopf

    # kopf logs every handled event at INFO; quorum's own log says what matters.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)

    from pydantic import ValidationError

    from quorum.operator import handlers  # registers the handlers
    from quorum.operator.settings import OperatorSettings

    try:
        OperatorSettings.from_env()
    except ValidationError as err:
        print(f"quorum-operator: invalid QUORUM_OPERATOR_* setting:\n{err}", file=sys.stderr)
        return 2
    if args.health_address:
        handlers.HEALTH_ADDRESS.append(args.health_address)
    try:
        kopf.run(standalone=True, clusterwide=True)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
