"""router/api/openai/logprobs.py: OpenAI's two logprobs shapes (issue 10, item 4)."""

from __future__ import annotations

from router.api.openai.logprobs import chat_logprobs, completion_logprobs, token_text
from worker.protocol import TokenLogprob, TopLogprob


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


def test_a_token_string_is_its_bytes_as_utf8() -> None:
    assert token_text(b"\xe2\x82\xac") == "€"
