"""TLS of the real server: 1.2 minimum, dev certificates, and certificate reload without
dropping the server or its open connections."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from pathlib import Path

import aiohttp
import pytest

from quorum.webhooks import tls
from quorum.webhooks.main import start_server, stop_server
from quorum.webhooks.settings import WebhookSettings
from tests.unit.webhooks.factories import pod, review_body


def client_context(ca: Path, maximum: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if maximum is not None:
        context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        context.maximum_version = maximum
    return context


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dev_certificates_are_made_once(tmp_path: Path) -> None:
    ca, cert, key = tls.dev_certificates(tmp_path)
    before = cert.read_bytes()
    assert tls.dev_certificates(tmp_path) == (ca, cert, key)
    assert cert.read_bytes() == before
    assert not (tmp_path / "ca.key").exists()
    assert key.stat().st_mode & 0o777 == 0o600


async def test_tls_12_minimum_and_reload_without_dropping(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    ca_a, cert_a, key_a = tls.dev_certificates(first)
    ca_b, cert_b, key_b = tls.dev_certificates(second)
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(cert_a, live / "tls.crt")
    shutil.copy(key_a, live / "tls.key")
    port = free_port()
    settings = WebhookSettings(port=port, cert_reload_seconds=0.1)
    runner, reloader = await start_server(settings, live / "tls.crt", live / "tls.key")
    url = f"https://127.0.0.1:{port}"
    try:
        # TLS 1.1 is refused, TLS 1.2 works.
        with pytest.raises(aiohttp.ClientError):
            async with aiohttp.ClientSession() as s:
                await s.get(url + "/healthz", ssl=client_context(ca_a, ssl.TLSVersion.TLSv1_1))
        old = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(ca_a), limit=1))
        async with old:
            assert (await old.get(url + "/healthz")).status == 200
            # Rotate: write the new pair in place (as a Secret volume update would).
            shutil.copy(cert_b, live / "tls.crt")
            shutil.copy(key_b, live / "tls.key")
            for _ in range(50):
                await asyncio.sleep(0.1)
                try:
                    async with aiohttp.ClientSession() as new:
                        response = await new.get(url + "/healthz", ssl=client_context(ca_b))
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    continue
            else:
                pytest.fail("the new certificate was never served")
            # The open keep-alive connection (made with the old certificate) still answers.
            response = await old.post(url + "/mutate/pods", data=review_body("Pod", pod()))
            assert response.status == 200
            assert (await response.json())["response"]["allowed"] is True
            metrics = await (await old.get(url + "/metrics")).text()
            assert "quorum_webhook_certificate_reloads_total 1" in metrics
    finally:
        await stop_server(runner, reloader)
