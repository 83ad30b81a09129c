"""A translated request whose upstream answers one whole JSON body (Ollama's /api/embed
reaching an OpenAI upstream's /v1/embeddings): a body broken off midway is the upstream's
failure (502), and a large one is read without holding up the event loop (found by the
outside probe of issue 40: a reset answered 500 ReadError; a 200 MB answer, appended a
chunk at a time into a new bytes each time, kept /health waiting for half a second)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.process.test_upstream_relay import request_body, upstream_and_front

N_INPUTS = 64
WIDTH = 20_000  # floats a vector: about 40 MB of JSON in all


class EmbeddingsUpstream:
    """/v1/embeddings: "cut" sends half its answer and drops the connection; "large"
    sends a whole ~40 MB answer in 64 KiB chunks."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = await request_body(scope, receive, send)
        if body is None:
            return
        asked = json.loads(body)
        vectors = [{"object": "embedding", "index": i, "embedding": [0.123456] * WIDTH} for i in range(len(asked["input"]))]
        answer = json.dumps({"object": "list", "data": vectors, "usage": {"prompt_tokens": 3, "total_tokens": 3}}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        if asked["model"] == "cut":
            await send({"type": "http.response.body", "body": answer[: len(answer) // 2], "more_body": True})
            raise RuntimeError("the upstream drops the connection mid-answer")
        for at in range(0, len(answer), 1 << 16):
            await send({"type": "http.response.body", "body": answer[at : at + (1 << 16)], "more_body": True})
        await send({"type": "http.response.body", "body": b""})


TABLES = """
[models.cut]
upstream = "{UP}"

[models.large]
upstream = "{UP}"
"""


async def test_a_whole_answer_broken_off_is_a_502_and_a_large_one_holds_nobody_up(tmp_path: Path) -> None:
    texts = [f"text {i}" for i in range(N_INPUTS)]
    async with upstream_and_front(tmp_path, TABLES, fake=EmbeddingsUpstream()) as (_, front):
        async with httpx.AsyncClient(base_url=front, timeout=120) as c:
            cut = await c.post("/api/embed", json={"model": "cut", "input": texts})
            assert cut.status_code == 502, cut.text
            assert "broke off" in cut.json()["error"]
            waits: list[float] = []
            large: list[httpx.Response] = []

            async def embed() -> None:
                large.append(await c.post("/api/embed", json={"model": "large", "input": texts}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(embed)
                while not large:
                    t0 = time.monotonic()
                    assert (await c.get("/health")).status_code == 200
                    waits.append(time.monotonic() - t0)
                    await trio.sleep(0.05)
    assert large[0].status_code == 200, large[0].text[:300]
    assert len(large[0].json()["embeddings"]) == N_INPUTS
    waits.sort()
    assert waits and waits[len(waits) // 2] < 0.1, waits  # the median /health while it read
