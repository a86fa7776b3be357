"""aiohttp's internals the proxy relies on, named one by one: all of them live in
``proxy/wire/seam.py``, and each is checked against the installed aiohttp, so an upgrade that
moves one fails here, saying which, before it fails a request."""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
from pathlib import Path

import pytest
from aiohttp import StreamReader, web
from aiohttp.http import StreamWriter
from conftest import until

from proxy.wire.seam import FlowControl

ROOT = Path(__file__).resolve().parent.parent
SEAM = "proxy.wire.seam"

# aiohttp's public API: what any module may import from it (``aiohttp.http`` exports its
# parsers and writer by name).
PUBLIC = {"aiohttp", "aiohttp.web", "aiohttp.abc", "aiohttp.http"}

# Each private name of aiohttp's the seam overrides, reads or sets: (class, name).
OVERRIDDEN = [
    (StreamWriter, "_headers_buf"),
    (StreamWriter, "_headers_written"),
    (web.Server, "_make_request"),
    (web.Server, "_kwargs"),
    (web.Server, "_loop"),
    (web.RequestHandler, "_loop"),
    (web.RequestHandler, "_paused"),
    (web.StreamResponse, "_prepare_headers"),
    (web.StreamResponse, "_send_headers_immediately"),
    (web.Response, "_body"),
    (web.RequestHandler, "handle_error"),
    (web.BaseRequest, "_prepare_hook"),
    (web.BaseRequest, "ATTRS"),
    (web.BaseSite, "_runner"),
    (web.BaseSite, "_ssl_context"),
    (web.BaseSite, "_backlog"),
    (web.BaseSite, "_server"),
    (web.TCPSite, "_host"),
    (web.TCPSite, "_port"),
    (web.TCPSite, "_reuse_address"),
    (web.TCPSite, "_reuse_port"),
    (web.TCPSite, "_bound_port"),
]

# The parameters of each aiohttp method the seam overrides (all of them, in order) or calls
# (those it passes, in order among the others): a change in them breaks a request without
# removing a name. (class, method, parameters' names, whether overridden)
SIGNATURES = [
    (web.Server, "_make_request", ("self", "message", "payload", "protocol", "writer", "task"),
     True),
    (web.Server, "__call__", ("self",), True),
    (web.StreamResponse, "_prepare_headers", ("self",), True),
    (web.RequestHandler, "handle_error", ("self", "request", "status", "exc", "message"), True),
    (StreamWriter, "write", ("self", "chunk", "drain", "LIMIT"), True),
    (StreamWriter, "write_eof", ("self", "chunk"), True),
    (StreamWriter, "write_headers", ("self", "status_line", "headers"), True),
    (web.RequestHandler, "__init__", ("self", "manager", "loop"), False),
    (StreamWriter, "__init__", ("self", "protocol", "loop"), False),
    (web.BaseRequest, "__init__", ("self", "message", "payload", "protocol", "payload_writer",
                                   "task", "loop"), False),
    (web.BaseRequest, "clone", ("self", "remote"), False),
    (web.BaseRequest, "_prepare_hook", ("self", "response"), True),
]  # fmt: skip

# Public names, but newer than some aiohttp releases: the front frees the request parser's
# slot for the next message (3.14's ``message_consumed``; 3.13 has none, so the pin starts at
# 3.14).
RECENT = [
    ("aiohttp.http", "HttpRequestParser", "message_consumed"),
    # The origin connections pause a response's parser with its stream, and feed it b"" to
    # go on with what it held back (proxy/origin/connection.py).
    ("aiohttp.http", "HttpResponseParser", "pause_reading"),
]

# What aiohttp's own code reads of the objects the proxy gives it: (module, the text it must
# still hold). A protocol the writer and streams drive (``FlowControl``), a request its
# responses prepare for (``AnsweredRequest``).
READ_OF_OURS = [
    ("aiohttp.http_writer", "protocol._paused"),
    ("aiohttp.http_writer", "protocol._drain_helper()"),
    ("aiohttp.http_writer", "self._protocol.transport"),
    ("aiohttp.streams", "self._protocol._reading_paused"),
    ("aiohttp.streams", "self._protocol.pause_reading()"),
    ("aiohttp.streams", "self._protocol.resume_reading(resume_parser=False)"),
    ("aiohttp.streams", "self._protocol.resume_reading()"),
    ("aiohttp.streams", "self._protocol.connected"),
    ("aiohttp.web_response", "request._payload_writer"),
    ("aiohttp.web_response", "request._prepare_hook(self)"),
]

NAMES = {name for _, name in OVERRIDDEN} | {"_drain_helper", "_reading_paused", "_payload_writer",
                                            "_prepare_hook"}  # fmt: skip
# Names the proxy's own classes use for their own attributes too, or public ones.
NAMES -= {"_loop", "_body", "handle_error", "_server"}


def _modules() -> dict[str, ast.Module]:
    return {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): ast.parse(p.read_text())
        for p in (ROOT / "proxy").rglob("*.py")
    }


