"""Overload through the real server (hypercorn on a socket, fake workers): a bounded line
for a model's slots, 429 with Retry-After past it, 503 past queue_timeout, and the openai
client's own retries getting every answer once the load falls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio

from supervisor.lifecycle import State
from supervisor.supervisor import Supervisor
from tests.harness import make_config
from tests.process.support import WORKER_COMMAND, serving_http

CHAT = {"model": "one", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


def _supervisor(tmp_path: Path, **model: object) -> Supervisor:
    cfg = make_config(tmp_path, {"one": {"slots": 1, **model}})
    return Supervisor(cfg, worker_command=WORKER_COMMAND)


async def _burst(base: str, n: int, body: dict[str, Any]) -> list[httpx.Response]:
    """n requests sent at once, each on its own connection."""
    replies: list[httpx.Response] = []

    async def one(c: httpx.AsyncClient) -> None:
        replies.append(await c.post("/v1/chat/completions", json=body))

    async with httpx.AsyncClient(base_url=base, timeout=30, limits=httpx.Limits(max_connections=n)) as c:
        await c.get("/v1/models")
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one, c)
    return replies


async def _post(c: httpx.AsyncClient, body: dict[str, Any]) -> None:
    r = await c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200


async def test_a_one_slot_model_with_max_queue_2_serves_3_of_8_and_refuses_5(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")  # 10 tokens: half a second a request
    sup = _supervisor(tmp_path, max_queue=2, preload=True)
    with trio.fail_after(60):
        async with serving_http(sup) as base:
            await sup.handles["one"].wait_for_state(State.READY)
            replies = await _burst(base, 8, CHAT)
            statuses = sorted(r.status_code for r in replies)
            assert statuses == [200] * 3 + [429] * 5
            for r in replies:
                if r.status_code == 429:
                    error = r.json()["error"]
                    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
                    assert "max_queue = 2" in error["message"]
                    assert int(r.headers["retry-after"]) >= 1 and int(r.headers["retry-after-ms"]) >= 1
                else:
                    assert r.json()["choices"][0]["message"]["content"]
            # Refused clients are told successive times, not one time for all.
            told = sorted(int(r.headers["retry-after-ms"]) for r in replies if r.status_code == 429)
            assert len(set(told)) == 5
            assert sup.handles["one"].slot_queue.busy == 0 and sup.handles["one"].slot_queue.waiting == 0


async def test_the_openai_client_retries_until_all_8_are_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")
    sup = _supervisor(tmp_path, max_queue=2, preload=True)
    with trio.fail_after(90):
        async with serving_http(sup) as base:
            await sup.handles["one"].wait_for_state(State.READY)
            statuses: list[int] = []

            async def seen(response: httpx.Response) -> None:
                statuses.append(response.status_code)

            client = openai.AsyncOpenAI(  # its default retries: 2
                base_url=f"{base}/v1", api_key="unused",
                http_client=httpx.AsyncClient(event_hooks={"response": [seen]}),
            )
            assert client.max_retries == 2
            answers: list[str] = []

            async def ask() -> None:
                r = await client.chat.completions.create(model="one", messages=CHAT["messages"], max_tokens=10)
                answers.append(r.choices[0].message.content or "")

            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(ask)
            assert len(answers) == 8 and all(answers)
            assert statuses.count(429) >= 5 and statuses.count(200) == 8  # refused, then served
            await client.close()


async def test_past_queue_timeout_a_request_gets_503_with_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "10")  # 30 tokens: 3 s
    sup = _supervisor(tmp_path, queue_timeout=0.5, preload=True)
    with trio.fail_after(60):
        async with serving_http(sup) as base:
            await sup.handles["one"].wait_for_state(State.READY)
            replies = await _burst(base, 2, {**CHAT, "max_tokens": 30})
            statuses = sorted(r.status_code for r in replies)
            assert statuses == [200, 503]
            late = next(r for r in replies if r.status_code == 503)
            assert "queue_timeout = 0.5s" in late.json()["error"]["message"]
            assert late.headers["x-should-retry"] == "true" and int(late.headers["retry-after"]) >= 1


async def test_a_streamed_request_waits_its_turn_and_a_client_that_leaves_frees_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")
    sup = _supervisor(tmp_path, max_queue=1, preload=True)
    queue = sup.handles["one"].slot_queue
    with trio.fail_after(60):
        async with serving_http(sup) as base:
            await sup.handles["one"].wait_for_state(State.READY)
            async with httpx.AsyncClient(base_url=base, timeout=30) as c:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_post, c, {**CHAT, "max_tokens": 40})
                    while queue.busy == 0:
                        await trio.sleep(0.01)
                    shown = ""
                    with trio.move_on_after(1.0):  # waits in line, then gives up
                        async with trio.open_nursery() as inner:
                            inner.start_soon(_post, c, {**CHAT, "stream": True})
                            # /admin/models and /metrics show it in line.
                            while (await c.get("/admin/models")).json()["models"][0]["waiting"] != 1:
                                await trio.sleep(0.01)
                            shown = (await c.get("/metrics")).text
                            await trio.sleep_forever()
                    assert 'corral_model_waiting{model="one"} 1.0' in shown
                    while queue.waiting:
                        await trio.sleep(0.01)
                    # Its place is free again: the next one waits rather than being refused.
                    r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
                    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
            assert queue.busy == 0 and queue.waiting == 0
