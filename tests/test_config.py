"""Config: defaults < TOML < ONEHIT_* env < flags, and one clear line for every bad value."""

import os
from pathlib import Path

import pytest

from proxy.config.settings import ConfigError, load

ORIGIN = {"upstream.origin": "http://127.0.0.1:9000"}
REPO = Path(__file__).resolve().parent.parent


def test_defaults_with_only_an_origin():
    c = load(env={}, overrides=ORIGIN)
    assert c.server.listen == ("127.0.0.1", 8080) and c.admin.listen == ("127.0.0.1", 9901)
    assert c.cache.size == 256 << 20 and c.admission.window == "auto"
    assert c.route_table() == {"": "http://127.0.0.1:9000"}


def test_documented_proxy_toml_names_every_key_with_its_default():
    text = (REPO / "config" / "proxy.toml").read_text()
    c = load(REPO / "config" / "proxy.toml", env={}, overrides=ORIGIN)
    assert c == load(env={}, overrides=ORIGIN)
    from dataclasses import fields

    from proxy.config.settings import SECTIONS

    for section, cls in SECTIONS.items():
        assert f"[{section}]" in text
        for f in fields(cls):
            assert f"\n{f.name} = " in text, f"[{section}] {f.name} is not documented"


def test_precedence_file_then_env_then_flags(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        '[cache]\nsize = "1MiB"\nmax_object_size = "64KiB"\n'
        '[admission]\npolicy = "always"\n[upstream]\norigin = "http://127.0.0.1:1"\n'
        '[[routes]]\nhost = "CDN.example"\norigin = "http://127.0.0.1:2"\n'
    )
    env = {"ONEHIT_CACHE_SIZE": "2MiB", "ONEHIT_ADMISSION_WINDOW": "10m"}
    c = load(path, env=env, overrides={"admission.window": "20m"})
    assert c.cache.size == 2 << 20 and c.cache.max_object_size == 64 << 10
    assert c.admission.policy == "always" and c.admission.window == 1200.0
    assert c.route_table() == {"cdn.example": "http://127.0.0.1:2", "": "http://127.0.0.1:1"}


def test_routes_from_the_environment():
    c = load(env={"ONEHIT_ROUTES": "a.example=http://127.0.0.1:1, b.example=https://h:8443"})
    assert c.route_table() == {"a.example": "http://127.0.0.1:1", "b.example": "https://h:8443"}


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[cache]\nsize = "lots"\n', "[cache] size = 'lots': size 'lots' is not a size"),
        ('[admission]\npolicy = "auto"\n', "auto is a disk tier's ([disk] policy)"),
        ('[whatif]\ndisk_policies = ["tinylfu"]\n', "[whatif] disk_policies = ['tinylfu']"),
        ('[cache]\nsise = "1MiB"\n', "unknown key 'sise' in [cache] (did you mean 'size'?)"),
        ('[cahce]\nsize = "1MiB"\n', "unknown section [cahce] (did you mean [cache]?)"),
        ('[[routes]]\nhost = "a"\norigin = "ftp://x"\n', "route a origin 'ftp://x': expected an"),
        ("[admission]\nfp_rate = 2\n", "[admission] fp_rate = 2: expected a number between 0"),
        (
            '[admission]\npolicy = "lfu"\n',
            "unknown admission policy 'lfu' (did you mean 'tinylfu'?)",
        ),
        ('[cache]\neviction = "fifo"\n', "[cache] eviction = 'fifo': unknown eviction 'fifo'"),
        ('[cache]\neviction = "s3fifo:small=2"\n', "s3fifo's small is from 0.001 to 0.99, got '2'"),
        ('[server]\nevent_loop = "fast"\n', "[server] event_loop = 'fast': expected 'auto'"),
        ("[server]\naccess_log = 3\n", "[server] access_log = 3: expected true or false"),
        (
            '[server]\naccess_log_buffer = "1TiB"\n',
            "[server] access_log_buffer = '1TiB': expected a size of at most 64 MiB",
        ),
        ('[server]\nworkers = "two"\n', "[server] workers = 'two': expected a positive count"),
        ('[server]\nlisten = "8080"\n', "expected host:port"),
        ("[cache]\nsize = [\n", "not valid TOML"),
        ('[[routes]]\nhost = "a"\n', "each route needs host and either origin or servers"),
    ],
)
def test_bad_file_value_is_one_line_naming_key_value_and_expectation(tmp_path, toml, message):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load(path, env={}, overrides=ORIGIN)
    assert message in str(info.value) and "\n" not in str(info.value)
    if "[" in toml and "routes" not in toml and "TOML" not in message:
        assert str(path) in str(info.value)


