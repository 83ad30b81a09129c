"""router/generation/stream.py: a chat choice's logprobs leave with the text they are for.

Found by the fuzz at 1,000 requests (tests/e2e/test_fuzz.py): a chat with tools and
logprobs, cut by max_tokens while the model wrote a generic-format call, answered empty
content with logprobs for the tokens `{"tool_calls`. The parser held that text back and
the cut dropped it, but its logprobs had gone out on an empty delta at once. docs/api.md
says the logprobs a client receives cover exactly the tokens whose text it received.
"""

from __future__ import annotations

from router.generation.chat_output import ChatOutput
from router.generation.events import Delta, ReasoningDelta, TextDelta, ToolCallStart
from router.generation.stream import _chat_deltas
from worker.protocol import FinishReason, TokenEvent, TokenLogprob, ToolFormat


class Gen:
    def __init__(self) -> None:
        self.ended: list[int] = []

    def end_choice(self, index: int) -> None:
        self.ended.append(index)


def run(pieces: list[str], finish: FinishReason, tools: ToolFormat = "hermes") -> list[Delta]:
    """Each piece one token and one step, the last step final with `finish`."""
    out = ChatOutput(tools=tools, reasoning=False, declared=["lookup"])
    gen = Gen()
    deltas: list[Delta] = []
    for i, piece in enumerate(pieces):
        ev = TokenEvent(id=1, text=piece, tokens=[i], finish_reason=finish if i == len(pieces) - 1 else None)
        lp = (TokenLogprob(token=i, piece=piece.encode(), logprob=-0.5),)
        deltas += _chat_deltas(gen, out, ev, lp, None)  # type: ignore[arg-type]
    return deltas


def covered(deltas: list[Delta]) -> str:
    return b"".join(lp.piece for d in deltas if isinstance(d, (TextDelta, ReasoningDelta, ToolCallStart)) for lp in d.logprobs).decode()


def text(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, (TextDelta, ReasoningDelta)))


def test_a_call_cut_by_max_tokens_takes_its_logprobs_with_it() -> None:
    deltas = run(["Sure", ". ", "<tool", "_call>", '{"name": "look'], "length")
    assert text(deltas) == "Sure. " and covered(deltas) == "Sure. "


def test_a_call_cut_at_once_leaves_no_logprobs() -> None:
    deltas = run(['{"', "tool", "_calls"], "length", tools="generic")
    assert text(deltas) == "" and covered(deltas) == ""


def test_held_text_that_is_no_call_goes_out_with_every_logprob() -> None:
    deltas = run(["a ", "<to", "ol", " b"], "stop")
    assert text(deltas) == covered(deltas) == "a <tool b"


def test_a_whole_call_keeps_its_tokens_logprobs_on_its_start() -> None:
    call = ["<tool_call>", '{"name": "lookup", ', '"arguments": {"q": 1}}', "</tool_call>"]
    deltas = run(["Hi ", *call], "stop")
    assert text(deltas) == "Hi "
    assert covered(deltas) == "Hi " + "".join(call)
    starts = [d for d in deltas if isinstance(d, ToolCallStart)]
    assert len(starts) == 1 and starts[0].name == "lookup"


def test_every_logprob_leaves_once_in_order_and_with_its_text() -> None:
    """A token whose text straddles what went out and what the cut dropped (" <" here,
    its space content, its "<" the start of a call) goes out with its first part."""
    pieces = ["x", " <", "too", "l_c", "all>", '{"na', "z"]
    for finish in ("length", "stop"):
        deltas = run(pieces, finish)  # type: ignore[arg-type]
        tokens = [lp.token for d in deltas if isinstance(d, (TextDelta, ReasoningDelta, ToolCallStart)) for lp in d.logprobs]
        assert tokens == sorted(set(tokens))
        if finish == "stop":  # nothing dropped: every token, with all of the text
            assert covered(deltas) == text(deltas) == "".join(pieces)
        else:
            assert (text(deltas), covered(deltas)) == ("x ", "x <")
