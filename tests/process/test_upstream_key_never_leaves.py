"""An upstream that quotes the key it refused ("Incorrect API key provided: Bearer sk-...",
as some do) in a 401, in an error event mid-stream (the key split across two chunks), and
in a header: the configured key reaches nothing Corral writes (issue 40, finding 6). Not
the relayed answer, not the translated error, not the log, not /admin/models' last_error,
not /v1/models. Two models, two keys (one from an environment variable, one from a
file), one upstream."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.process.test_upstream_relay import request_body, upstream_and_front
from tests.secrets import secret

ENV_KEY = secret("upstream-env")
FILE_KEY = secret("upstream-file")


class QuotingUpstream:
    """Refuses every key, quoting the one it was sent: "refuses" with a 401 whose message
    and request-id header hold it; "breaks" with a 200 stream whose second event is an
    error holding it, sent in two pieces cut inside the key."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = await request_body(scope, receive, send)
        if body is None:
            return
        sent = dict(scope["headers"]).get(b"authorization", b"").decode()
        message = json.dumps({"error": {"message": f"Incorrect API key provided: {sent}", "type": "invalid_request_error",
                                        "code": "invalid_api_key"}}).encode()
        if json.loads(body).get("model") == "refuses":
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"request-id", sent.encode())]})
            await send({"type": "http.response.body", "body": message})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        first = {"id": "c", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": None}]}
        await send({"type": "http.response.body", "body": f"data: {json.dumps(first)}\n\n".encode(), "more_body": True})
        error = b"data: " + message + b"\n\n"
        cut = error.index(sent.split()[-1].encode()) + 10  # inside the key
        for piece in (error[:cut], error[cut:]):
            await trio.sleep(0.05)  # each its own read at the front
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


TABLES = """
[models.refuses]
upstream = "{UP}"
api_key_env = "CORRAL_TEST_QUOTED_KEY"

[models.breaks]
upstream = "{UP}"
api_key_file = "upstream.key"
"""


def _leaks(text: str) -> list[str]:
    return [k for k in (ENV_KEY, FILE_KEY, f"Bearer {ENV_KEY}", f"Bearer {FILE_KEY}", ENV_KEY[:-2]) if k in text]


async def test_an_upstream_that_quotes_the_key_it_refused_never_gets_it_written_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("CORRAL_TEST_QUOTED_KEY", ENV_KEY)
    (tmp_path / "upstream.key").write_text(FILE_KEY + "\n")
    user = [{"role": "user", "content": "Hi"}]
    answers: list[httpx.Response] = []
    with trio.fail_after(60):
        async with upstream_and_front(tmp_path, TABLES, fake=QuotingUpstream()) as (_, front):
            async with httpx.AsyncClient(base_url=front, timeout=10, headers={"anthropic-version": "2023-06-01"}) as c:
                for model in ("refuses", "breaks"):
                    for stream in (False, True):
                        # Relayed as it came (OpenAI's dialect, which the upstream speaks)...
                        answers.append(await c.post("/v1/chat/completions", json={
                            "model": model, "messages": user, "stream": stream}))
                        # ...and translated (Anthropic's, which it does not).
                        answers.append(await c.post("/v1/messages", json={
                            "model": model, "max_tokens": 8, "messages": user, "stream": stream}))
                admin = (await c.get("/admin/models")).text
                listed = (await c.get("/v1/models")).text
    for a in answers:
        assert not _leaks(a.text) and not _leaks(json.dumps(dict(a.headers))), (a.request.url, a.status_code)
    assert not _leaks(admin) and not _leaks(listed) and not _leaks(caplog.text)
    # Each way out was taken, the refusal's text passed on with the key taken out of it.
    relayed_401, translated_401 = answers[0], answers[1]
    assert relayed_401.status_code == 401 and relayed_401.headers["request-id"] == "Bearer [redacted]"
    assert relayed_401.json()["error"]["message"] == "Incorrect API key provided: Bearer [redacted]"
    assert translated_401.status_code == 502
    assert "Incorrect API key provided: Bearer [redacted]" in translated_401.json()["error"]["message"]
    relayed_stream, translated_stream = answers[6], answers[7]
    assert "Incorrect API key provided: Bearer [redacted]" in relayed_stream.text
    assert "Incorrect API key provided: Bearer [redacted]" in translated_stream.text
    replicas = {u["name"]: u["replicas"][0] for u in json.loads(admin)["upstreams"]}
    assert "Bearer [redacted]" in replicas["breaks"]["last_error"]
    assert "Bearer [redacted]" in caplog.text


class EscapingUpstream:
    """Quotes the key it refused as encoders the probe of issue 40 met write it: every
    character as \\uXXXX ("escaped"), or gzip-compressed although identity was asked for
    ("gzips"), or compressed in a coding Corral cannot read ("brotli")."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = await request_body(scope, receive, send)
        if body is None:
            return
        sent = dict(scope["headers"]).get(b"authorization", b"").decode()
        model = json.loads(body).get("model")
        escaped = "".join(f"\\u{ord(c):04x}" for c in sent)
        message = ('{"error": {"message": "Incorrect API key provided: ' + escaped + '", "type": "invalid_request_error"}}').encode()
        headers = [(b"content-type", b"application/json")]
        if model == "gzips":
            message = gzip.compress(message)
            headers.append((b"content-encoding", b"gzip"))
        elif model == "brotli":
            headers.append((b"content-encoding", b"br"))
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": message})


async def test_a_key_quoted_in_json_escapes_or_in_a_compressed_body_never_reaches_a_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("CORRAL_TEST_QUOTED_KEY", ENV_KEY)
    tables = "".join(
        f'[models.{m}]\nupstream = "{{UP}}"\napi_key_env = "CORRAL_TEST_QUOTED_KEY"\nupstream_dialects = ["openai", "ollama"]\n'
        for m in ("escaped", "gzips", "brotli")
    )
    user = [{"role": "user", "content": "Hi"}]
    seen: list[str] = []
    with trio.fail_after(60):
        async with upstream_and_front(tmp_path, tables, fake=EscapingUpstream()) as (_, front):
            async with httpx.AsyncClient(base_url=front, timeout=10, headers={"accept-encoding": "gzip, br"}) as c:
                for model in ("escaped", "gzips", "brotli"):
                    relayed = await c.post("/v1/chat/completions", json={"model": model, "messages": user})
                    translated = await c.post("/v1/messages", json={"model": model, "max_tokens": 8, "messages": user},
                                              headers={"anthropic-version": "2023-06-01"})
                    for r in (relayed, translated):
                        seen.append(json.dumps(r.json()))  # what a client's JSON parser reads
                        assert r.status_code in (401, 502), (model, r.status_code, r.text)
                    assert relayed.status_code == (502 if model == "brotli" else 401)
                    assert "content-encoding" not in relayed.headers or model == "brotli"
    for text in [*seen, caplog.text]:
        assert not _leaks(text), text
