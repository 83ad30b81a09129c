"""Which conversation a request belongs to, so that its turns go to one replica and find
their prompt cache there (router/upstream/choice.py ranks replicas by this key). Pure.

In order of trust:
1. a session header the client sets on purpose: `x-session-id` (the header nginx and
   HAProxy configurations in deploy/ hash on too), or `x-conversation-id`;
2. the body's `user` (OpenAI's end-user id), `metadata.user_id` (Anthropic's) or
   `prompt_cache_key` (OpenAI's own routing hint for its prompt cache);
3. the conversation's start: the system prompt and the first user message. Every later
   turn of an agent's or a chat's conversation resends them unchanged, so they name the
   conversation without any help from the client. `previous_response_id` (Responses)
   names the earlier turn, which is on the replica that stored it. A completion's prompt
   is its own start (its first 4 kB).

None: nothing to go by (an embedding, say); the caller spreads such requests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

SESSION_HEADERS = ("x-session-id", "x-conversation-id")

# The conversation's start is hashed from at most this much of its text.
_START_BYTES = 4096


def session_key(headers: Mapping[str, str], body: Any) -> str | None:
    """The affinity key of a request with these headers and decoded JSON body."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value and value.strip():
            return f"h:{value.strip()}"
    if not isinstance(body, dict):
        return None
    for key in ("user", "prompt_cache_key", "previous_response_id"):
        value = body.get(key)
        if isinstance(value, str) and value:
            return f"{key}:{value}"
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str) and metadata["user_id"]:
        return f"user:{metadata['user_id']}"
    start = _conversation_start(body)
    if start is None:
        return None
    return "start:" + hashlib.blake2b(start[:_START_BYTES].encode("utf-8", "replace"), digest_size=16).hexdigest()


def _conversation_start(body: dict[str, Any]) -> str | None:
    """The system prompt and the first user turn as one text, from whichever field the
    dialect keeps them in: `messages` (OpenAI chat, Anthropic, Ollama), `system`
    (Anthropic, Ollama's generate), `instructions` and `input` (Responses)."""
    parts: list[str] = []
    for key in ("system", "instructions"):
        if (text := _text(body.get(key))) is not None:
            parts.append(text)
    if isinstance(prompt := body.get("prompt"), str):  # a completion: its head is its start
        parts.append(prompt)
    turns = body.get("messages", body.get("input"))
    if isinstance(turns, str):
        parts.append(turns)
    elif isinstance(turns, list):
        for turn in turns:
            if not isinstance(turn, dict):
                continue
            text = _text(turn.get("content"))
            if text is None:
                continue
            parts.append(f"{turn.get('role')}:{text}")
            if turn.get("role") == "user":
                break  # the first user turn: the later ones differ from turn to turn
    return "\n".join(parts) if parts else None


def _text(value: Any) -> str | None:
    """A content field as text: a string, or the text parts of a list of parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = [p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(texts) if texts else None
    return None
