"""kubernetes-asyncio clients: from a kubeconfig file, or in-cluster."""

from __future__ import annotations

import os
from collections.abc import Sequence
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
from kubernetes_asyncio import client, config


async def api_client(
    kubeconfig: str | None = None, trace_configs: Sequence[aiohttp.TraceConfig] = ()
) -> client.ApiClient:
    """An ApiClient for `kubeconfig` (else $KUBECONFIG, else in-cluster); `trace_configs` go to
    its aiohttp session (the operator counts its requests with one)."""
    configuration = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        await config.load_kube_config(config_file=path, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return without_per_request_env_lookups(configuration, trace_configs)


def env_proxy(server: str | None) -> str | None:
    """The proxy the environment (HTTPS_PROXY, NO_PROXY, ...) names for the apiserver, if any."""
    parts = urlsplit(server or "")
    if not parts.hostname or proxy_bypass(parts.hostname):
        return None
    return getproxies().get(parts.scheme)


def without_per_request_env_lookups(
    configuration: client.Configuration, trace_configs: Sequence[aiohttp.TraceConfig] = ()
) -> client.ApiClient:
    """An ApiClient whose aiohttp session does not consult the environment on every request.

    kubernetes-asyncio makes its session with `trust_env=True`: aiohttp then looks up proxy
    variables and reads ~/.netrc in a thread for each request, a fifth of quorum-operator's CPU
    while it releases gangs (py-spy, docs/benchmarks.md). Neither can change while the process
    runs, so a proxy the environment names for the apiserver is resolved once, here (netrc
    credentials never apply: the apiserver is reached with a token or a client certificate).
    `trace_configs` are given to the session (aiohttp's request tracing)."""
    if configuration.proxy is None:
        configuration.proxy = env_proxy(configuration.host)
    api = client.ApiClient(configuration)
    rest = api.rest_client
    session = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=session.connector,
        trust_env=False,
        read_bufsize=2**21,
        trace_configs=list(trace_configs) or None,
    )
    session.detach()  # the connector now belongs to the new session
    return api
