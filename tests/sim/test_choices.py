"""n > 1 choices and several prompts over HTTP: the real app and supervisor, the simulated
worker (each of a Generate's n choices gets the same words), the virtual clock. What the
router does with the worker's choice indexes: whole responses, streams, usage."""

from __future__ import annotations

import json
from pathlib import Path

from router.app import create_app
from tests import fake_answers
from tests.harness import running
from tests.sim.support import sim_supervisor

CHAT = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def sse_objects(body: bytes) -> list[dict[str, object]]:
    out = []
    for line in body.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


async def test_chat_with_n_answers_n_choices_and_counts_the_prompt_once(tmp_path: Path, autojump_clock: object) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.post("/v1/chat/completions", json={**CHAT, "n": 3})
        assert r.status_code == 200
        body = await r.get_json()
        assert [c["index"] for c in body["choices"]] == [0, 1, 2]
        assert all(c["message"]["content"] == "tok0 tok1" for c in body["choices"])
        # The prompt counts once, the choices' outputs (2 tokens each) are summed.
        assert body["usage"]["prompt_tokens"] == len(fake_answers.tokenize("hi"))
        assert body["usage"]["completion_tokens"] == 6


async def test_streamed_choices_each_carry_their_index_and_finish(tmp_path: Path, autojump_clock: object) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.post(
            "/v1/chat/completions",
            # One token each: Quart's test client holds at most 10 events unread.
            json={**CHAT, "n": 2, "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True}},
        )
        assert r.status_code == 200
        chunks = sse_objects(await r.get_data())
        text: dict[int, str] = {0: "", 1: ""}
        finished = []
        for c in chunks:
            for choice in c["choices"]:  # type: ignore[attr-defined]
                text[choice["index"]] += choice["delta"].get("content") or ""
                if choice["finish_reason"]:
                    finished.append(choice["index"])
        assert text == {0: "tok0", 1: "tok0"}
        assert sorted(finished) == [0, 1]
        assert chunks[-1]["usage"]["completion_tokens"] == 2  # type: ignore[index]


async def test_several_prompts_give_n_choices_each_indexed_by_prompt(tmp_path: Path, autojump_clock: object) -> None:
    """OpenAI's order: choice index = prompt index * n + j."""
    sup, _ = sim_supervisor(tmp_path, {"a": {}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.post(
            "/v1/completions",
            json={"model": "a", "prompt": ["x", [5, 6, 7]], "n": 2, "max_tokens": 2, "echo": True},
        )
        assert r.status_code == 200, await r.get_data()
        body = await r.get_json()
        assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
        # The sim echoes nothing (it is not the fake): the texts are the words alone.
        assert all(c["text"].endswith("tok0 tok1") for c in body["choices"])
        # Each prompt counts once: "x" in the sim's vocabulary, and three token ids.
        assert body["usage"]["prompt_tokens"] == len(fake_answers.tokenize("x")) + 3
        assert body["usage"]["completion_tokens"] == 8
