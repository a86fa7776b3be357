"""Cache-key controls (``[cache] key_query``, ``key_query_sort``): which query parameters make
up the key, the same in the proxy, its purge and the simulator; every parameter still reaches
the origin."""

from __future__ import annotations

import aiohttp
import numpy as np
import pytest
from conftest import base

from loadgen.traces.trace import Trace
from proxy.config.settings import ConfigError, load
from proxy.core.cachekey import KeyQuery


@pytest.mark.parametrize(
    ("setting", "target", "key"),
    [
        (KeyQuery(), "/p?b=2&a=1", "/p?b=2&a=1"),
        (KeyQuery("none"), "/p?b=2&a=1", "/p"),
        (KeyQuery("include", frozenset({"id"})), "/p?x=1&id=7&id=8", "/p?id=7&id=8"),
        (KeyQuery("include", frozenset({"id"})), "/p?x=1", "/p"),
        (KeyQuery("exclude", frozenset({"utm_source"})), "/p?utm_source=a&q=1", "/p?q=1"),
        (KeyQuery(sort=True), "/p?b=2&a=1&b=1", "/p?a=1&b=2&b=1"),  # one name's values keep order
        (KeyQuery(sort=True), "/p?&&a=1&", "/p?a=1"),
        # Names as the origin reads them: decoded, so an encoded name is the parameter it names.
        (KeyQuery("exclude", frozenset({"a"})), "/p?%61=1&b=2", "/p?b=2"),
        (KeyQuery("include", frozenset({"id"})), "/p?id=1&%69d=evil", "/p?id=1&%69d=evil"),
        (KeyQuery("include", frozenset({"a b"})), "/p?a+b=1&x=2", "/p?a+b=1"),
        # ... and every other reading an origin may make of one: case, a second decoding,
        # PHP's "_" for ".", " " and "[".
        (KeyQuery("include", frozenset({"id"})), "/p?id=1&ID=evil", "/p?id=1&ID=evil"),
        (KeyQuery("include", frozenset({"id"})), "/p?id=1&%2569d=evil", "/p?id=1&%2569d=evil"),
        (KeyQuery("include", frozenset({"i_d"})), "/p?i_d=1&i.d=evil", "/p?i_d=1&i.d=evil"),
        (KeyQuery("include", frozenset({"i_d"})), "/p?i_d=1&i[d=evil", "/p?i_d=1&i[d=evil"),
        # ... PHP's leading spaces, its cut at a NUL, its arrays.
        (KeyQuery("include", frozenset({"id"})), "/p?id=1&+id=evil", "/p?id=1&+id=evil"),
        (KeyQuery("include", frozenset({"id"})), "/p?id=1&%20id=evil", "/p?id=1&%20id=evil"),
        (KeyQuery("include", frozenset({"id"})), "/p?id=1&id%00x=evil", "/p?id=1&id%00x=evil"),
        (KeyQuery("include", frozenset({"id"})), "/p?id=1&id[]=evil", "/p?id=1&id[]=evil"),
        (KeyQuery("include", frozenset({"id"})), "/p?id=1&id[0]=e&x=2", "/p?id=1&id[0]=e"),
        # ... whose names have PHP's "_" for "." and " " before the "[" too.
        (KeyQuery("include", frozenset({"i_d"})), "/p?i_d=1&i.d[]=evil", "/p?i_d=1&i.d[]=evil"),
        (KeyQuery("include", frozenset({"i_d"})), "/p?i_d=1&+i.d[0]=e", "/p?i_d=1&+i.d[0]=e"),
        (KeyQuery("include", frozenset({"i_d"})), "/p?i_d=1&i+d[x]=e", "/p?i_d=1&i+d[x]=e"),
        # ... and so are the setting's: an encoded name is the parameter, however it is sent.
        (KeyQuery("include", frozenset({"size%5B%5D"})), "/p?size[]=1&x=2", "/p?size[]=1"),
        (KeyQuery("exclude", frozenset({"size%5B%5D"})), "/p?size%5B%5D=1&x=2", "/p?x=2"),
        # A ';' may separate parameters for the origin: what holds one is keyed whole.
        (
            KeyQuery("exclude", frozenset({"utm_source"})),
            "/p?utm_source=x;id=evil",
            "/p?utm_source=x;id=evil",
        ),
        (KeyQuery("include", frozenset({"id"})), "/p?x=1;id=evil&id=1", "/p?x=1;id=evil&id=1"),
        (KeyQuery("none"), "/p", "/p"),
    ],
)
def test_the_key_holds_the_parameters_the_setting_keeps(setting, target, key):
    assert setting.key(target) == key


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("none", ("none", ())),
        ("exclude:utm_source, utm_medium", ("exclude", ("utm_source", "utm_medium"))),
        ({"include": ["id"]}, ("include", ("id",))),
    ],
)
def test_key_query_reads_from_toml_tables_and_from_strings(value, expected):
    config = load(env={}, overrides={"upstream.origin": "http://127.0.0.1:1",
                                     "cache.key_query": value})  # fmt: skip
    assert config.cache.key_query == expected


