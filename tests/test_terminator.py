"""The terminator example of docs/operations.md, run as it is: haproxy (deploy/haproxy/
onehit.cfg) ends TLS and HTTP/2 in front of onehit and names each client in a PROXY v2
header; onehit answers, caches and logs by the client's address. Needs haproxy and curl."""

import asyncio
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import trustme
from conftest import until

from loadgen.live.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
HAPROXY, CURL = shutil.which("haproxy"), shutil.which("curl")

pytestmark = [
    pytest.mark.skipif(HAPROXY is None or CURL is None, reason="needs haproxy and curl"),
    pytest.mark.slow,
]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_haproxy_in_front_speaks_http2_and_onehit_sees_each_client(
    origin, start_proxy, tmp_path
):
    origin.set("/t", body=b"through haproxy")
    log = tmp_path / "access.log"
    service = await start_proxy(server__proxy_protocol=True, server__access_log=True,
                                server__access_log_format="json",
                                server__access_log_file=str(log))  # fmt: skip
    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1")
    pem = tmp_path / "site.pem"
    pem.write_bytes(b"".join(p.bytes() for p in issued.cert_chain_pems)
                    + issued.private_key_pem.bytes())  # fmt: skip
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    https = free_port()
    host, port = service.proxy_address
    env = {**os.environ, "HTTPS_BIND": f"127.0.0.1:{https}", "TLS_PEM": str(pem),
           "ONEHIT_ADDR": f"{host}:{port}"}  # fmt: skip
    haproxy = await asyncio.create_subprocess_exec(
        HAPROXY, "-f", str(ROOT / "deploy/haproxy/onehit.cfg"), "-db", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await until(lambda: _listening(https))
        answers = []
        for _ in range(3):
            out = await asyncio.to_thread(
                subprocess.run,
                [CURL, "-s", "--http2", "--cacert", str(tmp_path / "ca.pem"),
                 "--interface", "127.0.0.2", "-H", "Host: example.test", "-D", "-",
                 "-w", "\\nversion=%{http_version}", f"https://127.0.0.1:{https}/t"],
                capture_output=True, text=True, timeout=20,
            )  # fmt: skip
            answers.append(out.stdout)
        assert all(a.endswith("version=2") and "through haproxy" in a for a in answers), answers
        assert "x-cache: HIT" in answers[2]
        assert origin.seen_headers["/t"]["X-Forwarded-For"] == "127.0.0.2"
        await until(lambda: len(log.read_text().splitlines()) >= 2)
        clients = {json.loads(line)["client"] for line in log.read_text().splitlines()}
        assert clients == {"127.0.0.2"}  # not haproxy's address: the client it named
    finally:
        haproxy.terminate()
        await asyncio.wait_for(haproxy.wait(), 15)
