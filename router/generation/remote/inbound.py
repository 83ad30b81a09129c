"""An OpenAI-compatible upstream's answer read back into the internal events.

The upstream streams chunks (`data: {...}` server-sent events, then `data: [DONE]`); each
choice's deltas become `Begin`, `TextDelta`, `ReasoningDelta` (llama-server's and vLLM's
`reasoning_content`, or `reasoning`) and tool calls, and the usage chunk that
`stream_options.include_usage` asks for ends every choice with its `Finish`, then `Done`
(an upstream that sends no usage leaves it at zero tokens: Corral cannot count another
server's tokens).

A choice's tool calls are gathered and given whole at its end, each in one
`ToolCallDelta`, as the internal events promise (Anthropic's `input` and Ollama's
`arguments` are objects): pieces may interleave between calls. Arguments that are not a
JSON object fail the answer, unless max_tokens cut them short. A stream
that ends without a choice's finish_reason was cut: it ends in `Failed`, never as if the
answer were whole. An answer that is an error (before the stream, or as an `error` event
in it) becomes the error in the client's dialect, with the status that says whose fault it
is: the client's request (4xx), or the upstream's (502, 503, 429).

Pure: bytes and JSON in, events out, tested without an upstream.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from router.generation.calls import arguments_whole
from router.generation.events import (
    Begin, Done, Event, Failed, Finish, Reason, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart,
)
from router.server import json_text
from supervisor import errors as e
from worker.protocol import Usage

# The longest event the reader holds while its end has not come: far above any chunk of a
# generation, far below what would hurt the server.
MAX_EVENT_BYTES = 8 * 1024 * 1024


class EventLines:
    """Server-sent events' `data` payloads from a byte stream, as it arrives."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[str]:
        # The whole buffer, as a CRLF may be split between two chunks.
        self._buffer = (self._buffer + chunk).replace(b"\r\n", b"\n")
        *blocks, self._buffer = self._buffer.split(b"\n\n")
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise ValueError(f"an event longer than {MAX_EVENT_BYTES} bytes")
        return [d for b in blocks if (d := _data(b)) is not None]

    def end(self) -> list[str]:
        """What is left when the stream ends (a last event with no blank line after it)."""
        rest, self._buffer = self._buffer, b""
        d = _data(rest)
        return [d] if d is not None else []


def _data(block: bytes) -> str | None:
    lines = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines).decode("utf-8", "replace") if lines else None


@dataclass
class _Call:
    id: str
    name: str
    arguments: str = ""


@dataclass
class _Choice:
    reason: str | None = None
    calls: list[_Call] = field(default_factory=list)  # in the order they began
    by_index: dict[int, _Call] = field(default_factory=dict)  # the upstream's call index


