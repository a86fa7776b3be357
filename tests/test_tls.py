"""TLS on the listener: hits answered on the compiled path over it, HTTP/1.1 by ALPN, and a
certificate that cannot be used refused before the start, in one line."""

import asyncio
import ssl
import subprocess
import sys

import aiohttp
import pytest
import trustme


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def certificate(authority, tmp_path) -> tuple[str, str]:
    issued = authority.issue_cert("127.0.0.1", "localhost")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    for pem in issued.cert_chain_pems[1:]:
        pem.write_to_path(str(cert), append=True)
    issued.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


def _client_context(authority, alpn=("http/1.1",)) -> ssl.SSLContext:
    context = ssl.create_default_context()
    authority.configure_trust(context)
    context.set_alpn_protocols(list(alpn))
    return context


async def test_hits_are_answered_over_tls_on_the_compiled_path(
    origin, start_proxy, authority, certificate
):
    origin.set("/t", body=b"secret" * 100)
    cert, key = certificate
    service = await start_proxy(server__tls_cert=cert, server__tls_key=key)
    host, port = service.proxy_address
    connector = aiohttp.TCPConnector(ssl=_client_context(authority))
    async with aiohttp.ClientSession(connector=connector) as client:
        answers = []
        for _ in range(4):
            async with client.get(f"https://{host}:{port}/t",
                                  headers={"Host": "example.test"}) as r:  # fmt: skip
                answers.append((r.status, await r.read(), r.headers["X-Cache"]))
    assert [a[:2] for a in answers] == [(200, b"secret" * 100)] * 4
    assert [a[2] for a in answers][2:] == ["HIT", "HIT"]
    assert service.proxy.fast_hits >= 1  # the compiled path answered over TLS


async def test_alpn_chooses_http_1_1_and_plain_http_is_not_served(
    origin, start_proxy, authority, certificate
):
    cert, key = certificate
    service = await start_proxy(server__tls_cert=cert, server__tls_key=key)
    host, port = service.proxy_address
    for offered, chosen in ((("h2", "http/1.1"), "http/1.1"), (("h2",), None)):
        reader, writer = await asyncio.open_connection(
            host, port, ssl=_client_context(authority, offered), server_hostname="127.0.0.1"
        )
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == chosen
        writer.close()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /t HTTP/1.1\r\nHost: example.test\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)
    assert not answer.startswith(b"HTTP/1.1 200")  # no plaintext answer on a TLS port
    writer.close()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (("server.tls_cert=/nowhere/cert.pem", "server.tls_key=/nowhere/key.pem"),
         "[server] tls_cert '/nowhere/cert.pem' and tls_key '/nowhere/key.pem' cannot be used"),
        (("server.tls_cert=/nowhere/cert.pem",), "[server] tls_cert and tls_key go together"),
    ],
)  # fmt: skip
def test_a_certificate_that_cannot_be_used_is_refused_in_one_line(settings, message):
    sets = [arg for setting in settings for arg in ("--set", setting)]
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "--check-config", "--origin", "http://127.0.0.1:1",
         *sets],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


async def test_a_connection_that_never_begins_its_tls_handshake_is_closed_at_the_idle_timeout(
    origin, start_proxy, certificate
):
    """A client that connects and sends nothing holds a TLS listener no longer than a plain
    one: the handshake must end within ``[server] idle_timeout`` (asyncio's own is 60 s)."""
    cert, key = certificate
    service = await start_proxy(server__tls_cert=cert, server__tls_key=key,
                                server__idle_timeout="300ms")  # fmt: skip
    reader, writer = await asyncio.open_connection(*service.proxy_address)
    try:
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the proxy
    finally:
        writer.close()


def _issue(
    authority: trustme.CA, cert: str, key: str, key_type: trustme.KeyType = trustme.KeyType.ECDSA
) -> None:
    issued = authority.issue_cert("127.0.0.1", "localhost", key_type=key_type)
    issued.cert_chain_pems[0].write_to_path(cert)
    for pem in issued.cert_chain_pems[1:]:
        pem.write_to_path(cert, append=True)
    issued.private_key_pem.write_to_path(key)


