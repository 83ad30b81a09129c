"""M-RoPE images (the Qwen2-VL family) in the worker's engine: an image's n tokens take only
n_pos positions (a 4 x 3 grid: 12 tokens on 4), and every later token sits n - n_pos before
its index (worker/kv_positions.py). llama.cpp accepts a text batch at a wrong position and
answers from it silently, so each rule that places, cuts or copies cells is checked here
against a fresh engine's answer, on a random-weight qwen2vl model and projector
(bench/qwen_vl.py; issue 42, "M-RoPE models advance positions by the chunk's n_pos").

- the cells hold what the books say, position by position (tests/e2e/engine_driver.py's
  expected_cells), after every request and under pressure;
- two image requests at once answer as each alone; a second turn with the same image reuses
  the image's cells and answers as a fresh engine does; a prompt that shares the image but
  not the text after it keeps the image and decodes the rest at the right positions;
- decoded beside the engine (worker/media/beside.py) or in place, the same answer.
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from bench import qwen_vl
from tests.e2e.engine_driver import EngineDriver, Outcome
from worker.kv_positions import position
from worker.media.spans import is_placeholder
from worker.prompt_cache import CacheOptions
from worker.protocol import MEDIA_MARKER, WorkerSpec

# Cheap here (a 64-wide model): five times the gemma mixes' count.
MIXES = 5 * int(os.environ.get("CORRAL_IMAGE_MIXES", "4"))
N_TOKENS, N_POS = 12, 4  # a 32 x 24 image: 8 x 6 patches, merged 2 x 2 to a 4 x 3 grid


def turn(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


ASK = turn(f"look at this{MEDIA_MARKER} and tell me what it shows")
OTHER = turn(f"look at this{MEDIA_MARKER} and count the things in it please")


def picture(seed: int) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 255, (24, 32, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return qwen_vl.write_pair(tmp_path_factory.mktemp("qwen2vl"))


def driver(pair: tuple[Path, Path], cache: CacheOptions | None = None, **options: object) -> EngineDriver:
    text, proj = pair
    spec = WorkerSpec(name="q", path=str(text), mmproj=str(proj), spec_type="none", **options)  # type: ignore[arg-type]
    return EngineDriver(spec, cache)


def done(o: Outcome) -> Outcome:
    assert o.done.wait(120), "the request did not finish"
    assert o.error is None, o.error
    return o


def answer(d: EngineDriver, prompt: str, seed: int, n: int = 8) -> list[tuple[int, float]]:
    o = done(d.generate([], n, prompt=prompt, media=[picture(seed)], logprobs=1)[1])
    return [(lp.token, lp.logprob) for lp in o.logprobs[0]]


def same(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    """The same tokens, and logprobs equal but for the last bits that a batch of one token
    and one of the whole prompt round differently (a wrong position moves them by far more:
    tests/e2e/test_images_mrope.py was run with positions taken as indices, and failed)."""
    return [t for t, _ in a] == [t for t, _ in b] and all(abs(x - y) < 1e-4 for (_, x), (_, y) in zip(a, b))


def test_the_model_is_m_rope_and_an_image_takes_n_pos_positions(pair: tuple[Path, Path]) -> None:
    d = driver(pair, slots=1, n_ctx=512)
    assert d.model.attention.mrope and d.projector is not None and d.projector.mrope
    done(d.generate([], 4, prompt=ASK, media=[picture(1)])[1])
    d.wait_idle()
    books = list(d.engine.slots[0].cache)
    assert sum(map(is_placeholder, books)) == N_TOKENS
    # The cells end N_TOKENS - N_POS positions before the books' length.
    assert d.engine.kv.span(d.engine.slots[0])[1] == len(books) - 1 - (N_TOKENS - N_POS)
    assert position(books, len(books), True) == len(books) - (N_TOKENS - N_POS)
    assert d.cell_problems() == []


def test_two_image_requests_at_once_answer_as_each_alone(pair: tuple[Path, Path]) -> None:
    alone = [answer(driver(pair, slots=2, n_ctx=512), ASK, seed) for seed in (1, 2)]
    d = driver(pair, slots=2, n_ctx=512)
    both = [d.generate([], 8, prompt=ASK, media=[picture(seed)], logprobs=1)[1] for seed in (1, 2)]
    for o, solo in zip(both, alone):
        assert same([(lp.token, lp.logprob) for lp in done(o).logprobs[0]], solo)
    assert alone[0] != alone[1]  # the image reaches the answer
    d.wait_idle()
    assert d.cell_problems() == []


def test_cached_images_and_the_text_after_them_sit_where_a_fresh_engine_puts_them(pair: tuple[Path, Path]) -> None:
    d = driver(pair, slots=1, n_ctx=512)
    first = answer(d, ASK, 3)
    again = d.generate([], 8, prompt=ASK, media=[picture(3)], logprobs=1)[1]
    assert same([(lp.token, lp.logprob) for lp in done(again).logprobs[0]], first)
    assert again.cached[0] > N_TOKENS  # the image's cells were kept
    # The same image, other text after it: the image is kept, the rest cut at a position
    # (not an index) and decoded after it.
    shared = d.generate([], 8, prompt=OTHER, media=[picture(3)], logprobs=1)[1]
    fresh = answer(driver(pair, slots=1, n_ctx=512), OTHER, 3)
    assert same([(lp.token, lp.logprob) for lp in done(shared).logprobs[0]], fresh)
    assert shared.cached[0] > N_TOKENS
    d.wait_idle()
    assert d.cell_problems() == []


def test_decoded_beside_the_engine_or_in_place_the_same_answer(pair: tuple[Path, Path]) -> None:
    answers = []
    for beside in (True, False):
        d = driver(pair, slots=1, n_ctx=512)
        images = d.engine.images
        assert images is not None and images.encoder.beside is not None
        if not beside:
            images.encoder.beside = None
        answers.append(answer(d, ASK, 4))
        if beside:
            assert images.encoder.beside is not None and images.encoder.beside.decoded == 1
    assert same(answers[0], answers[1])  # beside, the text after the image is a batch of its own


asks = st.lists(
    st.tuples(
        st.sampled_from(["ask", "other", "text"]),
        st.integers(0, 3),  # which image
        st.integers(4, 60),  # max_tokens
        st.sampled_from([None, None, 0.02, 0.1]),  # cancel after
        st.sampled_from([1, 1, 2]),  # n
    ),
    min_size=3,
    max_size=7,
)
CANARY: dict[str, list[int]] = {}


@pytest.fixture(scope="module")
def pressed(pair: tuple[Path, Path]) -> Iterator[EngineDriver]:
    # 256 cells for 3 slots: parked entries go to host memory and back, slots are purged and
    # requests preempted, with images' cells among them.
    d = driver(pair, CacheOptions(ram_bytes=1 << 24), slots=3, n_ctx=256, n_batch=64)
    CANARY["fresh"] = [t for t, _ in answer(driver(pair, slots=3, n_ctx=256, n_batch=64), ASK, 9)]
    yield d


@settings(max_examples=MIXES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mix=asks)
def test_m_rope_mixes_keep_cells_where_the_books_say(
    pressed: EngineDriver, mix: list[tuple[str, int, int, float | None, int]]
) -> None:
    d = pressed
    outcomes = []
    for kind, which, max_tokens, cancel, n in mix:
        if kind == "text":
            rid, o = d.generate(d.model.tokenize(turn("tell me a story about a river")), max_tokens, n=n, temperature=0.7, seed=which)
        else:
            prompt = ASK if kind == "ask" else OTHER
            rid, o = d.generate([], max_tokens, prompt=prompt, media=[picture(which)], n=n, temperature=0.7, seed=which)
        outcomes.append(o)
        if cancel is not None:
            time.sleep(cancel)
            d.cancel(rid)
    for o in outcomes:
        assert o.done.wait(120), "a request did not finish"
        assert o.error is None or "length" in o.error, o.error
    d.wait_idle()
    assert d.cell_problems() == []
    # A later greedy answer is a fresh engine's, whatever the mix left in the cache: its
    # tokens (the logprobs' last bits follow the cells' layout, which the mix changed).
    assert [t for t, _ in answer(d, ASK, 9)] == CANARY["fresh"], "a mix changed a later answer"
    d.wait_idle()
    assert d.cell_problems() == []