def test_workers_come_from_the_file_the_environment_or_auto(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text("[server]\nworkers = 3\n")
    assert load(path, env={}, overrides=ORIGIN).server.workers == 3
    assert load(env={"ONEHIT_SERVER_WORKERS": "2"}, overrides=ORIGIN).server.workers == 2
    auto = load(env={}, overrides={**ORIGIN, "server.workers": "auto"}).server.workers
    assert auto == len(os.sched_getaffinity(0))


def test_bad_env_value_names_the_variable():
    with pytest.raises(
        ConfigError, match=r"ONEHIT_UPSTREAM_READ_TIMEOUT: \[upstream\] read_timeout"
    ):
        load(env={"ONEHIT_UPSTREAM_READ_TIMEOUT": "soon"}, overrides=ORIGIN)
    with pytest.raises(ConfigError, match="did you mean ONEHIT_CACHE_SIZE"):
        load(env={"ONEHIT_CACHE_SIZ": "1MiB"}, overrides=ORIGIN)


def test_whole_config_checks():
    with pytest.raises(ConfigError, match=r"\[cache\] size = 1000: too small to hold an entry"):
        load(env={}, overrides={**ORIGIN, "cache.size": "1000"})
    disk = {"disk.path": "/tmp/d", "disk.size": "1MiB", "disk.region_size": "1MiB"}
    with pytest.raises(
        ConfigError,
        match=r"\[disk\] size = 1048576: too small for \[disk\] "
        r"region_size = 1048576 .*set \[disk\] size to 2097152 bytes or more",
    ):
        load(env={}, overrides={**ORIGIN, **disk})
    with pytest.raises(ConfigError, match="no origin"):
        load(env={})
    with pytest.raises(ConfigError, match="not loopback: expected \\[admin\\] token"):
        load(env={}, overrides={**ORIGIN, "admin.listen": "0.0.0.0:9901"})
    open_admin = load(
        env={}, overrides={**ORIGIN, "admin.listen": "0.0.0.0:9901", "admin.token": "t"}
    )
    assert open_admin.admin.listen == ("0.0.0.0", 9901) and open_admin.admin.token == "t"
    with pytest.raises(ConfigError, match="max_object_size"):
        load(env={}, overrides={**ORIGIN, "cache.size": "1MiB", "cache.max_object_size": "2MiB"})
    with pytest.raises(ConfigError, match="generations"):
        load(env={}, overrides={**ORIGIN, "admission.generations": 1})


def test_forward_headers_from_a_list_or_a_comma_separated_string(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text('[server]\nforward_headers = ["Accept", "X-Tenant"]\n')
    assert load(path, env={}, overrides=ORIGIN).server.forward_headers == ("accept", "x-tenant")
    env = {"ONEHIT_SERVER_FORWARD_HEADERS": "accept, user-agent"}
    assert load(env=env, overrides=ORIGIN).server.forward_headers == ("accept", "user-agent")
    with pytest.raises(ConfigError, match=r"FORWARD_HEADERS.*non-empty list of header names"):
        load(env={"ONEHIT_SERVER_FORWARD_HEADERS": "bad header"}, overrides=ORIGIN)
    assert load(env={}, overrides=ORIGIN).server.forward_headers == ("*",)


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"ONEHIT_SERVER_FORWARD_HEADERS": ""}, "forward_headers"),
        ({"ONEHIT_SERVER_DENY_HEADERS": ""}, "deny_headers"),
        ({"ONEHIT_SERVER_DENY_HEADERS": "x-original-url,,x-host"}, "deny_headers"),
        ({"ONEHIT_SERVER_DENY_HEADERS": "x original"}, "deny_headers"),
    ],
)
def test_an_empty_or_malformed_header_list_is_an_error_naming_the_key(env, key):
    with pytest.raises(ConfigError, match=rf"\[server\] {key} = .*expected"):
        load(env=env, overrides=ORIGIN)


def test_an_empty_header_list_in_a_file_is_an_error(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text("[server]\nforward_headers = []\n")
    with pytest.raises(ConfigError, match=r"f.toml: \[server\] forward_headers = \[\]"):
        load(path, env={}, overrides=ORIGIN)


def test_a_small_cache_without_max_object_size_stores_objects_up_to_its_size():
    c = load(env={}, overrides={**ORIGIN, "cache.size": "1MiB"})
    assert c.cache.max_object_size == 1 << 20
    assert load(env={}, overrides=ORIGIN).cache.max_object_size == 16 << 20


def test_the_example_site_loads_and_each_of_its_workers_would_start():
    """config/examples/site.toml (docs/operations.md's worked example) holds what it says:
    routes, TLS, a disk tier, workers and TTL rules, judged as --check-config judges them
    (but the certificate's files, which name a real site's)."""
    from pathlib import Path

    from proxy.config.settings import load
    from proxy.ops.shared_tier import check_workers

    path = Path(__file__).resolve().parent.parent / "config/examples/site.toml"
    config = load(path, env={})
    assert [r.host for r in config.routes] == ["www.example.com", "static.example.com"]
    assert config.server.tls_cert and config.disk.path and len(config.ttl) == 3
    for workers in (2, 16, 64):
        check_workers(config, workers)
