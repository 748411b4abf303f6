"""kubernetes-asyncio clients: from a kubeconfig file, or in-cluster."""

from __future__ import annotations

import os

from kubernetes_asyncio import client, config


async def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    configuration = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        await config.load_kube_config(config_file=path, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)
