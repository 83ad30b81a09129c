"""A real `corral serve` process with the demo GGUF, shared by the e2e tests.

The config has three entries backed by the same file: two chat models (one with an alias)
and one embedding model, which is the acceptance setup of the first issue. The demo model is
assembled by `make model` (part of `make test`); without it these tests fail, not skip.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import httpx
import httpx2
import openai
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODEL = Path(os.environ.get("CORRAL_DEMO_MODEL", ROOT / "models" / "gemma-3-270m-Q4_K_M.gguf"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def base(self) -> str:
        return self.url + "/v1"

    def workers(self) -> dict[str, int]:
        """Model name -> pid of each live worker process of this server."""
        out: dict[str, int] = {}
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                cmd = child.cmdline()
            except psutil.Error:
                continue
            if "worker" in cmd and "--spec" in cmd:
                spec = cmd[cmd.index("--spec") + 1]
                name = spec.split('"name":"', 1)[1].split('"', 1)[0]
                out[name] = child.pid
        return out

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


CHECKOUT_CORRAL = (sys.executable, "-m", "corral")


def die_with_the_tests() -> None:
    """In a server's process, before it execs: SIGTERM when the test process that started
    it dies (PR_SET_PDEATHSIG). A pytest that is killed or crashes runs no fixture's end,
    and its servers went on, reparented, each worker decoding for nobody: on a two-core
    machine that slowed every later run. Linux only; elsewhere a no-op."""
    if sys.platform != "linux":
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def start_server(
    tmp: Path, config_text: str, command: Sequence[str] = CHECKOUT_CORRAL, cwd: Path = ROOT
) -> Server:
    """Serve `config_text` ({MODEL}, {PORT} filled in) with `command` (the checkout's corral
    unless told; `serve --config FILE` is appended), run in `cwd`."""
    if not DEMO_MODEL.is_file():
        pytest.fail(f"demo model missing at {DEMO_MODEL}: run `make model` (make test does)")
    port = free_port()
    cfg = tmp / "config.toml"
    cfg.write_text(config_text.replace("{MODEL}", str(DEMO_MODEL)).replace("{PORT}", str(port)))
    log = tmp / "server.log"
    proc = subprocess.Popen(
        [*command, "serve", "--config", str(cfg)],
        cwd=cwd,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_the_tests,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"corral serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return Server(url, proc, log)
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    pytest.fail(f"corral serve did not become healthy:\n{log.read_text()}")


def pooled_briefly() -> openai.DefaultHttpxClient:
    """The HTTP client of a module's openai.OpenAI(max_retries=0): it lets an idle pooled
    connection go after 4 s. hypercorn closes one after 5 s (its keep_alive_timeout) and
    httpx keeps one as long, so a request sent on it just then is lost ("Server
    disconnected without sending a response"), which a client with retries sends again
    and a test without them failed on (test_tools' prefill request, after a lazy load made
    a 5.006 s gap). deploy/nginx and deploy/haproxy keep theirs under 5 s for the same reason."""
    return openai.DefaultHttpxClient(limits=httpx2.Limits(keepalive_expiry=4.0))


def stock_config() -> str:
    """examples/config.toml as shipped, with the demo model's path and a free port (its
    prompt cache folder goes to the test's, not the checkout's build/)."""
    text = (ROOT / "examples" / "config.toml").read_text()
    for pattern, new in (
        (r'(?m)^path = "\.\./models/gemma-3-270m-Q4_K_M\.gguf"$', 'path = "{MODEL}"'),
        (r"(?m)^port = 8080\b", "port = {PORT}"),
        (r'(?m)^prompt_cache_dir = "\.\./build/prompt-cache"$', 'prompt_cache_dir = "prompt-cache"'),
    ):
        text, n = re.subn(pattern, new, text)
        assert n >= 1, f"examples/config.toml no longer matches {pattern}"
    return text


@pytest.fixture(scope="session")
def stock_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`make serve`'s server: examples/config.toml, shared by every test that reads it as a
    new user would and changes nothing in it."""
    srv = start_server(tmp_path_factory.mktemp("stock"), stock_config())
    yield srv
    assert stop_server(srv) == 0


# What a worker logs when its KV check finds a slot whose cached tokens and KV cells
# disagree (worker/kv_cache.py): always a bug, so no e2e server may ever log it.
KV_INVARIANT_VIOLATED = "KV invariant violated"


def stop_server(server: Server) -> int:
    """Stop `server` (SIGTERM) and return its exit code; fails the test if any of its
    workers found its KV cache out of step with its slots while it ran."""
    server.process.send_signal(signal.SIGTERM)
    try:
        rc = server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise
    violations = [line for line in server.log_text().splitlines() if KV_INVARIANT_VIOLATED in line]
    assert not violations, "a worker's KV check found a slot out of step:\n" + "\n".join(violations[:5])
    return rc


THREE_MODELS = """
[server]
port = {PORT}

[supervisor]
idle_timeout = 0

[models.chat-a]
path = "{MODEL}"
aliases = ["a-alias"]
slots = 4
n_ctx = 2048
chat_template = "gemma"

[models.chat-b]
path = "{MODEL}"
slots = 2
n_ctx = 1024
chat_template = "gemma"

[models.embed]
path = "{MODEL}"
embeddings = true
slots = 4
n_ctx = 1024

"""

# The session server's models: the three, the demo model as a reranker (llama.cpp
# scores with its last token's state, as it has no classifier head: enough to test the
# rerank route's shapes, not its ranking), and as a per-token embedder (pooling "none",
# llama-server's native /embedding).
SESSION_MODELS = THREE_MODELS + """
[models.rank]
path = "{MODEL}"
embeddings = true
pooling = "rank"
slots = 2
n_ctx = 1024

[models.tokens]
path = "{MODEL}"
embeddings = true
pooling = "none"
slots = 2
n_ctx = 512
"""


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("corral"), SESSION_MODELS)
    yield srv
    stop_server(srv)


@pytest.fixture
def sdk_warnings_are_errors() -> Iterator[None]:
    """For tests of an official SDK against Corral: the SDKs warn when a field of an answer
    has the wrong type, which must fail the test. A socket some other test left for the
    garbage collector is not the test's, whenever it is collected."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", ResourceWarning)
        yield