def test_only_the_seam_imports_past_aiohttps_public_api():
    wrong = {}
    for module, tree in _modules().items():
        if module == SEAM:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiohttp"):
                if node.module not in PUBLIC:
                    wrong[module] = node.module
            elif isinstance(node, ast.Import):
                wrong.update(
                    (module, a.name)
                    for a in node.names
                    if a.name.startswith("aiohttp") and a.name not in PUBLIC
                )
    assert not wrong, wrong


def test_only_the_seam_names_an_aiohttp_internal():
    wrong = sorted(
        f"{module}: {node.attr}"
        for module, tree in _modules().items()
        if module != SEAM
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in NAMES
    )
    assert not wrong, wrong


def test_a_name_planted_outside_the_seam_is_caught():
    tree = ast.parse("request._payload_writer.write(b'')")
    assert {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & NAMES


def _instance_attributes(cls: type) -> set[str]:
    """The attributes ``cls.__init__`` (or its bases') sets on an instance."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            tree = ast.parse(inspect.getsource(init).strip())
        except (OSError, TypeError, SyntaxError):
            continue
        names.update(
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        )
    return names


@pytest.mark.parametrize(("cls", "name"), OVERRIDDEN, ids=lambda x: getattr(x, "__name__", x))
def test_each_internal_the_seam_overrides_or_reads_is_in_the_installed_aiohttp(cls, name):
    slots = {s for klass in cls.__mro__ for s in getattr(klass, "__slots__", ())}
    assert hasattr(cls, name) or name in slots or name in _instance_attributes(cls), (
        f"aiohttp {cls.__module__}.{cls.__name__} has no {name}: proxy/wire/seam.py relies on it"
    )


@pytest.mark.parametrize(("cls", "name", "parameters", "overridden"), SIGNATURES,
                         ids=lambda x: getattr(x, "__name__", None))  # fmt: skip
def test_each_method_the_seam_overrides_or_calls_keeps_its_parameters(
    cls, name, parameters, overridden
):
    found = tuple(inspect.signature(getattr(cls, name)).parameters)
    kept = found if overridden else tuple(p for p in found if p in parameters)
    assert kept == parameters, (
        f"aiohttp {cls.__name__}.{name}{found}: proxy/wire/seam.py relies on {parameters}"
    )


@pytest.mark.parametrize(("module", "cls", "name"), RECENT)
def test_each_recent_public_name_the_proxy_calls_is_in_the_installed_aiohttp(module, cls, name):
    assert hasattr(getattr(importlib.import_module(module), cls), name), (
        f"{module}.{cls} has no {name}: proxy/front/fastpath.py calls it"
    )


@pytest.mark.parametrize(("module", "text"), READ_OF_OURS)
def test_aiohttp_still_reads_what_the_seam_provides_by_that_name(module, text):
    source = inspect.getsource(importlib.import_module(module))
    assert text in source, f"{module} no longer reads {text!r}: proxy/wire/seam.py provides it"


async def test_aiohttps_writer_waits_while_our_flow_control_pauses_writing():
    """A real connection whose peer reads nothing: the writer's drain waits on ``FlowControl``
    until the peer reads, then returns."""
    loop = asyncio.get_running_loop()
    peers: list[asyncio.StreamReader] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(reader)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    transport, protocol = await loop.create_connection(
        lambda: FlowControl(loop), *server.sockets[0].getsockname()[:2]
    )
    try:
        transport.set_write_buffer_limits(high=1 << 16)
        writer = StreamWriter(protocol, loop)
        size = 32 << 20  # more than the kernel's buffers on both ends take
        written = asyncio.ensure_future(writer.write(b"x" * size))
        await until(lambda: protocol.writing_paused and peers)
        assert not written.done()
        await peers[0].readexactly(size)
        await written
        assert not protocol.writing_paused
    finally:
        transport.close()
        server.close()
        await server.wait_closed()


async def test_aiohttps_stream_ends_on_our_flow_control_as_a_body_does():
    """``feed_eof`` resumes reading with aiohttp's own keyword: a body's end, through it."""
    loop = asyncio.get_running_loop()
    stream = StreamReader(FlowControl(loop), 1024, loop=loop)
    stream.feed_data(b"x" * 4096)
    stream.feed_eof()
    assert await stream.read() == b"x" * 4096 and stream.is_eof()


async def test_aiohttps_stream_pauses_our_flow_control_past_its_limit_and_resumes_it():
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    transport, protocol = await loop.create_connection(
        lambda: FlowControl(loop), *server.sockets[0].getsockname()[:2]
    )
    try:
        stream = StreamReader(protocol, 1024, loop=loop)
        stream.feed_data(b"x" * 4096)
        assert protocol.reading_paused
        assert await stream.read(4096) == b"x" * 4096
        assert not protocol.reading_paused
    finally:
        transport.close()
        server.close()
        await server.wait_closed()
