"""The PROXY protocol (HAProxy's, versions 1 and 2): the header a TLS terminator or load
balancer in front (haproxy ``send-proxy``, hitch ``--write-proxy``, nginx ``proxy_protocol on``,
AWS NLB) sends first on each connection, naming the client it accepted, so the proxy logs,
forwards (``X-Forwarded-For``) and purges by the client's address, not the terminator's.

Rules (https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt):

* Version 1: one line of at most 107 bytes, ``PROXY TCP4|TCP6 <src> <dst> <sport> <dport>``
  or ``PROXY UNKNOWN ...``, ending in CRLF; addresses and ports as the text says.
* Version 2: the 12-byte signature, then version 2 with a command (``LOCAL``: a health check
  from the terminator itself, ``PROXY``: a relayed connection), a family (TCP over IPv4 or
  IPv6; anything else is taken as ``UNKNOWN``), the length of what follows, the addresses,
  and TLVs, which are skipped.
* ``LOCAL`` and ``UNKNOWN`` name no client: the connection's own peer stands.
* Anything else, or more than ``MAX_HEADER`` bytes without a whole header, is a connection to
  close: a listener that expects the header never reads a request from one that lacks it.
"""

from __future__ import annotations

import ipaddress

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
MAX_V1 = 107
# The longest version-2 header taken: the addresses of IPv6 and room for TLVs.
MAX_HEADER = 16 + 4096


def parse(data: bytes) -> tuple[int, str | None] | None:
    """The header at the start of ``data``: (its length, the client's address or None when it
    names none); None while it is incomplete. ValueError when it is no PROXY header."""
    if data.startswith(SIGNATURE[: len(data)]) and len(data) < 16:
        return None  # maybe a version-2 header, its fixed part still coming
    if data.startswith(SIGNATURE):
        return _v2(data)
    if data.startswith(b"PROXY "[: len(data)]) and len(data) < 6:
        return None
    if data.startswith(b"PROXY "):
        return _v1(data)
    raise ValueError("no PROXY protocol header")


def _v1(data: bytes) -> tuple[int, str | None] | None:
    end = data.find(b"\r\n", 0, MAX_V1)
    if end < 0:
        if len(data) >= MAX_V1:
            raise ValueError("a PROXY v1 header longer than 107 bytes")
        return None
    parts = data[:end].decode("ascii", "strict").split(" ")
    if parts[1] == "UNKNOWN":
        return end + 2, None
    if len(parts) != 6 or parts[1] not in ("TCP4", "TCP6"):
        raise ValueError(f"a malformed PROXY v1 header: {data[:end]!r}")
    if "%" in parts[2] or "%" in parts[3]:  # a scope id would pass on whatever follows it
        raise ValueError("a PROXY v1 header with a scoped address")
    source = ipaddress.ip_address(parts[2])
    ipaddress.ip_address(parts[3])
    if source.version != (4 if parts[1] == "TCP4" else 6):
        raise ValueError("a PROXY v1 header whose address is not of its family")
    for port in parts[4:]:
        if not port.isdigit() or int(port) > 65535 or (len(port) > 1 and port[0] == "0"):
            raise ValueError(f"a PROXY v1 header with port {port!r}")
    return end + 2, _client(source)


def _client(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An address as the proxy names a client: an IPv4 one mapped into IPv6 as IPv4, as
    ``purge_from`` and the logs read a client's address."""
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped if mapped is not None else address)


def _v2(data: bytes) -> tuple[int, str | None] | None:
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != 2 or command > 1:
        raise ValueError("a PROXY v2 header of another version or command")
    length = int.from_bytes(data[14:16], "big")
    if 16 + length > MAX_HEADER:
        raise ValueError("a PROXY v2 header longer than taken")
    if len(data) < 16 + length:
        return None
    end = 16 + length
    if command == 0:  # LOCAL
        return end, None
    family, body = data[13], data[16:end]
    if family == 0x11 and length >= 12:  # TCP over IPv4
        return end, str(ipaddress.IPv4Address(body[:4]))
    if family == 0x21 and length >= 36:  # TCP over IPv6
        return end, _client(ipaddress.IPv6Address(body[:16]))
    if family in (0x11, 0x21):
        raise ValueError("a PROXY v2 header too short for its addresses")
    return end, None  # UNSPEC, UDP or a Unix socket: no client address to take
