"""Kubeconfig files for the identities of a local cluster, and a tiny synchronous REST client
used while starting one (health checks, readiness), so start-up needs no kubectl round trips."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_pem: bytes,
    user: str,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> Path:
    """A self-contained kubeconfig (certificates embedded) for one identity."""
    credentials: dict[str, str] = {}
    if cert_pem is not None and key_pem is not None:
        credentials = {
            "client-certificate-data": _b64(cert_pem),
            "client-key-data": _b64(key_pem),
        }
    elif token is not None:
        credentials = {"token": token}
    else:
        raise ValueError("a kubeconfig needs a client certificate or a token")
    context: dict[str, str] = {"cluster": "quorum-dev", "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "quorum-dev",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            },
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": context}],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


class RestClient:
    """Minimal HTTPS client authenticated by a client certificate (the admin's)."""

    def __init__(self, server: str, ca_file: Path, cert_file: Path, key_file: Path) -> None:
        self.server = server.rstrip("/")
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.context.load_cert_chain(str(cert_file), str(key_file))

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        request = urllib.request.Request(self.server + path)  # noqa: S310 (https only)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.context) as resp:  # noqa: S310
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except (OSError, urllib.error.URLError) as err:  # not listening (yet), reset, timeout
            return 0, str(err).encode()

    def get_json(self, path: str) -> Any:
        status, body = self.get(path)
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}: {body[:300]!r}")
        return json.loads(body)


def probe(url: str, timeout: float = 2.0) -> bool:
    """True if url answers 200 (certificates not checked: self-signed component endpoints)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:  # noqa: S310
            return int(resp.status) == 200
    except (OSError, urllib.error.URLError):
        return False
