"""The API client quorum makes: no environment lookups per request, a proxy resolved once."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from quorum.k8s.client import env_proxy, without_per_request_env_lookups


def test_env_proxy_follows_https_proxy_and_no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy("https://10.0.0.1:443") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert env_proxy("https://10.0.0.1:443") == "http://proxy.example:3128"
    monkeypatch.setenv("NO_PROXY", "10.0.0.1,.svc")
    assert env_proxy("https://10.0.0.1:443") is None
    assert env_proxy("https://kubernetes.default.svc") is None


async def test_the_session_does_not_trust_the_environment_per_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    configuration = client.Configuration(host="https://apiserver.example:6443")
    api = without_per_request_env_lookups(configuration)
    async with api:
        session = api.rest_client.pool_manager
        assert session.trust_env is False
        assert not session.closed and session.connector is not None
        assert api.rest_client.proxy == "http://proxy.example:3128"  # resolved once, used always
