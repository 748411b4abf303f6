"""kubernetes-asyncio clients: from a kubeconfig file, or in-cluster; and the one way the `quorum`
command makes its client, as kubectl would for the person running it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException


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


IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class KubeconfigError(RuntimeError):
    """No usable kubeconfig (or in-cluster account); the message says what was tried."""


@dataclass(frozen=True)
class CommandClient:
    """The `quorum` command's client, and the namespace the kubeconfig's context names."""

    api: client.ApiClient
    namespace: str
    server: str


async def command_client(kubeconfig: str | None = None, context: str | None = None) -> CommandClient:
    """A client for the person running the `quorum` command, found as kubectl finds it:
    `kubeconfig` (else $KUBECONFIG, which may list several files, else ~/.kube/config), its
    `context` (else the current one), the context's namespace (else `default`); with no
    kubeconfig at all, the pod's own ServiceAccount (in-cluster)."""
    path, exists = _kubeconfig_path(kubeconfig)
    configuration = client.Configuration()
    if not exists and not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException as err:
            raise KubeconfigError(
                f"no kubeconfig at {path}, and in-cluster configuration failed: {err}"
            ) from None
        namespace = _in_cluster_namespace()
        return CommandClient(
            without_per_request_env_lookups(configuration), namespace, str(configuration.host or "")
        )
    if not exists:
        raise KubeconfigError(
            f"no kubeconfig at {path}: pass --kubeconfig FILE, or set KUBECONFIG (`. .quorum/env` for the "
            "local control plane)"
        )
    try:
        loader = await config.load_kube_config(
            config_file=path, context=context, client_configuration=configuration, persist_config=False
        )
    except (ConfigException, KeyError, TypeError, ValueError) as err:
        raise KubeconfigError(f"kubeconfig {path} cannot be used: {err}") from None
    current = getattr(loader, "current_context", None) or {}
    namespace = str((current.get("context") or {}).get("namespace") or "default")
    return CommandClient(
        without_per_request_env_lookups(configuration), namespace, str(configuration.host or "")
    )


def _kubeconfig_path(kubeconfig: str | None) -> tuple[str, bool]:
    """The kubeconfig (one file, or $KUBECONFIG's list), and whether any of its files exists."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    return path, any(Path(p).expanduser().exists() for p in path.split(os.pathsep) if p)


def _in_cluster_namespace() -> str:
    return IN_CLUSTER_NAMESPACE.read_text().strip() if IN_CLUSTER_NAMESPACE.exists() else "default"
