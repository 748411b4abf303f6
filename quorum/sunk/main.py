"""Entry point of the `quorum-sunk-scheduler` process: the reconciler and the hook API."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from aiohttp import web
from pydantic import ValidationError

from quorum.k8s.client import api_client
from quorum.sunk.api import LiveSunkApi
from quorum.sunk.hooks import make_app
from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.settings import SunkSettings
from quorum.sunk.slurm import SlurmRest


async def serve(settings: SunkSettings, token: str, host: str, port: int) -> None:
    api = await api_client()
    slurm = SlurmRest.from_key_file(settings.slurm_url, settings.slurm_jwt_key_file, settings.slurm_user)
    scheduler = SunkScheduler(settings, LiveSunkApi(api), slurm)
    runner = web.AppRunner(make_app(scheduler, token), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    try:
        await scheduler.run(api)
    finally:
        await runner.cleanup()
        await slurm.close()
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="quorum-sunk-scheduler",
        description="Kubernetes pods scheduled by Slurm (docs/sunk.md). Settings: QUORUM_SUNK_* variables.",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    parser.add_argument("--address", default="0.0.0.0:8091", help="host:port of the hook API and /metrics")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = SunkSettings()
    except ValidationError as err:
        print(f"quorum-sunk-scheduler: invalid QUORUM_SUNK_* setting:\n{err}", file=sys.stderr)
        return 2
    try:
        token = settings.hook_token_file.read_text().strip()
    except OSError as err:
        print(f"quorum-sunk-scheduler: cannot read QUORUM_SUNK_HOOK_TOKEN_FILE: {err}", file=sys.stderr)
        return 2
    if len(token) < 16:
        print(
            f"quorum-sunk-scheduler: {settings.hook_token_file} holds {len(token)} characters; the hook "
            "API's token needs at least 16 (e.g. `openssl rand -hex 32`)",
            file=sys.stderr,
        )
        return 2
    host, _, port = args.address.rpartition(":")
    try:
        # In a cluster the hook API must be reachable from the Slurm nodes (through its Service).
        asyncio.run(serve(settings, token, host or "0.0.0.0", int(port)))  # noqa: S104
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