class ChunkReader:
    """Reads one answer's chunks (`chat`: chat completion chunks, else text completion
    chunks) for a job of `n` choices, and gives the internal events they make. `feed`
    takes each event's data; `end` the stream's end, whether or not [DONE] came.

    A choice's tool calls are given at its end, each whole (start, all its arguments,
    end): a call's arguments may come in pieces, interleaved with another call's (that
    is what `index` is for), and a call is only known whole when its choice finishes.
    A piece with a new `id` under an index already taken is a new call (some servers
    number every call 0); a piece without an index belongs to the last call."""

    def __init__(self, model: str, chat: bool, n: int = 1) -> None:
        self._model, self._chat, self._n = model, chat, n
        self._choices: dict[int, _Choice] = {}
        self._usage: Usage | None = None
        self._pieces = 0  # chunks that carried output, for an answer whose usage never comes
        self.done = False  # [DONE] came
        self.failed = False

    def feed(self, data: str) -> list[Event]:
        if self.done or self.failed:
            return []
        if data.strip() == "[DONE]":
            self.done = True
            return []
        obj = event_object(data)
        if isinstance(obj, str):
            return self._fail(obj)
        if obj.get("error"):  # some proxies send "error": null in every chunk
            self.failed = True
            return [error_event(self._model, obj)]
        if isinstance(obj.get("usage"), dict):
            self._usage = _usage(obj["usage"])
        out: list[Event] = []
        for ch in obj.get("choices") or ():
            index = ch.get("index") if isinstance(ch, dict) else -1
            index = 0 if index is None else index
            # A choice the job did not ask for (n) is not part of its answer.
            if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < self._n:
                out += self._choice(index, ch)
        return out

    def _choice(self, i: int, ch: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        c = self._choices.get(i)
        if c is None:
            c = self._choices[i] = _Choice()
            out.append(Begin(i))
        if c.reason is not None:
            return out  # nothing of a choice counts after its finish_reason
        before = len(out)
        if self._chat:
            d = as_object(ch.get("delta"))
            reasoning = d.get("reasoning_content") or d.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                out.append(ReasoningDelta(i, reasoning))
            if isinstance(d.get("content"), str) and d["content"]:
                out.append(TextDelta(i, d["content"]))
            for tc in d.get("tool_calls") or ():
                if isinstance(tc, dict):
                    self._call(c, tc)
        elif isinstance(ch.get("text"), str) and ch["text"]:
            out.append(TextDelta(i, ch["text"]))
        if len(out) > before or (self._chat and as_object(ch.get("delta")).get("tool_calls")):
            self._pieces += 1
        if isinstance(ch.get("finish_reason"), str):
            c.reason = ch["finish_reason"]
        return out

    @staticmethod
    def _call(c: _Choice, tc: dict[str, Any]) -> None:
        fn = as_object(tc.get("function"))
        given, index = tc.get("id"), tc.get("index")
        call_id = given if isinstance(given, str) and given else None
        known = c.by_index.get(index) if isinstance(index, int) else None
        if known is not None and call_id is not None and call_id != known.id:
            known = None  # a new call under a number already taken
        if known is None and not isinstance(index, int) and call_id is None and c.calls:
            known = c.calls[-1]  # more of the last call
        if known is None:
            known = _Call(call_id or f"call_{secrets.token_hex(12)}", "")
            c.calls.append(known)
        if isinstance(index, int):
            c.by_index[index] = known
        if isinstance(fn.get("name"), str) and fn["name"] and not known.name:
            known.name = fn["name"]
        args = fn.get("arguments")
        if isinstance(args, str):
            known.arguments += args
        elif isinstance(args, dict):  # an object where OpenAI sends its JSON text
            known.arguments += json.dumps(args)

    @staticmethod
    def _calls(i: int, c: _Choice) -> list[Event]:
        out: list[Event] = []
        for n, call in enumerate(c.calls):
            out += [ToolCallStart(i, n, call.id, call.name), ToolCallDelta(i, n, call.arguments or "{}"), ToolCallEnd(i, n)]
        return out

    def so_far(self) -> Usage:
        """The usage of an answer that ends before the upstream's usage came (its client
        gone): one token per chunk that carried output, the unit OpenAI-compatible servers
        stream in (a lower bound where a chunk carries more); the prompt is not known."""
        return self._usage or Usage(prompt_tokens=0, completion_tokens=self._pieces)

    def end(self) -> list[Event]:
        """The events that end the answer: each choice's Finish and Done, or Failed when
        the stream did not end as a whole answer does."""
        if self.failed:
            return []
        if not self._choices:
            return self._fail("ended its answer without any choice")
        if any(c.reason is None for c in self._choices.values()):
            return self._fail("ended its answer before it was complete")
        for c in self._choices.values():
            bad = next((call for call in c.calls if not arguments_whole(call.arguments)), None)
            if bad is not None and c.reason != "length":  # a call cut short by max_tokens is the length's
                return self._fail(f"sent a tool call whose arguments are not a JSON object: {bad.arguments[:80]!r}")
        usage = self._usage or Usage(prompt_tokens=0, completion_tokens=0)
        out: list[Event] = []
        for i, c in sorted(self._choices.items()):
            out += self._calls(i, c)
            out.append(Finish(i, _reason(c), usage))
        out.append(Done(usage))
        return out

    def _fail(self, what: str) -> list[Event]:
        self.failed = True
        return [broken(self._model, what)]


def event_object(data: str) -> dict[str, Any] | str:
    """An event's data as the JSON object it must be, or what is wrong with it."""
    try:
        obj = json_text.loads(data)
    except ValueError:
        return f"sent an event that is not JSON: {data[:80]!r}"
    return obj if isinstance(obj, dict) else "sent an event that is not a JSON object"


# An error event's type or code that says the upstream is busy, not broken: a 503 to retry
# (Anthropic's overloaded_error, HTTP 529's twin in a stream) or a 429.
_BUSY = frozenset({"overloaded_error", "overloaded", "service_unavailable", 503, "503", 529, "529"})
_LIMITED = frozenset({"rate_limit_error", "rate_limit_exceeded", "too_many_requests", 429, "429"})


def error_event(model: str, obj: dict[str, Any]) -> Failed:
    """An `error` event in an upstream's stream (OpenAI's `{"error": {...}}`, Anthropic's
    `{"type": "error", "error": {...}}`): a 503 or a 429 to retry where its type or code
    says the upstream is busy, which is no fault of the replica's; else a broken answer."""
    err = as_object(obj.get("error"))
    said = f"The upstream of model `{model}` failed mid-answer: {message_of(obj)}."
    kinds = {err.get("type"), err.get("code")} - {None}
    if kinds & _BUSY:
        return Failed(e.WorkerUnavailable(said, retry_after=1.0))
    if kinds & _LIMITED:
        return Failed(e.Overloaded(said, retry_after=1.0))
    return broken(model, f"failed mid-answer: {message_of(obj)}")


def broken(model: str, what: str) -> Failed:
    """The end of an answer that is not whole: `what` the upstream did."""
    return Failed(e.WorkerCrashed(f"The upstream of model `{model}` {what}."))


def as_object(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def count_of(v: Any) -> int:
    """A token count as an upstream sent it; 0 for what is not one."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def _reason(c: _Choice) -> Reason:
    if c.reason == "length":
        return "length"
    if c.calls or c.reason in ("tool_calls", "function_call"):
        return "tool_calls"
    return "stop"  # "stop", and what has no counterpart ("content_filter")


def _usage(u: dict[str, Any]) -> Usage:
    details = u.get("prompt_tokens_details")
    cached = count_of(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(prompt_tokens=count_of(u.get("prompt_tokens")), completion_tokens=count_of(u.get("completion_tokens")),
                 cached_tokens=cached)


def message_of(obj: Any) -> str:
    """The message of an OpenAI-shaped error body (or a plain one, or a text), bounded."""
    if isinstance(obj, str):
        plain = " ".join(obj.split())
        return (plain if len(plain) <= 200 else plain[:200] + "…") or "no message"
    err = obj.get("error") if isinstance(obj, dict) else None
    text = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
    if not isinstance(text, str) and isinstance(obj, dict) and isinstance(obj.get("message"), str):
        text = obj["message"]
    text = text if isinstance(text, str) and text else "no message"
    return text if len(text) <= 500 else text[:500] + "…"


def upstream_error(model: str, status: int, body: bytes, retry_after: float | None) -> e.CorralError:
    """The error for an upstream's answer that is not a stream (`status` >= 300).

    A 400-class answer is the client's request refused: the same status class, with the
    upstream's message and the parameter it names. A refused key (401, 403) or an unknown
    model name (404) is the operator's configuration, never the client's key or name: 502.
    A 429 is passed on as one, 503, 504 and 529 as 503, and anything else as 502. The
    body may be OpenAI's error object or Anthropic's (whose `error` has no `param`)."""
    try:
        obj = json_text.loads(body)
    except ValueError:
        obj = body.decode("utf-8", "replace")
    err = obj.get("error") if isinstance(obj, dict) else None
    param = err.get("param") if isinstance(err, dict) and isinstance(err.get("param"), str) else None
    said = f"The upstream of model `{model}` answered {status}: {message_of(obj)}"
    if status in (401, 403):
        return e.WorkerCrashed(f"{said} (check the model's api_key_env or api_key_file).")
    if status == 404:
        return e.WorkerCrashed(f"{said} (check the model's upstream and upstream_model).")
    if status == 429:
        return e.Overloaded(said, retry_after=retry_after or 1.0)
    if status in (503, 504, 529):  # 529: Anthropic's "overloaded"
        return e.WorkerUnavailable(said, retry_after=retry_after or 1.0)
    if 400 <= status < 500:
        code = err.get("code") if isinstance(err, dict) else None
        if code == "context_length_exceeded" or message_of(obj).startswith("prompt is too long"):  # OpenAI's, Anthropic's
            return e.ContextOverflow(said, param or "messages")
        return e.InvalidRequest(said, param)
    return e.WorkerCrashed(said)
