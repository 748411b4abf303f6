"""Entry point of the `quorum-webhooks` process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from quorum import __version__
from quorum.webhooks import tls
from quorum.webhooks.server import METRICS_KEY, READY_KEY, RUNNER_OPTIONS, make_app
from quorum.webhooks.settings import SettingsError, WebhookSettings, load_settings

log = logging.getLogger("quorum.webhooks")


class MalformedHTTP(logging.Filter):
    """aiohttp answers a malformed HTTP request (bad framing, a header too long) with 400 and logs
    it at ERROR with a traceback. It is the client's fault: one WARNING line says enough, and a
    hostile client cannot fill the log with tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError) and record.msg == "Error handling request from %s":
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "malformed HTTP request from %s: %s"
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.args = (remote, " ".join(str(error).split())[:200])
            record.exc_info = record.exc_text = None
        return True


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="quorum-webhooks",
        description="quorum's admission webhook server (aiohttp, TLS, no API calls). Settings "
        "come from QUORUM_WEBHOOKS_CONFIG (a YAML file) and QUORUM_WEBHOOKS_* "
        "variables; the flags below override them.",
    )
    parser.add_argument("--version", action="version", version=f"quorum-webhooks {__version__}")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8443)")
    parser.add_argument("--cert-file", type=Path, help="serving certificate (PEM)")
    parser.add_argument("--key-file", type=Path, help="its private key (PEM)")
    parser.add_argument(
        "--dev-certs",
        type=Path,
        metavar="DIR",
        help="make (once) a CA and serving certificate in DIR and use them",
    )
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


async def start_server(
    settings: WebhookSettings, cert_file: Path, key_file: Path
) -> tuple[web.AppRunner, asyncio.Task[None]]:
    """Listen with TLS; return the runner and the certificate reload task."""
    context = tls.server_context(cert_file, key_file)
    app = make_app(settings)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, **RUNNER_OPTIONS)
    await runner.setup()
    site = web.TCPSite(
        runner, settings.host, settings.port, ssl_context=context, backlog=1024, reuse_address=True
    )
    await site.start()
    app[READY_KEY].append(True)
    reloader = asyncio.create_task(
        tls.reload_on_change(context, cert_file, key_file, settings.cert_reload_seconds, app[METRICS_KEY])
    )
    return runner, reloader


async def stop_server(runner: web.AppRunner, reloader: asyncio.Task[None]) -> None:
    runner.app[READY_KEY].clear()
    reloader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reloader
    await runner.cleanup()


async def serve(settings: WebhookSettings, cert_file: Path, key_file: Path) -> None:
    runner, reloader = await start_server(settings, cert_file, key_file)
    # Parsed reviews are acyclic and freed by reference counting; the cyclic collector only adds
    # pauses (its young generation filled every request or two). Keep start-up objects out of
    # its scans and run it rarely.
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    log.info("quorum-webhooks %s listening on https://%s:%d", __version__, settings.host, settings.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await stop_server(runner, reloader)


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop when it is installed (its TLS is native code: ~1.4x the reviews/s of
    asyncio's pure-Python TLS layer here), else on asyncio."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiohttp.server").addFilter(MalformedHTTP())
    overrides = {
        k: v
        for k, v in (
            ("host", args.host),
            ("port", args.port),
            ("cert_file", args.cert_file),
            ("key_file", args.key_file),
        )
        if v is not None
    }
    try:
        settings = load_settings(**overrides)
    except SettingsError as err:
        print(f"quorum-webhooks: {err}", file=sys.stderr)
        return 2
    if args.dev_certs:
        _, cert_file, key_file = tls.dev_certificates(args.dev_certs)
    elif settings.cert_file and settings.key_file:
        cert_file, key_file = settings.cert_file, settings.key_file
    else:
        print(
            "quorum-webhooks: give --cert-file and --key-file (or QUORUM_WEBHOOKS_CERT_FILE/"
            "_KEY_FILE), or --dev-certs DIR for a self-made CA",
            file=sys.stderr,
        )
        return 2
    try:
        run(serve(settings, cert_file, key_file))
    except OSError as err:
        print(f"quorum-webhooks: cannot serve on {settings.host}:{settings.port}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
