"""POST /v1/audio/transcriptions, as llama-server serves OpenAI's route: a multipart form with
the audio as `file`, turned into a chat request of one user message that asks for the
transcription, answered as OpenAI's transcription object.

llama-server's conversion (tools/server/server-chat.cpp, convert_transcriptions_to_chatcmpl)
is followed: the message is `prompt` (else "Transcribe audio to text"), then " (language:
L)" when `language` is sent, then the audio; `response_format` must be "json"; `stream`,
`temperature` and `max_tokens` arrive as form strings. The answer is llama-server's
(to_json_oaicompat_asr): `{"type": "transcript.text.done", "text": ..., "usage": {...}}`,
or streamed, `transcript.text.delta` events, that done event and `[DONE]`.

Where it differs: llama-server copies every other form field into the chat request as a
string; here a field the route does not take is a 400 naming it, as OpenAI's routes refuse
unknown parameters. A model served upstream only is not reached from here (the upstream hook
reads JSON bodies, not forms).

The form is parsed by Werkzeug's multipart decoder (Quart's own) on a thread: 20 MB of form
takes 0.2 s, which the event loop, and every stream the router serves, would otherwise wait.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, AsyncIterator

import msgspec
import trio
from quart import Blueprint, Response, request
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

from router.api.answering import answer, job_for
from router.api.dialect import Server
from router.api.openai import schemas
from router.api.openai.errors import error_event
from router.api.openai.translate import chat_job
from router.generation.answer import gather
from router.generation.events import Done, Event, Failed, TextDelta
from router.generation.job import GenerationJob
from router.server import bodies, sse
from supervisor.errors import InvalidRequest
from worker.protocol import MEDIA_MARKER, ChatMessage, Media, SamplingParams, Usage

ASR_PROMPT = "Transcribe audio to text"  # llama-server's (common/chat.cpp, common_chat_get_asr_prompt)
FIELDS = ("model", "prompt", "language", "response_format", "temperature", "max_tokens", "stream")
MAX_PARTS = 16  # a form of more is no transcription request
_json = msgspec.json.Encoder()


@dataclass(frozen=True)
class Form:
    fields: dict[str, str]
    file: bytes


def parse_form(body: bytes | bytearray, content_type: str | None) -> Form:
    """The form's text fields and its `file`, or an InvalidRequest naming what is wrong.
    Pure, and run on a thread."""
    mime, options = parse_options_header(content_type or "")
    if mime != "multipart/form-data" or not options.get("boundary"):
        raise InvalidRequest("Expected a multipart/form-data body with the audio as 'file'.", "file")
    decoder = MultipartDecoder(options["boundary"].encode("latin-1"), max_parts=MAX_PARTS)
    fields: dict[str, str] = {}
    file: bytes | None = None
    part: Field | File | None = None
    chunks: list[bytes] = []
    try:
        decoder.receive_data(bytes(body))
        decoder.receive_data(None)
        while not isinstance(event := decoder.next_event(), (Epilogue, NeedData)):
            if isinstance(event, (Field, File)):
                part, chunks = event, []
                if event.name in fields or (event.name == "file" and file is not None):
                    raise InvalidRequest(f"'{event.name}' is sent twice.", event.name)
            elif isinstance(event, Data) and part is not None:
                chunks.append(event.data)
                if not event.more_data:
                    value = b"".join(chunks)
                    if isinstance(part, File) and part.name == "file":
                        file = value
                    elif part.name == "file":
                        raise InvalidRequest("'file' must be a file of the form, not a text field.", "file")
                    else:
                        fields[part.name] = value.decode("utf-8", errors="replace")
    except ValueError as exc:  # a form cut short, or not a form
        raise InvalidRequest(f"The multipart/form-data body cannot be read ({exc}).", "file") from None
    except RequestEntityTooLarge:  # Werkzeug's word for too many parts
        raise InvalidRequest(f"The form has more than {MAX_PARTS} parts.", "file") from None
    if not isinstance(event, Epilogue):
        raise InvalidRequest("The multipart/form-data body ends before its closing boundary.", "file")
    if (unknown := next((k for k in fields if k not in FIELDS), None)) is not None:
        raise InvalidRequest(f"Unrecognized request argument supplied: {unknown}", unknown)
    if file is None:
        raise InvalidRequest("No input file found for transcription: send the audio as 'file'.", "file")
    return Form(fields, file)


def _number(form: Form, name: str, kind: type[float] | type[int]) -> Any:
    """A form field that llama-server reads as a number (std::stof, std::stoul), or None."""
    text = form.fields.get(name)
    if text is None:
        return None
    try:
        value = kind(text.strip())
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or (kind is int and not 0 <= value <= 2**31 - 1):
        want = "an integer from 0" if kind is int else "a number"
        raise InvalidRequest(f"Invalid value for '{name}': expected {want}, got {text!r}.", name)
    return value


def transcription_job(form: Form, model: str, defaults: SamplingParams = SamplingParams()) -> GenerationJob:
    """The chat job llama-server makes of the form (convert_transcriptions_to_chatcmpl)."""
    fmt = form.fields.get("response_format", "json")
    if fmt != "json":
        raise InvalidRequest("Only 'json' response_format is supported for transcription.", "response_format")
    stream = form.fields.get("stream", "false").strip().lower()
    if stream not in ("true", "false"):
        raise InvalidRequest(f"Invalid value for 'stream': expected 'true' or 'false', got {stream!r}.", "stream")
    text = form.fields.get("prompt") or ASR_PROMPT
    if language := form.fields.get("language"):
        text += f" (language: {language})"
    r = schemas.ChatRequest(
        model=form.fields.get("model"), temperature=_number(form, "temperature", float),
        max_tokens=_number(form, "max_tokens", int), stream=stream == "true",
        messages=[{"role": "user", "content": text}],
    )
    job = chat_job(r, model, defaults)
    message = ChatMessage(role="user", content=text + MEDIA_MARKER, media=[Media(data=form.file, param="file", kind="audio")])
    return dataclasses.replace(job, messages=(message,))


def _usage(u: Usage | None) -> dict[str, object]:
    p, c = (u.prompt_tokens, u.completion_tokens) if u is not None else (0, 0)
    return {
        "type": "tokens", "input_tokens": p, "output_tokens": c, "total_tokens": p + c,
        "input_tokens_details": {"cached_tokens": u.cached_tokens if u is not None else 0},
    }


async def whole(events: AsyncIterator[Event]) -> bytes:
    got = await gather(events)
    text = "".join(c.content for c in got.ordered())
    return _json.encode({"type": "transcript.text.done", "text": text, "usage": _usage(got.usage)})


async def streamed(events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    parts: list[str] = []
    async for ev in events:
        if isinstance(ev, TextDelta) and ev.text:
            parts.append(ev.text)
            yield sse.event(_json.encode({"type": "transcript.text.delta", "delta": ev.text}))
        elif isinstance(ev, Done):
            done = {"type": "transcript.text.done", "text": "".join(parts), "usage": _usage(ev.usage)}
            yield sse.event(_json.encode(done))
            yield b"data: [DONE]\n\n"
        elif isinstance(ev, Failed):
            yield error_event(ev.error)


def register(app: Blueprint, server: Server) -> None:
    @app.post("/v1/audio/transcriptions")
    @app.post("/audio/transcriptions")
    async def transcriptions() -> Response:
        body = await bodies.read_body()
        form = await trio.to_thread.run_sync(parse_form, body, request.headers.get("content-type"))
        model = form.fields.get("model") or None
        target = server.target(model)
        job = job_for(target, lambda defaults: transcription_job(form, model or target.name, defaults))
        return await answer(target, job, whole, streamed)