async def reloadable_tls(origin, tmp_path, cert: str, key: str):
    """onehit serving TLS with ``cert`` and ``key``, from a file a reload reads again."""
    from proxy.config.settings import load
    from proxy.ops.service import Service

    path = tmp_path / "proxy.toml"
    path.write_text(f'[server]\ntls_cert = "{cert}"\ntls_key = "{key}"\n')
    flags = {"upstream.origin": origin.url, "server.listen": "127.0.0.1:0",
             "admin.listen": "127.0.0.1:0", "server.access_log": False}  # fmt: skip

    def read():
        return load(path, env={}, overrides=flags)

    return await Service.start(read(), read_config=read), path


async def test_a_certificate_renewed_in_place_is_taken_by_a_reload_without_dropping_connections(
    origin, authority, certificate, tmp_path
):
    from conftest import admin

    cert, key = certificate
    service, path = await reloadable_tls(origin, tmp_path, cert, key)
    try:
        host, port = service.proxy_address
        url = f"https://{host}:{port}/t"
        renewed = trustme.CA()  # the renewed certificate, from an authority the old one is not
        old_client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=_client_context(authority), limit=1)
        )
        async with old_client:
            async with old_client.get(url, headers={"Host": "example.test"}) as r:
                assert r.status == 200
            _issue(renewed, cert, key)  # certbot writes the files in place
            async with (
                aiohttp.ClientSession() as plain,
                plain.post(admin(service) + "/reload", json={}) as r,
            ):
                assert (r.status, (await r.json())["reloaded"]) == (200, True)
            # The connection open before goes on with the certificate it shook hands with.
            async with old_client.get(url, headers={"Host": "example.test"}) as r:
                assert r.status == 200
        connector = aiohttp.TCPConnector(ssl=_client_context(renewed))
        async with (
            aiohttp.ClientSession(connector=connector) as new_client,
            new_client.get(url, headers={"Host": "example.test"}) as r,
        ):
            assert r.status == 200  # a new handshake shows the renewed one
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            connector = aiohttp.TCPConnector(ssl=_client_context(authority))
            async with aiohttp.ClientSession(connector=connector) as stale:
                await stale.get(url, headers={"Host": "example.test"})
        path.write_text("")  # TLS off: the listener's kind changes, which takes a restart
        async with (
            aiohttp.ClientSession() as plain,
            plain.post(admin(service) + "/reload", json={}) as r,
        ):
            answer = await r.json()
        assert r.status == 409 and "server.tls_cert" in answer["error"]
        assert "restart" in answer["error"]
    finally:
        await service.stop()


async def test_a_certificate_of_another_key_type_replaces_the_old_one_for_every_client(
    origin, tmp_path
):
    """An RSA certificate renewed as ECDSA: after the reload no client is shown the RSA one
    (loaded into the live context, OpenSSL kept it beside the new one, for RSA-only
    clients)."""
    from conftest import admin

    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    _issue(trustme.CA(), cert, key, trustme.KeyType.RSA)
    service, _ = await reloadable_tls(origin, tmp_path, cert, key)
    try:
        host, port = service.proxy_address
        renewed = trustme.CA()
        _issue(renewed, cert, key, trustme.KeyType.ECDSA)
        async with (
            aiohttp.ClientSession() as plain,
            plain.post(admin(service) + "/reload", json={}) as r,
        ):
            assert r.status == 200
        rsa_only = ssl.create_default_context()
        rsa_only.check_hostname, rsa_only.verify_mode = False, ssl.CERT_NONE
        rsa_only.maximum_version = ssl.TLSVersion.TLSv1_2
        rsa_only.set_ciphers("ECDHE-RSA-AES128-GCM-SHA256")  # accepts an RSA certificate only
        with pytest.raises((ssl.SSLError, ConnectionError)):  # no certificate it can take
            _, writer = await asyncio.open_connection(host, port, ssl=rsa_only)
            writer.close()
        connector = aiohttp.TCPConnector(ssl=_client_context(renewed))
        async with (
            aiohttp.ClientSession(connector=connector) as client,
            client.get(f"https://{host}:{port}/t", headers={"Host": "example.test"}) as r,
        ):
            assert r.status == 200
    finally:
        await service.stop()
