"""The listener's TLS (``[server] tls_cert`` and ``tls_key``): TLS 1.2 and later, HTTP/1.1 by
ALPN (a client offering only h2 is told no protocol, and an HTTP/2 preface is refused, 400
from aiohttp's parser, and the connection closed: put a terminator that speaks HTTP/2 in
front, docs/operations.md). The compiled hit path answers over it as over plain TCP: it reads
what the TLS layer decrypted."""

from __future__ import annotations

import ssl

from proxy.config.settings import ConfigError, ServerSection


def server_context(server: ServerSection) -> ssl.SSLContext | None:
    """The TLS context of the listener ``server`` describes, or None for plain TCP;
    ``ConfigError`` naming the keys when the certificate or key cannot be used."""
    if not server.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(server.tls_cert, server.tls_key)
    except OSError as exc:
        reason = exc.strerror or getattr(exc, "reason", None) or str(exc)
        raise ConfigError(
            f"[server] tls_cert {server.tls_cert!r} and tls_key {server.tls_key!r} cannot be "
            f"used ({reason}): give a PEM certificate chain and its private key"
        ) from None
    return context
