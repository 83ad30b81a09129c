"""A client that leaves mid-stream: the tokens generated until then are counted, in the
access log line and in corral_generation_tokens_total, for a local worker and for an
upstream reached through translation (issue 40, finding 7: the line said generated=0 and
the counter missed them, while the admin view's tokens_generated had them)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from supervisor.supervisor import Supervisor
from tests.harness import make_config
from tests.process.support import WORKER_COMMAND, serving_http
from tests.process.test_request_metrics import _samples, _value
from tests.process.test_upstream_relay import upstream_and_front
from tests.process.test_upstream_translation import ANTHROPIC, TABLES, OpenAIUpstream


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records if r.name == "corral.access"]  # type: ignore[attr-defined]


async def _line_of(caplog: pytest.LogCaptureFixture, request_id: str) -> dict[str, Any]:
    with trio.fail_after(10):
        while not (found := [f for f in _lines(caplog) if f["request_id"] == request_id]):
            await trio.sleep(0.02)
    return found[0]


async def test_a_stream_the_client_leaves_counts_the_tokens_its_worker_generated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "40")
    caplog.set_level(logging.INFO, logger="corral.access")
    sup = Supervisor(make_config(tmp_path, {"a": {}}), worker_command=WORKER_COMMAND)
    body = {"model": "a", "messages": [{"role": "user", "content": "four words of prompt"}], "stream": True,
            "max_tokens": 400}
    with trio.fail_after(60):
        async with serving_http(sup) as base:
            async with httpx.AsyncClient(base_url=base, timeout=10) as c:
                seen = 0
                async with c.stream("POST", "/v1/chat/completions", json=body, headers={"x-request-id": "leaver"}) as r:
                    async for line in r.aiter_lines():
                        seen += '"content":"' in line and '"content":""' not in line
                        if seen == 6:
                            break  # six tokens read, then gone
                left = await _line_of(caplog, "leaver")
                metrics = _samples((await c.get("/metrics")).text)
                (model,) = (await c.get("/admin/models")).json()["models"]
    assert left["client_gone"] and left["status"] == 200
    # Everything the client read was generated, and no more than the worker made.
    assert 6 <= left["generated_tokens"] <= model["tokens_generated"], (left, model["tokens_generated"])
    assert left["prompt_tokens"] == 5  # four words and BOS, though no choice finished
    assert _value(metrics, "corral_generation_tokens_total", model="a") == left["generated_tokens"]
    assert _value(metrics, "corral_prompt_tokens_total", model="a") == 5


async def test_a_translated_stream_the_client_leaves_counts_what_its_upstream_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The upstream's usage comes at its stream's end, which a client that left never
    reaches: each chunk that carried output counts a token (OpenAI-compatible servers
    stream one a chunk)."""
    caplog.set_level(logging.INFO, logger="corral.access")
    body = {"model": "slow", "max_tokens": 500, "stream": True, "messages": [{"role": "user", "content": "Go"}]}
    with trio.fail_after(60):
        async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (fake, front):
            async with httpx.AsyncClient(timeout=10, headers={**ANTHROPIC, "x-request-id": "leaver"}) as c:
                seen = 0
                async with c.stream("POST", front + "/v1/messages", json=body) as r:
                    async for line in r.aiter_lines():
                        seen += line.startswith("data:") and '"text_delta"' in line
                        if seen == 6:
                            break
                with trio.fail_after(5):
                    await fake.gone.wait()
                left = await _line_of(caplog, "leaver")
                metrics = _samples((await c.get(front + "/metrics")).text)
    assert left["client_gone"] and left["status"] == 200 and left["upstream"]
    assert 6 <= left["generated_tokens"] < 200, left
    assert _value(metrics, "corral_generation_tokens_total", model="slow") == left["generated_tokens"]
