"""Speculative decoding by n-gram lookup on the real demo model (issue 24, item 4): the same
tokens as without it, fewer steps, and the KV invariant intact.

A code-editing prompt (a file, then "write it again with one change") makes the model
repeat long spans of its input, which n-gram drafts guess. The drafted engine answers alone
and four at once what a plain one answers alone, up to the plain answer's first near tie
(past it, batch shapes alone may flip a token, drafted or not); sampled requests run too.
After each load every sequence's cells are what its books say (the cells of rejected draft
tokens were given back).
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.e2e.conftest import DEMO_MODEL
from tests.e2e.engine_driver import EngineDriver
from tests.e2e.test_kv_mixes import MIN_MARGIN
from worker.protocol import WorkerSpec

CODE = '''def total(items):
    result = 0
    for item in items:
        result += item.price * item.count
    return result


def average(items):
    if not items:
        return 0
    return total(items) / len(items)
'''


@pytest.fixture(scope="module")
def drivers() -> Iterator[tuple[EngineDriver, EngineDriver]]:
    if not DEMO_MODEL.is_file():
        pytest.fail(f"demo model missing at {DEMO_MODEL}: run `make model` (make test does)")
    spec = WorkerSpec(name="spec", path=str(DEMO_MODEL), slots=4, n_ctx=4096)
    yield EngineDriver(spec, draft_max=0), EngineDriver(spec, draft_max=8)


def prompts(d: EngineDriver) -> list[list[int]]:
    asks = [
        "Rename the function total to sum_prices. Write the whole file again.",
        "Add a docstring to average. Write the whole file again.",
        "Write the file again exactly as it is.",
        "Change result to acc everywhere. Write the whole file again.",
    ]
    return [
        d.model.tokenize(f"<start_of_turn>user\n```python\n{CODE}```\n{a}<end_of_turn>\n<start_of_turn>model\n```python\n",
                         add_special=True, parse_special=True)
        for a in asks
    ]


def answers(d: EngineDriver, tokens: list[list[int]], temperature: float) -> list[list[int]]:
    outs = [d.generate(t, 80, temperature, seed=11 if temperature else None)[1] for t in tokens]
    for o in outs:
        assert o.done.wait(300) and o.error is None, o.error
    return [o.tokens[0] for o in outs]


def decided(d: EngineDriver, tokens: list[int]) -> list[int]:
    """The greedy answer alone, up to its first near tie: llama.cpp's CPU logits for the
    same context differ by up to 0.3 between batch shapes (tests/e2e/test_kv_mixes.py), so
    a token whose margin is smaller may differ between any two runs, drafted or not."""
    o = d.run_alone(tokens, 80)
    out = []
    for tok, lp in zip(o.tokens[0], o.logprobs[0]):
        if lp.logprob - max(t.logprob for t in lp.top if t.token != lp.token) < MIN_MARGIN:
            break
        out.append(tok)
    return out


def test_drafts_change_no_token_and_leave_the_cells_as_the_books_say(drivers: tuple[EngineDriver, EngineDriver]) -> None:
    plain, drafted = drivers
    tokens = prompts(plain)
    want = [decided(plain, t) for t in tokens]
    assert sum(len(w) for w in want) >= 60, f"too few decided tokens to compare: {[len(w) for w in want]}"
    for batch in ([0], [0, 1, 2, 3]):  # alone, then four at once
        got = answers(drafted, [tokens[i] for i in batch], 0.0)
        for i, g in zip(batch, got):
            assert g[: len(want[i])] == want[i], f"prompt {i}: speculation changed a decided token"
        drafted.wait_idle()
        assert drafted.cell_problems() == []
    # Sampled: each draft token is kept only where the model's own sample equals it.
    answers(drafted, tokens, 0.8)
    drafted.wait_idle()
    assert drafted.cell_problems() == []
    spec = drafted.engine.spec
    assert spec.drafted > 0 and spec.accepted > 0, "the code-editing prompts drafted nothing"
    assert plain.engine.spec.drafted == 0
    assert drafted.engine.kv.repairs == 0
