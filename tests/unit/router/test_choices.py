"""router/generation/choices.py: the choices of a response, the two logprobs shapes and the usage of
n choices over several prompts (issue 10, item 4)."""

from __future__ import annotations

from router.generation.choices import Choices, chat_logprobs, completion_logprobs, merged_usage, token_text
from worker.protocol import TokenEvent, TokenLogprob, TopLogprob, Usage


def tok(piece: bytes, logprob: float = -0.5, top: int = 2) -> TokenLogprob:
    alts = [TopLogprob(token=t, piece=b"alt%d" % t, logprob=-1.0 - t) for t in range(top)]
    return TokenLogprob(token=9, piece=piece, logprob=logprob, top=alts)


def test_chat_shape_has_token_bytes_and_top_logprobs() -> None:
    shape = chat_logprobs([tok(b"Hi"), tok(b" \xf0\x9f")])
    assert shape["refusal"] is None
    first, second = shape["content"]  # type: ignore[misc]
    assert first == {
        "token": "Hi",
        "logprob": -0.5,
        "bytes": [72, 105],
        "top_logprobs": [
            {"token": "alt0", "logprob": -1.0, "bytes": list(b"alt0")},
            {"token": "alt1", "logprob": -2.0, "bytes": list(b"alt1")},
        ],
    }
    # Part of a character: the string has a replacement character, the bytes are exact.
    assert second["token"] == " \ufffd" and second["bytes"] == [32, 0xF0, 0x9F]


def test_legacy_shape_counts_offsets_from_where_the_tokens_start() -> None:
    shape, end = completion_logprobs([tok(b"ab"), tok(b"cde", top=1)], offset=5)
    assert shape == {
        "tokens": ["ab", "cde"],
        "token_logprobs": [-0.5, -0.5],
        "top_logprobs": [{"alt0": -1.0, "alt1": -2.0}, {"alt0": -1.0}],
        "text_offset": [5, 7],
    }
    assert end == 10


def test_usage_counts_each_prompt_once_and_sums_completions() -> None:
    finals = {
        0: Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=4),
        1: Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=10),  # shared the prompt
        2: Usage(prompt_tokens=7, completion_tokens=1, cached_tokens=0),
        3: Usage(prompt_tokens=7, completion_tokens=2, cached_tokens=7),
    }
    assert merged_usage(finals, n=2) == Usage(prompt_tokens=17, completion_tokens=11, cached_tokens=4)
    assert merged_usage({0: finals[0]}, n=1) == finals[0]


def test_choices_collect_text_echo_and_logprobs_by_index() -> None:
    c = Choices()
    c.add(TokenEvent(id=1, index=1, text="x", echo="P:", logprobs=[tok(b"x")]))
    c.add(TokenEvent(id=1, index=0, text="a"))
    c.add(TokenEvent(id=1, index=1, text="y", finish_reason="stop", usage=Usage(prompt_tokens=2, completion_tokens=2)))
    c.add(TokenEvent(id=1, index=0, text="b", finish_reason="length", usage=Usage(prompt_tokens=2, completion_tokens=2)))
    first, second = c.ordered()
    assert (first.index, first.text, first.finish_reason) == (0, "ab", "length")
    assert (second.index, second.text, second.finish_reason, len(second.logprobs)) == (1, "P:xy", "stop", 1)
    assert c.usage(n=2) == Usage(prompt_tokens=2, completion_tokens=4)
    assert token_text(b"\xe2\x82\xac") == "€"
