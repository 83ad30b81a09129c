"""What an upstream keeps stays apart per key of this server (the outside probe of issue 40):
relayed to a second Corral with no keys, key B continued key A's stored response by its
`previous_response_id`, unloaded its model with Ollama's `keep_alive: 0`, and read from
`cached_tokens` whether it had guessed A's prompt. Now, once keys are configured, an
ordinary key's Responses and Ollama requests are translated where the upstream speaks
OpenAI's API (their state, stored responses and lifetimes, stays in this server, the
key's own), and an upstream with `upstream_cache_salt` gets each key's cache scope as
`cache_salt` on every request, relayed or translated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from router.server.cache_scope import cache_scope
from supervisor.config.keys import Key, digest
from tests.process.test_upstream_translation import OpenAIUpstream
from tests.process.test_upstream_relay import upstream_and_front
from tests.secrets import secret

A, B, ADMIN = secret("per-key-a"), secret("per-key-b"), secret("per-key-admin")
EVERY = '["openai", "anthropic", "responses", "ollama", "llama"]'
TABLES = f"""
[models.talks]
upstream = "{{UP}}"
upstream_dialects = {EVERY}
upstream_cache_salt = true

[models.plain]
upstream = "{{UP}}"
upstream_model = "talks"
upstream_dialects = {EVERY}
"""
KEYS = f'api_keys = ["{A}", "{B}"]\nadmin_keys = ["{ADMIN}"]'
HI = [{"role": "user", "content": "Hi"}]


def _as(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _scope(key: str, salt: str | None = None) -> str:
    return cache_scope(Key(name="k", digest=digest(key)), salt)


async def test_an_ordinary_keys_stateful_requests_are_translated_and_every_request_carries_its_scope(tmp_path: Path) -> None:
    async with upstream_and_front(tmp_path, TABLES, server=KEYS, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(base_url=front, timeout=10) as c:

            async def sent(key: str, path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
                before = len(fake.seen)
                r = await c.post(path, json=body, headers=_as(key))
                assert r.status_code in (200, 403), (path, r.status_code, r.text)
                assert len(fake.seen) == before + 1, (path, r.text)
                return fake.seen[-1]

            responses = {"model": "talks", "input": "Hi", "max_output_tokens": 8}
            # An ordinary key's Responses request is translated: the front keeps its response.
            path, body = await sent(A, "/v1/responses", responses)
            assert path == "/v1/chat/completions" and body["cache_salt"] == _scope(A)
            # The admin's is relayed as it came (the upstream's state is an operator's).
            path, body = await sent(ADMIN, "/v1/responses", responses)
            assert path == "/v1/responses" and body["cache_salt"] == _scope(ADMIN)
            # Ollama's: translated, so that keep_alive is the front's to bound.
            path, body = await sent(B, "/api/chat", {"model": "talks", "messages": HI, "stream": False, "keep_alive": -1})
            assert path == "/v1/chat/completions" and body["cache_salt"] == _scope(B) and "keep_alive" not in body
            seen = len(fake.seen)
            unload = await c.post("/api/generate", json={"model": "talks", "prompt": "", "keep_alive": 0}, headers=_as(B))
            assert unload.status_code == 403 and len(fake.seen) == seen  # never reached the upstream
            # Relayed OpenAI requests carry the scope, a client's own salt folded in.
            chat = {"model": "talks", "messages": HI}
            assert (await sent(A, "/v1/chat/completions", chat))[1]["cache_salt"] == _scope(A)
            assert (await sent(B, "/v1/chat/completions", chat))[1]["cache_salt"] == _scope(B)
            salted = await sent(A, "/v1/chat/completions", {**chat, "cache_salt": "user-7"})
            assert salted[1]["cache_salt"] == _scope(A, "user-7") != _scope(A)
            # An upstream not known to take cache_salt gets none.
            assert "cache_salt" not in (await sent(A, "/v1/chat/completions", {**chat, "model": "plain"}))[1]
            # Anthropic's Messages API has no cache_salt: relayed as it came.
            path, body = await sent(A, "/v1/messages", {"model": "talks", "max_tokens": 8, "messages": HI})
            assert path == "/v1/messages" and "cache_salt" not in body


async def test_with_no_key_configured_everything_is_relayed_as_it_came(tmp_path: Path) -> None:
    async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(base_url=front, timeout=10) as c:
            await c.post("/v1/responses", json={"model": "talks", "input": "Hi"})
            await c.post("/v1/chat/completions", json={"model": "talks", "messages": HI})
    assert [p for p, _ in fake.seen] == ["/v1/responses", "/v1/chat/completions"]
    assert all("cache_salt" not in body for _, body in fake.seen)
