"""`corral chat --url`: replies from a running server, streamed over /v1/chat/completions.

The standard library's http.client rather than an HTTP package: the chat needs one
streamed POST at a time, and Corral's runtime dependencies stay as they are. Closing the
connection is how a reply is stopped: the server sees its client leave and cancels the
generation, freeing its slot.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from typing import Any, Generator, Iterator
from urllib.parse import quote, urlsplit

from corral.chat.session import TOO_LONG_HINT, ChatError, Event, Finished, Piece
from router.server import json_text

CONNECT_TIMEOUT = 10.0
# Between two reads of a reply: a first request may wait for the model to load
# (load_wait, 60 s by default) and then for a slot.
READ_TIMEOUT = 600.0
# The longest event line read; a server that sends more is cut off, not followed into
# unbounded memory.
MAX_LINE = 1 << 20


def api_base(url: str) -> tuple[str, str, int | None, str]:
    """Scheme, host, port and the path that /chat/completions goes under, from what the
    user gave: `http://host:8080`, `http://host:8080/v1` or a path prefix behind a proxy.
    Raises ChatError for anything that is not an http(s) URL."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ChatError(f"--url: not a URL: {url!r} ({exc})") from None
    if parts.username is not None or parts.password is not None:
        # Not repeated: what is before the @ is likely a secret.
        raise ChatError("--url: a URL with user:password@ in it is refused (the key comes from $CORRAL_API_KEY or --api-key-file)")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ChatError(f"--url: expected http://HOST[:PORT] or https://..., got {url!r}")
    if parts.query or parts.fragment:
        raise ChatError(f"--url: expected no query or fragment, got {url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return parts.scheme, parts.hostname, port, path


class HttpChat:
    """A server at `url`, asked with `api_key` (None: no key). Blocking; one reply at a
    time."""

    def __init__(self, url: str, api_key: str | None) -> None:
        self._scheme, self._host, self._port, self._base = api_base(url)
        self.url = url
        self._headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if api_key is not None:
            self._headers["authorization"] = f"Bearer {api_key}"

    def _connect(self) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=CONNECT_TIMEOUT, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=CONNECT_TIMEOUT)

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = self._connect()
        try:
            conn.request(method, self._base + path, body=body, headers=self._headers)
            if conn.sock is not None:
                conn.sock.settimeout(READ_TIMEOUT)
            return conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise ChatError(f"cannot reach {self.url}: {_reason(exc)}") from None

    def check(self, model: str) -> str:
        """The model's name as the server calls it; fails at start, before any prompt,
        for a server that is not there, a key it refuses, or a model it does not have. A
        server without GET /v1/models/{id} (not every OpenAI-compatible one has it) is
        taken at its word: the first reply will say if the model is wrong."""
        conn, resp = self._request("GET", "/models/" + quote(model, safe=""))
        try:
            data = resp.read(MAX_LINE)
        finally:
            conn.close()
        if resp.status in (404, 405) and _code(data) != "model_not_found":
            return model
        if resp.status != 200:
            raise ChatError(_refusal(resp.status, data, self.url, model))
        try:
            name = json_text.loads(data)["id"]
        except (ValueError, KeyError, TypeError):
            raise ChatError(f"{self.url} is not a Corral or OpenAI server (GET /v1/models/{model} gave no model)") from None
        return str(name)

    def reply(self, body: dict[str, Any]) -> Generator[Event, None, None]:
        """The reply's pieces as they arrive, then Finished. Closing the iterator early
        (Ctrl-C) closes the connection, which stops the generation on the server."""
        conn, resp = self._request("POST", "/chat/completions", json.dumps(body).encode())
        try:
            if resp.status != 200:
                raise ChatError(_refusal(resp.status, resp.read(MAX_LINE), self.url, str(body.get("model"))))
            yield from _events(resp)
        except (OSError, http.client.HTTPException) as exc:
            raise ChatError(f"the connection to {self.url} broke: {_reason(exc)}") from None
        finally:
            conn.close()


def _events(resp: http.client.HTTPResponse) -> Iterator[Event]:
    """Server-sent events to pieces. The usage chunk comes after the finish_reason chunk,
    so Finished is held until [DONE]. Anything that is not the shape of a chunk is a
    ChatError, never a traceback."""
    reason: str | None = None
    tokens: int | None = None
    while True:
        line = resp.readline(MAX_LINE)
        if not line:
            raise ChatError("the server ended the reply without [DONE] (a cut reply)")
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        if not text.startswith("data:"):
            continue  # blank separators, comments, event names
        data = text[len("data:") :].strip()
        if data == "[DONE]":
            yield Finished(reason or "stop", tokens)
            return
        try:
            chunk = json_text.loads(data)
        except ValueError:
            raise ChatError(f"the server sent an event that is not JSON: {data[:80]!r}") from None
        if not isinstance(chunk, dict):
            raise ChatError(f"the server sent an event that is not a chunk: {data[:80]!r}")
        if "error" in chunk:
            raise ChatError(f"the server stopped the reply: {_message(chunk)}")
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            tokens = usage["completion_tokens"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            if isinstance(delta.get("reasoning_content"), str) and delta["reasoning_content"]:
                yield Piece(delta["reasoning_content"], reasoning=True)
            if isinstance(delta.get("content"), str) and delta["content"]:
                yield Piece(delta["content"])
            if isinstance(choice.get("finish_reason"), str):
                reason = choice["finish_reason"]


def _refusal(status: int, data: bytes, url: str, model: str) -> str:
    try:
        message = _message(json_text.loads(data))
    except ValueError:
        message = data[:200].decode("utf-8", "replace").strip() or "(no body)"
    if status == 401:
        return (
            f"{url} refused the API key (or wants one): {message} "
            "(the key comes from $CORRAL_API_KEY or --api-key-file)"
        )
    if _code(data) == "context_length_exceeded":
        return message + TOO_LONG_HINT
    if status == 404 and "model" in message:
        return f"{url} has no model {model!r}: {message}"
    return f"{url} answered {status}: {message}"


def _code(data: bytes) -> object:
    try:
        obj = json_text.loads(data)
    except ValueError:
        return None
    return obj["error"].get("code") if isinstance(obj, dict) and isinstance(obj.get("error"), dict) else None


def _message(obj: Any) -> str:
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        return str(obj["error"].get("message"))
    return json.dumps(obj)[:200]


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    return str(exc) or type(exc).__name__
