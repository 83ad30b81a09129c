"""Issue 41, item 6: an agent CLI's first prompt works with its default config. Codex CLI
sends a hosted `web_search` tool, which only OpenAI runs; Corral answered 400 and its user
had to edit Codex's config first. As llama-server does since ggml-org/llama.cpp PR #23041
(issue #20156), the tools Corral cannot run are left out and the rest served: said once in
the log per type, and in `x-corral-skipped-tools` on each answer; `[server] hosted_tools =
"refuse"` keeps the 400. Anthropic's server tools go the same way. Through the real app and
supervisor (fake workers)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

import httpx

from supervisor.config import parse
from supervisor.supervisor import Supervisor
from tests.harness import config_text, write_gguf
from tests.process.support import WORKER_COMMAND, serving_http

FN = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
CODEX_TOOLS: list[dict[str, Any]] = [
    FN,
    {"type": "web_search", "external_web_access": False},
    {"type": "namespace", "name": "agents", "tools": [{**FN, "name": "spawn"}, {"type": "image_generation"}]},
]
CLAUDE_TOOLS: list[dict[str, Any]] = [
    {"name": "Read", "input_schema": {"type": "object", "properties": {}}},
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
]


def _supervisor(tmp_path: Path, **server: object) -> Supervisor:
    write_gguf(tmp_path / "dummy.gguf")
    models = {"a": {"tool_format": "generic"}}  # the fake model's template cannot take tools
    return Supervisor(parse(config_text(models, server), tmp_path), worker_command=WORKER_COMMAND)


async def test_hosted_tools_are_left_out_and_said_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sup = _supervisor(tmp_path)
    caplog.set_level(logging.WARNING, logger="corral.router")
    with trio.fail_after(30):
        async with serving_http(sup) as base, httpx.AsyncClient(base_url=base, timeout=10) as client:
            for _ in range(2):  # an agent sends the same tools every turn
                r = await client.post("/v1/responses", json={"model": "a", "input": "hi", "tools": CODEX_TOOLS, "max_output_tokens": 2})
                assert r.status_code == 200, r.text
                assert r.headers["x-corral-skipped-tools"] == "web_search, image_generation"
                body = r.json()
                # The answer's `tools` are the tools the model was offered.
                assert [t["type"] for t in body["tools"]] == ["function", "namespace"]
                assert [t["name"] for t in body["tools"][1]["tools"]] == ["spawn"]
            r = await client.post("/v1/responses", json={"model": "a", "input": "hi", "tools": CODEX_TOOLS, "stream": True, "max_output_tokens": 2})
            assert r.status_code == 200 and r.headers["x-corral-skipped-tools"] == "web_search, image_generation"
            assert "event: response.incomplete" in r.text  # cut at max_output_tokens, as asked
            r = await client.post("/v1/responses/input_tokens", json={"model": "a", "input": "hi", "tools": CODEX_TOOLS})
            assert r.status_code == 200 and r.headers["x-corral-skipped-tools"] == "web_search, image_generation"
            for path in ("/v1/messages", "/v1/messages/count_tokens"):
                r = await client.post(path, json={"model": "a", "max_tokens": 2, "tools": CLAUDE_TOOLS, "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200, r.text
                assert r.headers["x-corral-skipped-tools"] == "web_search_20250305"
            # A request with nothing left out says nothing.
            r = await client.post("/v1/responses", json={"model": "a", "input": "hi", "tools": [FN], "max_output_tokens": 2})
            assert r.status_code == 200 and "x-corral-skipped-tools" not in r.headers
            # Forcing a tool that was left out is still the client's mistake.
            r = await client.post("/v1/responses", json={"model": "a", "input": "hi", "tools": CODEX_TOOLS, "tool_choice": {"type": "web_search"}})
            assert r.status_code == 400 and (r.json())["error"]["param"] == "tool_choice"
    said = [rec.getMessage() for rec in caplog.records if "not served by Corral" in rec.getMessage()]
    assert len(said) == 3, said  # once per type and API, however many requests
    assert any("'web_search'" in line and line.startswith("Responses") for line in said)
    assert any("'web_search_20250305'" in line and line.startswith("Anthropic") for line in said)


async def test_refuse_keeps_the_400_naming_the_tool(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, hosted_tools="refuse")
    with trio.fail_after(30):
        async with serving_http(sup) as base, httpx.AsyncClient(base_url=base, timeout=10) as client:
            r = await client.post("/v1/responses", json={"model": "a", "input": "hi", "tools": CODEX_TOOLS})
            assert r.status_code == 400
            error = (r.json())["error"]
            assert error["param"] == "tools[1].type" and "'web_search'" in error["message"]
            r = await client.post("/v1/messages", json={"model": "a", "max_tokens": 2, "tools": CLAUDE_TOOLS, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 400
            error = (r.json())["error"]
            assert error["type"] == "invalid_request_error" and "tools[1]" in error["message"]


async def test_a_hostile_tool_type_is_neither_a_5xx_nor_a_flood(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A tool's `type` is the client's string: one holding a newline or any character must not
    break the header (werkzeug refuses a newline in a header value: a 500), and a thousand
    new types must not be a thousand log lines, nor a set that grows without end."""
    sup = _supervisor(tmp_path)
    caplog.set_level(logging.WARNING, logger="corral.router")
    with trio.fail_after(60):
        async with serving_http(sup) as base, httpx.AsyncClient(base_url=base, timeout=10) as client:
            for kind in ("web\r\nx-evil: 1", "ünïcödé ☃", "x" * 5000):
                r = await client.post("/v1/responses", json={"model": "a", "input": "hi", "tools": [FN, {"type": kind}], "max_output_tokens": 2})
                assert r.status_code == 200, r.text
                assert "x-evil" not in r.headers and r.headers["x-corral-skipped-tools"].isascii()
                assert len(r.headers["x-corral-skipped-tools"]) <= 100
            tools = [FN, *({"type": f"t{i}"} for i in range(1000))]
            r = await client.post("/v1/responses", json={"model": "a", "input": "hi", "tools": tools, "max_output_tokens": 2})
            assert r.status_code == 200 and len(r.headers["x-corral-skipped-tools"]) <= 1000
    said = [rec for rec in caplog.records if "not served by Corral" in rec.getMessage()]
    assert len(said) <= 70, len(said)
