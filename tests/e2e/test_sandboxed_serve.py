"""The real server and worker run under the seccomp filters examples/corral.service asks for:
SystemCallFilter=@system-service ~@privileged, MemoryDenyWriteExecute=yes and
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 (tests/e2e/syscall_sandbox.py).

MemoryDenyWriteExecute is the one that could break a Python model server: anything that
JIT-compiles, or a ctypes callback whose libffi closure needs writable+executable memory
(llama-cpp-python installs a log callback at import). The requests below take every path
that loads native code: a model load with its progress callback, sampling, constrained
decoding (llguidance), streaming, and embeddings.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator

import openai
import pytest

from tests.e2e.conftest import Server, start_server, stop_server

SANDBOXED_CORRAL = (
    sys.executable, "-m", "tests.e2e.syscall_sandbox", "--", sys.executable, "-m", "corral",
)
CONFIG = """
[server]
port = {PORT}

[models.chat]
path = "{MODEL}"
slots = 2
n_ctx = 1024
chat_template = "gemma"

[models.embed]
path = "{MODEL}"
embeddings = true
slots = 2
n_ctx = 512
"""


@pytest.fixture(scope="module")
def sandboxed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("sandboxed"), CONFIG, command=SANDBOXED_CORRAL)
    yield srv
    # A worker killed by SIGSYS or a failed mmap shows up as a failed request above; the
    # server itself must also shut down cleanly under the filters.
    assert stop_server(srv) == 0, srv.log_text()


def test_the_filters_are_in_force(sandboxed: Server) -> None:
    # Seccomp mode 2 (filter) on the server and on each worker it spawned.
    client = openai.OpenAI(base_url=sandboxed.base, api_key="x", max_retries=0)
    client.completions.create(model="chat", prompt="Hi", max_tokens=1)
    pids = [sandboxed.process.pid, *sandboxed.workers().values()]
    assert len(pids) == 2, sandboxed.workers()
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        assert "\nSeccomp:\t2\n" in status, (pid, status)
        assert "\nNoNewPrivs:\t1\n" in status, (pid, status)


def test_generation_constrained_streaming_and_embeddings_work(sandboxed: Server) -> None:
    client = openai.OpenAI(base_url=sandboxed.base, api_key="x", max_retries=0)
    chat = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
    )
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens > 0

    schema = {
        "type": "object",
        "properties": {"n": {"const": 7}},
        "required": ["n"],
        "additionalProperties": False,
    }
    forced = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "Write a poem."}],
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        temperature=1.0,
        max_tokens=32,
    )
    assert json.loads(forced.choices[0].message.content or "") == {"n": 7}

    pieces = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Count."}], max_tokens=8, stream=True
        )
        if c.choices
    ]
    assert "".join(pieces)

    vectors = client.embeddings.create(model="embed", input=["one", "two"])
    assert [len(v.embedding) > 0 for v in vectors.data] == [True, True]
    # Nothing in the log says a call was refused.
    assert "Operation not permitted" not in sandboxed.log_text(), sandboxed.log_text()
