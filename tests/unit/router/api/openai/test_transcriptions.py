"""router/api/openai/transcriptions.py: llama-server's /v1/audio/transcriptions form, made the
chat request llama-server makes of it (server-chat.cpp, convert_transcriptions_to_chatcmpl),
and every malformed form a 400 naming what is wrong (issue 42, item 6)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from router.api.openai import transcriptions as t
from router.generation.events import Done, Event, TextDelta
from supervisor.errors import InvalidRequest
from worker.protocol import MEDIA_MARKER, Media, Usage

AUDIO = b"RIFF\x24\x00\x00\x00WAVEfmt audio bytes"


def multipart(*parts: tuple[str, bytes, str | None]) -> tuple[bytes, str]:
    """A multipart/form-data body of (name, value, filename or None) parts, and its type."""
    out = b""
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--b0undary\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n"
    return out + b"--b0undary--\r\n", "multipart/form-data; boundary=b0undary"


def parsed(with_file: bool = True, **fields: str) -> t.Form:
    parts = [(k, v.encode(), None) for k, v in fields.items()]
    return t.parse_form(*multipart(*parts, *([("file", AUDIO, "a.wav")] if with_file else [])))


def test_the_openai_clients_form_is_read() -> None:
    """As the openai client's httpx sends it."""
    req = httpx.Request("POST", "http://x/", files={"file": ("a.wav", AUDIO, "audio/wav")}, data={"model": "m"})
    f = t.parse_form(req.read(), req.headers["content-type"])
    assert f == t.Form({"model": "m"}, AUDIO)


def test_the_form_becomes_llama_servers_chat_request() -> None:
    job = t.transcription_job(parsed(model="m", language="fr", temperature="0.5", max_tokens="7"), "m")
    (message,) = job.messages or ()
    assert message.role == "user" and message.content == f"Transcribe audio to text (language: fr){MEDIA_MARKER}"
    assert message.media == [Media(data=AUDIO, param="file", kind="audio")]
    assert job.params.temperature == 0.5 and job.params.max_tokens == 7 and not job.stream


def test_a_prompt_replaces_the_default_and_stream_is_read_from_its_string() -> None:
    job = t.transcription_job(parsed(prompt="Words of a song:", stream="true"), "m")
    assert (job.messages or ())[0].content == f"Words of a song:{MEDIA_MARKER}" and job.stream


@pytest.mark.parametrize(
    ("fields", "file", "param", "says"),
    [
        ({"model": "m"}, False, "file", "No input file found for transcription"),
        ({"file": "not a file"}, False, "file", "must be a file of the form"),
        ({"response_format": "text"}, True, "response_format", "Only 'json' response_format"),
        ({"timestamp_granularities[]": "word"}, True, "timestamp_granularities[]", "Unrecognized request argument"),
        ({"temperature": "warm"}, True, "temperature", "expected a number"),
        ({"temperature": "nan"}, True, "temperature", "expected a number"),
        ({"max_tokens": "-1"}, True, "max_tokens", "an integer from 0"),
        ({"max_tokens": "99999999999"}, True, "max_tokens", "an integer from 0"),
        ({"stream": "yes"}, True, "stream", "expected 'true' or 'false'"),
    ],
)
def test_a_bad_form_is_a_400_naming_the_field(fields: dict[str, str], file: bool, param: str, says: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        t.transcription_job(parsed(file, **fields), "m")
    assert info.value.param == param and says in info.value.message, info.value.message


@pytest.mark.parametrize(
    ("body", "content_type", "says"),
    [
        (b'{"model": "m"}', "application/json", "Expected a multipart/form-data body"),
        (b"", None, "Expected a multipart/form-data body"),
        (b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm", "multipart/form-data; boundary=b", "cannot be read"),
        (b"garbage", "multipart/form-data; boundary=b", "cannot be read"),
    ],
)
def test_a_body_that_is_no_whole_form_is_a_400(body: bytes, content_type: str | None, says: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        t.parse_form(body, content_type)
    assert says in info.value.message and info.value.param == "file"


def test_a_field_twice_and_too_many_parts_are_refused() -> None:
    with pytest.raises(InvalidRequest) as info:
        t.parse_form(*multipart(("model", b"m", None), ("model", b"n", None)))
    assert info.value.param == "model" and "sent twice" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        t.parse_form(*multipart(*[(f"f{i}", b"x", None) for i in range(t.MAX_PARTS + 1)]))
    assert f"more than {t.MAX_PARTS} parts" in info.value.message


async def _events(*evs: Event) -> Any:
    for ev in evs:
        yield ev


async def test_the_answer_is_llama_servers_transcription_object() -> None:
    usage = Usage(prompt_tokens=160, completion_tokens=2, cached_tokens=150)
    evs = (TextDelta(choice=0, text="Hello"), TextDelta(choice=0, text=" there"), Done(usage))
    body = await t.whole(_events(*evs))
    assert body == (
        b'{"type":"transcript.text.done","text":"Hello there","usage":{"type":"tokens","input_tokens":160,'
        b'"output_tokens":2,"total_tokens":162,"input_tokens_details":{"cached_tokens":150}}}'
    )
    chunks = [c async for c in t.streamed(_events(*evs))]
    assert chunks[0] == b'data: {"type":"transcript.text.delta","delta":"Hello"}\n\n'
    assert chunks[2] == b"data: " + body + b"\n\n" and chunks[3] == b"data: [DONE]\n\n"
