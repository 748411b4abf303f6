"""The server's TLS: a context from certificate files, re-read when they change (new
handshakes use the new certificate; open connections and the listener are untouched), and a
dev mode that makes its own CA and serving certificate."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

from quorum.pki import CertificateAuthority
from quorum.webhooks.metrics import Metrics

log = logging.getLogger("quorum.webhooks.tls")

SERVICE = "quorum-webhooks"
NAMESPACE = "quorum-system"
DEV_SERVER_NAMES = (
    "127.0.0.1",
    "localhost",
    SERVICE,
    f"{SERVICE}.{NAMESPACE}",
    f"{SERVICE}.{NAMESPACE}.svc",
    f"{SERVICE}.{NAMESPACE}.svc.cluster.local",
)


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


def dev_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.crt, tls.crt, tls.key) in `directory`, made once: a CA and a serving certificate for
    127.0.0.1 and the Service's DNS names. Register the webhooks with ca.crt as caBundle."""
    ca_file, cert_file, key_file = directory / "ca.crt", directory / "tls.crt", directory / "tls.key"
    if not (ca_file.exists() and cert_file.exists() and key_file.exists()):
        ca = CertificateAuthority.create("quorum-webhooks-dev-ca")
        ca.pair.write(directory, "ca")
        serving = ca.issue(SERVICE, client=False, server_names=DEV_SERVER_NAMES)
        key_file.write_bytes(serving.key_pem)
        key_file.chmod(0o600)
        cert_file.write_bytes(serving.cert_pem)
        (directory / "ca.key").unlink()  # never needed again; do not leave a CA key around
    return ca_file, cert_file, key_file


def _stamp(*paths: Path) -> tuple[tuple[int, int], ...]:
    out = []
    for p in paths:
        st = p.stat()
        out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


async def reload_on_change(
    context: ssl.SSLContext, cert_file: Path, key_file: Path, every: float, metrics: Metrics
) -> None:
    """Poll the files; load a changed pair into the live context. A half-written or mismatched
    pair is logged and retried at the next poll; the old certificate stays in use."""
    stamp = _stamp(cert_file, key_file)
    while True:
        await asyncio.sleep(every)
        try:
            current = _stamp(cert_file, key_file)
            if current == stamp:
                continue
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as err:
            log.warning("serving certificate not reloaded yet: %s", err)
            continue
        stamp = current
        metrics.certificate_reloaded()
        log.info("serving certificate reloaded from %s", cert_file)