@pytest.mark.parametrize("value", ["some", {"include": []}, {"only": ["a"]}, "include:"])
def test_a_bad_key_query_names_the_key_and_the_forms_it_takes(value):
    with pytest.raises(ConfigError, match=r"key_query.*(expected|include)"):
        load(env={}, overrides={"upstream.origin": "http://127.0.0.1:1",
                                "cache.key_query": value})  # fmt: skip


async def get(service, target: str) -> tuple[int, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.get(base(service) + target) as r:
        await r.read()
        return r.status, dict(r.headers)


async def test_unkeyed_parameters_share_one_object_and_still_reach_the_origin(origin, start_proxy):
    origin.set("/p", body=b"page", headers={"Cache-Control": "max-age=60"})
    service = await start_proxy(admission__policy="always", cache__key_query="exclude:utm_source",
                                cache__key_query_sort=True)  # fmt: skip
    assert (await get(service, "/p?b=2&a=1&utm_source=mail"))[0] == 200
    for target in ("/p?a=1&b=2&utm_source=ad", "/p?a=1&b=2", "/p?b=2&a=1"):
        status, headers = await get(service, target)
        assert status == 200 and headers["X-Cache"] == "HIT", target
    assert "detail=disk" not in headers["Cache-Status"]
    assert (await get(service, "/p?a=1&b=3"))[1]["X-Cache"] != "HIT"  # a keyed parameter
    assert origin.hits["/p?b=2&a=1&utm_source=mail"] == 1  # sent as the client sent it
    assert sum(origin.hits.values()) == 2
    host, port = service.admin_address
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://{host}:{port}/purge",
                     json={"url": f"{base(service)}/p?utm_source=x&b=2&a=1"}) as r,
    ):  # fmt: skip
        assert (await r.json())["removed"] == 1  # the purge is keyed as requests are


def test_the_simulator_keys_a_traces_urls_as_the_proxy_does():
    names = ["/p?a=1&utm_source=x", "/p?utm_source=y&a=1", "/q"]
    trace = Trace(np.zeros(4), np.array([0, 1, 2, 0]), np.full(4, 10), names)
    keyed = trace.keyed(KeyQuery("exclude", frozenset({"utm_source"}), sort=True))
    assert keyed.key_strings() == ["/p?a=1", "/p?a=1", "/q", "/p?a=1"]
    assert len(keyed.names or ()) == 2


async def test_a_route_keys_its_queries_by_its_own_setting(origin, start_proxy, tmp_path):
    path = tmp_path / "routes.toml"
    path.write_text(
        f'[[routes]]\nhost = "shop.test"\norigin = "{origin.url}"\nkey_query = "include:id"\n'
        f'[[routes]]\nhost = "blog.test"\norigin = "{origin.url}"\n'
    )
    config = load(path, env={}, overrides={"server.listen": "127.0.0.1:0",
                                           "admin.listen": "127.0.0.1:0"})  # fmt: skip
    assert config.effective()["routes"][0]["key_query"] == {"include": ["id"]}
    origin.set("/p", body=b"p", headers={"Cache-Control": "max-age=60"})
    routes = [{"host": "shop.test", "origin": origin.url, "key_query": "include:id"},
              {"host": "blog.test", "origin": origin.url}]  # fmt: skip
    service = await start_proxy(routes=routes, admission__policy="always")
    for host, hits in (("shop.test", ["MISS", "HIT"]), ("blog.test", ["MISS", "MISS"])):
        got = []
        for target in ("/p?id=1&x=1", "/p?id=1&x=2"):
            async with (
                aiohttp.ClientSession() as session,
                session.get(base(service) + target, headers={"Host": host}) as r,
            ):
                await r.read()
                got.append("HIT" if r.headers["X-Cache"] == "HIT" else "MISS")
        assert got == hits, host
