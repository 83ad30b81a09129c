"""Speculative decoding with a draft model (worker/draft_model.py): the output is the one
the model gives without drafts, the draft context keeps to its books, and a draft model
whose vocabulary differs is refused at load, naming draft_model."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cut_layers import cut
from tests.e2e.conftest import DEMO_MODEL
from tests.e2e.engine_driver import EngineDriver
from tests.e2e.test_kv_mixes import CANARY_TEXT, CANARY_TOKENS
from worker.model import LoadError
from worker.protocol import WorkerSpec


def spec(**kw: object) -> WorkerSpec:
    return WorkerSpec(name="demo", path=str(DEMO_MODEL), slots=2, n_ctx=2048, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain() -> EngineDriver:
    return EngineDriver(spec(spec_type="none"))


def long_prompt(d: EngineDriver) -> list[int]:
    # Longer than a batch (512): the draft context catches up over two steps.
    code = (Path(__file__).resolve().parents[2] / "worker" / "kv_entries.py").read_text()[:2500]
    return d.model.tokenize(
        "<start_of_turn>user\nRepeat this code exactly:\n" + code + "<end_of_turn>\n<start_of_turn>model\n",
        add_special=True, parse_special=True,
    )


@pytest.mark.parametrize("layers", [None, 6])
def test_drafts_change_no_token_and_the_draft_books_hold(plain: EngineDriver, tmp_path: Path, layers: int | None) -> None:
    """None: the model drafts for itself (every guess right but for numerics); 6: its first
    six layers (bench/cut_layers.py), a real smaller draft model."""
    draft = DEMO_MODEL if layers is None else cut(DEMO_MODEL, tmp_path / "draft.gguf", layers)
    d = EngineDriver(spec(draft_model=str(draft)))
    assert d.draft is not None
    canary = d.model.tokenize(CANARY_TEXT, add_special=True, parse_special=True)
    want = plain.run_alone(canary, CANARY_TOKENS).tokens[0]
    for _ in range(2):  # the second time, the draft context keeps the canary's prefix
        assert d.run_alone(canary, CANARY_TOKENS).tokens[0] == want
    _, o = d.generate(long_prompt(d), 48)
    assert o.done.wait(300) and o.error is None, o.error
    assert len(o.tokens[0]) == 48
    d.wait_idle()
    assert d.cell_problems() == []
    assert d.draft.repairs == 0
    assert d.draft.decoded > len(long_prompt(d))  # it caught up on the prompt, then drafted
    if layers is None:
        assert d.engine.spec.accepted >= 0.5 * d.engine.spec.drafted > 0


def test_a_draft_model_with_another_vocabulary_is_refused_naming_it(tmp_path: Path) -> None:
    other = cut(DEMO_MODEL, tmp_path / "other.gguf", 2, tokens={1000: "not-the-same-token"})
    with pytest.raises(LoadError) as err:
        EngineDriver(spec(draft_model=str(other)))
    assert "draft_model" in err.value.message and "token 1000" in err.value.message
