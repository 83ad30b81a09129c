"""Several listen addresses (issue 22, item 5): `host = ["127.0.0.1", "::1"]`, as
llama-server's `--host 127.0.0.1,::1` (llama.cpp's test_basic.py,
test_server_multiple_addresses): every address answers, with the same keys."""

from __future__ import annotations

import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from corral.serve import serve
from supervisor.config import ConfigError, parse
from tests.harness import config_text, write_gguf
from tests.process.support import WORKER_COMMAND
from tests.secrets import secret


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback to listen on")
async def test_every_listed_address_answers(tmp_path: Path) -> None:
    key = secret("listen")
    write_gguf(tmp_path / "dummy.gguf")
    port = _free_port()
    text = config_text({"a": {}}, {"host": ["127.0.0.1", "::1"], "port": port, "api_keys": [key]})
    cfg = parse(text, tmp_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, cfg, worker_command=WORKER_COMMAND))
            assert len(binds) == 2
            for base in (f"http://127.0.0.1:{port}", f"http://[::1]:{port}"):
                async with httpx.AsyncClient(base_url=base, timeout=10) as c:
                    assert (await c.get("/health")).status_code == 200
                    assert (await c.post("/v1/completions", json={})).status_code == 401
                    r = await c.post(
                        "/v1/completions", json={"model": "a", "prompt": "x", "max_tokens": 2},
                        headers={"authorization": f"Bearer {key}"},
                    )
                    assert r.status_code == 200, r.text
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ([], "server.host: give at least one address"),
        (["127.0.0.1", "127.0.0.1"], "server.host: an address is listed twice"),
        (["127.0.0.1", "a b"], "server.host[1]: 'a b' is not an address or a host name"),
    ],
)
def test_a_host_list_is_checked(tmp_path: Path, host: list[str], problem: str) -> None:
    write_gguf(tmp_path / "dummy.gguf")
    with pytest.raises(ConfigError) as exc:
        parse(config_text({"a": {}}, {"host": host}), tmp_path)
    assert exc.value.problems == [problem]


def test_every_listed_address_must_be_safe_without_a_key(tmp_path: Path) -> None:
    """A loopback address first does not make a public one after it safe."""
    write_gguf(tmp_path / "dummy.gguf")
    path = tmp_path / "config.toml"
    path.write_text(config_text({"a": {}}, {"host": ["127.0.0.1", "0.0.0.0"], "port": 1}))
    done = subprocess.run(
        [sys.executable, "-m", "corral", "serve", "--config", str(path)], capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    assert "refusing to serve on '0.0.0.0' with no API key" in done.stderr
