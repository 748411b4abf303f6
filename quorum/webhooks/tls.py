"""The server's TLS: a context from certificate files, re-read when they change (new
handshakes use the new certificate; open connections and the listener are untouched), and the
server's own CA: a serving certificate for the Service's names (`quorum certs`) or for
127.0.0.1 (dev mode)."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from pathlib import Path

from quorum.pki import CertificateAuthority
from quorum.webhooks.metrics import Metrics

log = logging.getLogger("quorum.webhooks.tls")

SERVICE = "quorum-webhooks"
LOOPBACK_NAMES = ("127.0.0.1", "localhost")


def service_names(namespace: str) -> tuple[str, ...]:
    """The DNS names of the Service `quorum-webhooks` in `namespace`."""
    return (
        SERVICE,
        f"{SERVICE}.{namespace}",
        f"{SERVICE}.{namespace}.svc",
        f"{SERVICE}.{namespace}.svc.cluster.local",
    )


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


def issue(server_names: tuple[str, ...]) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, serving certificate, serving key) as PEM: a new CA signs one serving
    certificate for `server_names`. The CA's key lives only in this call: it is never written,
    and a rotation makes a new CA rather than reusing one."""
    # A name per CA (as well as a key): during a rotation the caBundle holds two of them.
    ca = CertificateAuthority.create(f"{SERVICE}-ca@{int(time.time())}")
    serving = ca.issue(SERVICE, client=False, server_names=server_names)
    return ca.pair.cert_pem, serving.cert_pem, serving.key_pem


def certificates(directory: Path, server_names: tuple[str, ...]) -> tuple[Path, Path, Path]:
    """(ca.crt, tls.crt, tls.key) in `directory`, made once (see `issue`); made again only if
    one of the three is missing."""
    ca_file, cert_file, key_file = directory / "ca.crt", directory / "tls.crt", directory / "tls.key"
    if not (ca_file.exists() and cert_file.exists() and key_file.exists()):
        ca_pem, cert_pem, key_pem = issue(server_names)
        directory.mkdir(parents=True, exist_ok=True)
        key_file.write_bytes(key_pem)
        key_file.chmod(0o600)
        cert_file.write_bytes(cert_pem)
        ca_file.write_bytes(ca_pem)
    return ca_file, cert_file, key_file


def dev_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """`certificates` for a local run, reached on 127.0.0.1: register the webhooks by URL with
    ca.crt as caBundle."""
    return certificates(directory, LOOPBACK_NAMES)


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
