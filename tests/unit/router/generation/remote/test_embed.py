"""An OpenAI embeddings answer read for Ollama's routes (router/generation/remote/embed.py):
one vector of numbers per input, placed by its index, or refused as broken."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.generation.remote.embed import read


def _answer(data: Any, usage: Any = None) -> bytes:
    return json.dumps({"object": "list", "data": data, **({"usage": usage} if usage is not None else {})}).encode()


def test_vectors_are_placed_by_their_index() -> None:
    got = read(_answer([{"index": 1, "embedding": [1, 2]}, {"index": 0, "embedding": [0.5, 3]}], {"prompt_tokens": 4}), 2)
    assert got.data == [[0.5, 3.0], [1.0, 2.0]] and got.prompt_tokens == 4
    assert read(_answer([{"embedding": [1]}]), 1).prompt_tokens == 0  # no usage, no index: in order


@pytest.mark.parametrize("raw, why", [
    (b"<html>", "not JSON"),
    (_answer([{"index": 0, "embedding": [1]}]), "1 embeddings for 2 inputs"),
    (_answer([{"index": 0, "embedding": [1]}, {"index": 0, "embedding": [2]}]), "wrong index"),
    (_answer([{"index": 0, "embedding": [1]}, {"index": 5, "embedding": [2]}]), "wrong index"),
    (_answer([{"index": 0, "embedding": "AAAA"}, {"index": 1, "embedding": [2]}]), "not a list of numbers"),
    (_answer([{"index": 0, "embedding": [True]}, {"index": 1, "embedding": [2]}]), "not a list of numbers"),
])
def test_an_answer_that_is_not_the_vectors_asked_for_is_refused(raw: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        read(raw, 2)
