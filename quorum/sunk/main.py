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
from pydantic_settings import SettingsError

from quorum.k8s.client import api_client
from quorum.sunk.api import LiveSunkApi
from quorum.sunk.hooks import make_app, make_metrics_app
from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.settings import SunkSettings
from quorum.sunk.slurm import SlurmRest


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    # In a cluster the hook API must be reachable from the Slurm nodes (through its Service).
    return host or "0.0.0.0", int(port)  # noqa: S104


async def serve(settings: SunkSettings, token: str, address: str, metrics_address: str | None) -> None:
    api = await api_client()
    slurm = SlurmRest.from_key_file(settings.slurm_url, settings.slurm_jwt_key_file, settings.slurm_user)
    scheduler = SunkScheduler(settings, LiveSunkApi(api), slurm)
    sites = [(make_app(scheduler, token, with_metrics=metrics_address is None), address)]
    if metrics_address is not None:
        sites.append((make_metrics_app(scheduler), metrics_address))
    runners = []
    for app, where in sites:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, *host_port(where)).start()
    try:
        await scheduler.run(api)
    finally:
        for runner in runners:
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
    parser.add_argument(
        "--metrics-address",
        default="",
        help="host:port of /metrics (and the probes) apart from the hook API, so that a NetworkPolicy "
        "can open each port to its own callers (default: /metrics on --address)",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = SunkSettings()
    except (ValidationError, SettingsError) as err:
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
    try:
        asyncio.run(serve(settings, token, args.address, args.metrics_address or None))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
