"""OpenAI response objects: whole responses and streamed chunks, as bytes.

Shapes follow OpenAI's published schema: `created` is an integer, and `logprobs` and
`refusal` are present even when null.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import msgspec

from router.api.openai.logprobs import chat_logprobs, completion_logprobs
from router.api.timings import timings_json
from router.generation.answer import ChoiceAnswer
from router.server import sse
from worker.protocol import Timings, Usage

_json = msgspec.json.Encoder()


def usage_json(u: Usage | None) -> dict[str, object]:
    if u is None:
        u = Usage(prompt_tokens=0, completion_tokens=0)
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def message(c: ChoiceAnswer) -> dict[str, object]:
    """A chat choice's whole `message`: content, tool_calls, reasoning_content."""
    content = c.content
    msg: dict[str, object] = {
        "role": "assistant",
        # OpenAI's content is null beside tool calls when the model wrote nothing else.
        "content": None if c.calls and not content.strip() else content,
        "refusal": None,
    }
    if c.calls:
        msg["tool_calls"] = [
            {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}} for t in c.calls
        ]
    if c.reasoning:
        msg["reasoning_content"] = c.reasoning
    return msg


@dataclass
class Completion:
    """One response being built: the ids and timestamps every chunk repeats."""

    model: str
    chat: bool
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        self.id = prefix + secrets.token_hex(12)

    @property
    def kind(self) -> str:
        """The `object` field of a whole response."""
        return "chat.completion" if self.chat else "text_completion"

    def whole(self, choices: list[ChoiceAnswer], usage: Usage | None, logprobs: bool, timings: Timings | None = None) -> bytes:
        """A whole response; `logprobs`: the request asked for them (else they are null)."""
        out: list[dict[str, object]] = []
        for c in choices:
            lp: dict[str, object] | None = None
            reason = c.finish.reason if c.finish is not None else "stop"
            if self.chat:
                if logprobs:
                    lp = chat_logprobs(c.logprobs)
                out.append({"index": c.index, "message": message(c), "logprobs": lp, "finish_reason": reason})
            else:
                if logprobs:
                    lp, _ = completion_logprobs(c.logprobs, len(c.echo))
                out.append({"index": c.index, "text": c.text, "logprobs": lp, "finish_reason": reason})
        obj: dict[str, object] = {
            "id": self.id,
            "object": self.kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": out,
            "usage": usage_json(usage),
        }
        if timings is not None:  # llama-server's extension, asked for with timings_per_token
            obj["timings"] = timings_json(timings)
        return _json.encode(obj)

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        first: bool = False,
        index: int = 0,
        logprobs: dict[str, object] | None = None,
        timings: Timings | None = None,
    ) -> bytes:
        """One SSE event of choice `index`. For chat, the first chunk carries the role.
        `logprobs`: this chunk's tokens' logprobs, already in the endpoint's shape."""
        if self.chat:
            delta: dict[str, object] = {}
            if first:
                delta["role"] = "assistant"
            if first and not text:
                # The role's chunk has content null, as llama-server sends it (its tests
                # check `content is None`; a client that joins deltas skips nulls, where an
                # empty string would be a delta with nothing in it). OpenAI sends "".
                delta["content"] = None
            elif text is not None:
                delta["content"] = text
            choice: dict[str, object] = {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
            obj = "chat.completion.chunk"
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
            obj = "text_completion"
        out: dict[str, object] = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [choice],
        }
        if timings is not None:
            out["timings"] = timings_json(timings)
        return self._event(out)

    def delta_chunk(
        self,
        delta: dict[str, object],
        finish_reason: str | None = None,
        timings: Timings | None = None,
        index: int = 0,
        logprobs: dict[str, object] | None = None,
    ) -> bytes:
        """One chat chunk of choice `index` with a prepared delta (reasoning_content,
        tool_calls)."""
        out: dict[str, object] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        }
        if timings is not None:
            out["timings"] = timings_json(timings)
        return self._event(out)

    def usage_chunk(self, usage: Usage | None, timings: Timings | None = None) -> bytes:
        """The extra final chunk that `stream_options.include_usage` asks for; with the
        generation's `timings`, as llama-server's last chunk carries them."""
        obj: dict[str, object] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [],
            "usage": usage_json(usage),
        }
        if timings is not None:
            obj["timings"] = timings_json(timings)
        return self._event(obj)

    @staticmethod
    def _event(obj: dict[str, object]) -> bytes:
        return sse.event(_json.encode(obj))


# What OpenAI's clients wait for before they treat a stream as complete.
DONE = b"data: [DONE]\n\n"
