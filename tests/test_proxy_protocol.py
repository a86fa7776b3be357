"""The PROXY protocol (v1 and v2) on the listener: the client a terminator in front names is
the one the proxy forwards, logs and checks purges against, on every path a request takes; a
connection without the header is closed unanswered."""

import asyncio
import ipaddress
import json

import pytest
from conftest import until

from proxy.front.proxy_protocol import SIGNATURE, parse

V1 = b"PROXY TCP4 203.0.113.9 192.0.2.1 56324 8080\r\n"


def v2(client: str, command: int = 1) -> bytes:
    address = ipaddress.ip_address(client)
    family = 0x11 if address.version == 4 else 0x21
    other = ipaddress.ip_address("192.0.2.1" if address.version == 4 else "2001:db8::1")
    body = address.packed + other.packed + (56324).to_bytes(2, "big") + (80).to_bytes(2, "big")
    body += b"\x04\x00\x02ok"  # a TLV, skipped
    return SIGNATURE + bytes([0x20 | command, family]) + len(body).to_bytes(2, "big") + body


@pytest.mark.parametrize(
    ("data", "read"),
    [
        (V1 + b"GET /", (len(V1), "203.0.113.9")),
        (b"PROXY TCP6 2001:db8::7 2001:db8::1 1 2\r\n", (40, "2001:db8::7")),
        (b"PROXY UNKNOWN\r\n", (15, None)),
        (b"PROXY TCP4 203.0.113.9", None),  # more to come
        (SIGNATURE[:7], None),
        (v2("198.51.100.4") + b"GET", (len(v2("198.51.100.4")), "198.51.100.4")),
        (v2("2001:db8::9"), (len(v2("2001:db8::9")), "2001:db8::9")),
        (v2("198.51.100.4", command=0), (len(v2("198.51.100.4")), None)),  # LOCAL
        (b"PROXY TCP6 ::ffff:127.0.0.1 ::1 1 2\r\n", (37, "127.0.0.1")),  # mapped: as IPv4
    ],
)
def test_headers_are_read_as_the_protocol_says(data, read):
    assert parse(data) == read


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n",
        b"PROXY TCP4 203.0.113.9 192.0.2.1 99999 80\r\n",
        b"PROXY TCP4 2001:db8::1 192.0.2.1 1 80\r\n",
        b"PROXY TCP4 " + b"1" * 120,
        SIGNATURE + bytes([0x31, 0x11, 0, 0]),  # version 3
        b"PROXY TCP6 fe80::1%a,6.6.6.6 ::1 1 2\r\n",  # a scope id carrying another address
    ],
)
def test_anything_else_is_refused(data):
    with pytest.raises(ValueError):
        parse(data)


async def _exchange(service, data: bytes) -> bytes:
    host, port = service.proxy_address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


@pytest.mark.parametrize("fast_hits", [True, False])
@pytest.mark.parametrize("header", [V1, v2("203.0.113.9")], ids=["v1", "v2"])
async def test_the_client_the_header_names_is_forwarded_and_logged(
    origin, start_proxy, tmp_path, fast_hits, header
):
    log = tmp_path / "access.log"
    service = await start_proxy(server__proxy_protocol=True, server__fast_hits=fast_hits,
                                server__access_log=True, server__access_log_format="json",
                                server__access_log_file=str(log))  # fmt: skip
    requests = (b"GET /p HTTP/1.1\r\nHost: example.test\r\n\r\n"
                b"POST /form HTTP/1.1\r\nHost: example.test\r\nContent-Length: 2\r\n"
                b"Connection: close\r\n\r\nhi")  # fmt: skip
    answer = await _exchange(service, header + requests)
    assert answer.count(b"HTTP/1.1 200 ") == 2
    assert origin.seen_headers["/p"]["X-Forwarded-For"] == "203.0.113.9"
    assert origin.seen_headers["/form"]["X-Forwarded-For"] == "203.0.113.9"
    await until(lambda: len(log.read_text().splitlines()) == 2)
    assert [json.loads(line)["client"] for line in log.read_text().splitlines()] == [
        "203.0.113.9"
    ] * 2


async def test_a_connection_without_the_header_is_closed_unanswered(origin, start_proxy):
    service = await start_proxy(server__proxy_protocol=True)
    answer = await _exchange(service, b"GET /x HTTP/1.1\r\nHost: example.test\r\n\r\n")
    assert answer == b"" and origin.hits["/x"] == 0


async def test_a_purge_is_judged_by_the_client_the_header_names(origin, start_proxy):
    service = await start_proxy(server__proxy_protocol=True, server__purge_from=["203.0.113.0/24"])
    get = b"GET /z HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n"
    for _ in range(2):
        await _exchange(service, V1 + get)
    purge = b"PURGE /z HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n"
    other = b"PROXY TCP4 198.51.100.1 192.0.2.1 5 8080\r\n"
    assert (await _exchange(service, other + purge)).startswith(b"HTTP/1.1 405")
    answer = await _exchange(service, V1 + purge)
    assert answer.startswith(b"HTTP/1.1 200") and b'"removed": 1' in answer
