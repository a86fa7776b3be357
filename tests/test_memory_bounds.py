"""Memory bounds of the live proxy: a 1 GiB response streams through with bounded buffering."""

import asyncio
import sys
from pathlib import Path

import aiohttp
from aiohttp import web
from conftest import wait_healthy

from loadgen.experiment import free_port

GIB = 1 << 30
CHUNK = b"\x5a" * (1 << 20)


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def test_a_1gib_response_streams_through_with_rss_growth_under_64mib():
    async def huge(request: web.Request) -> web.StreamResponse:
        if request.path == "/small":
            return web.Response(body=CHUNK, headers={"Cache-Control": "max-age=60"})
        response = web.StreamResponse(headers={"Cache-Control": "max-age=60"})
        response.content_length = GIB
        await response.prepare(request)
        for _ in range(GIB // len(CHUNK)):
            await response.write(CHUNK)
        return response

    app = web.Application()
    app.router.add_get("/{tail:.*}", huge)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, origin_port = runner.addresses[0][:2]
    origin = f"http://{host}:{origin_port}"
    port, admin = free_port(), free_port()
    proxy = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "--origin", origin, "--listen", f"127.0.0.1:{port}",
        "--admin-listen", f"127.0.0.1:{admin}", "--admission", "always",
        "--set", "server.access_log=false", stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
            await wait_healthy(client, f"http://127.0.0.1:{admin}/healthz")
            async with client.get(f"http://127.0.0.1:{port}/small") as r:  # warm the code paths
                assert len(await r.read()) == len(CHUNK)
            before = peak_rss(proxy.pid)
            received = 0
            async with client.get(f"http://127.0.0.1:{port}/big") as r:
                assert r.headers["Cache-Status"] == "onehit; fwd=uri-miss; detail=too-large"
                async for chunk in r.content.iter_chunked(1 << 20):
                    received += len(chunk)
            growth = peak_rss(proxy.pid) - before
        assert received == GIB
        print(f"proxy peak RSS grew by {growth / (1 << 20):.1f} MiB for 1 GiB streamed")
        assert growth < 64 << 20, f"proxy peak RSS grew by {growth >> 20} MiB"
    finally:
        proxy.terminate()
        await proxy.wait()
        await runner.cleanup()
