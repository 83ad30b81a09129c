"""What an upstream's answer counts when it ends before its usage came (a client gone
mid-stream: issue 40, finding 7): one token a chunk that carried output, and whatever
the upstream had already said of its usage."""

from __future__ import annotations

import json
from typing import Any

from router.generation.remote.anthropic_events import MessageReader
from router.generation.remote.inbound import ChunkReader
from worker.protocol import Usage


def _feed(reader: ChunkReader | MessageReader, *objs: dict[str, Any]) -> None:
    for obj in objs:
        reader.feed(json.dumps(obj))


def delta(d: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": None}]}


def test_openai_chunks_count_a_token_each_that_carried_output() -> None:
    r = ChunkReader("m", chat=True)
    _feed(r, delta({"role": "assistant", "content": ""}), delta({"content": "Hel"}), delta({"reasoning_content": "hm"}),
          delta({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}), delta({}))
    assert r.so_far() == Usage(prompt_tokens=0, completion_tokens=3)
    usage = {"prompt_tokens": 7, "completion_tokens": 9}
    _feed(r, {"choices": [], "usage": usage})
    assert r.so_far() == Usage(prompt_tokens=7, completion_tokens=9)  # the upstream's own, once said


def test_anthropic_events_count_the_prompt_and_a_token_a_delta() -> None:
    r = MessageReader("m")
    _feed(r, {"type": "message_start", "message": {"usage": {"input_tokens": 5, "cache_read_input_tokens": 2}}},
          {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
          {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi there"}},
          {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " you"}})
    assert r.so_far() == Usage(prompt_tokens=7, completion_tokens=2, cached_tokens=2)
