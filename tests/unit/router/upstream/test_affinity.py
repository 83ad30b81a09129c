"""router/upstream/affinity.py: which conversation a request belongs to."""

from __future__ import annotations

from router.upstream.affinity import session_key


def chat(*turns: tuple[str, str], **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in turns], **extra}


def test_a_session_header_wins_over_everything_in_the_body() -> None:
    body = chat(("user", "hi"), user="alice")
    assert session_key({"x-session-id": " s1 "}, body) == session_key({"x-session-id": "s1"}, {}) == "h:s1"
    assert session_key({"x-conversation-id": "c"}, body) == "h:c"
    assert session_key({"x-session-id": "  "}, body) == "user:alice"  # blank: not a session


def test_the_body_names_its_user_in_each_dialects_field() -> None:
    assert session_key({}, chat(("user", "hi"), user="alice")) == "user:alice"
    assert session_key({}, {"metadata": {"user_id": "alice"}, "messages": []}) == "user:alice"  # Anthropic's
    assert session_key({}, {"prompt_cache_key": "k1", "input": "x"}) == "prompt_cache_key:k1"
    assert session_key({}, {"previous_response_id": "resp_1", "input": "x"}) == "previous_response_id:resp_1"


def test_every_turn_of_a_conversation_has_the_key_of_its_start() -> None:
    first = chat(("system", "be terse"), ("user", "name a colour"))
    later = chat(("system", "be terse"), ("user", "name a colour"), ("assistant", "red"), ("user", "another"))
    other = chat(("system", "be terse"), ("user", "name a fruit"))
    assert session_key({}, first) == session_key({}, later) != session_key({}, other)
    assert session_key({}, first) is not None
    # Anthropic keeps the system prompt apart; content may be a list of text parts.
    a = {"system": "be terse", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    b = {"system": "be terse", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    assert session_key({}, a) == session_key({}, b) != session_key({}, {**b, "system": "be kind"})


def test_responses_and_completions_start_from_their_own_fields() -> None:
    assert session_key({}, {"instructions": "x", "input": "hello"}) == session_key({}, {"instructions": "x", "input": "hello"})
    assert session_key({}, {"input": "hello"}) != session_key({}, {"input": "bye"})
    long = "shared head " * 1000
    # A completion's key is its prompt's head: prompts that differ only past it share one.
    assert session_key({}, {"prompt": long + "a"}) == session_key({}, {"prompt": long + "b"})
    assert session_key({}, {"prompt": "a"}) != session_key({}, {"prompt": "b"})


def test_nothing_to_go_by_gives_none() -> None:
    assert session_key({}, {"model": "m", "input": 3}) is None
    assert session_key({}, ["not", "an", "object"]) is None
    assert session_key({}, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}) is None
