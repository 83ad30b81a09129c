"""Images in the worker's engine, in this process (tests/e2e/engine_driver.py), where the
slots' books and the KV cells can be looked at between requests (issue 42, "In the worker").

- An image's embeddings go into its own request's sequence only: two image requests run
  together answer as each does alone, logprobs and all (to their last bits).
- The same image on a fresh engine gives bit-identical logprobs; another image does not.
- Under pressure (a KV cache a few prompts wide, preemption, cancellations, n > 1), every
  sequence's books and cells agree, image cells included, and no sequence ever holds part
  of an image: each run of placeholder ids in a slot's or an entry's books is one whole
  image's (worker/media/spans.py).
- A request waiting for its image to be encoded holds no one else up.
"""

from __future__ import annotations

import io
import os
import time
from typing import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from bench import projector
from tests.e2e.conftest import DEMO_MODEL
from tests.e2e.engine_driver import EngineDriver, Outcome
from worker.media.pictures import decode
from worker.media.spans import placeholders
from worker.prompt_cache import CacheOptions
from worker.protocol import MEDIA_MARKER, WorkerSpec

MIXES = int(os.environ.get("CORRAL_IMAGE_MIXES", "4"))
PROMPT = f"<start_of_turn>user\nWhat is in this picture?{MEDIA_MARKER}<end_of_turn>\n<start_of_turn>model\n"
# With text after the image long enough that a step's batch of it alone and beside another
# request's take the same matrix kernels: llama.cpp's CPU sums differ in their last bits
# between a batch of 6 rows and one of 12 (a text prompt's too), and the random projector's
# large embeddings make such bits move a logprob. With this prompt, two image requests at
# once match their solo runs bit for bit, which is what sequence isolation is measured by.
LONG = (
    f"<start_of_turn>user\nWhat is in this picture?{MEDIA_MARKER} Please describe every detail of it, the colours, "
    "the shapes, and what it may mean to you.<end_of_turn>\n<start_of_turn>model\n"
)
TEXT = "<start_of_turn>user\nTell me a story about a red fox and a river.<end_of_turn>\n<start_of_turn>model\n"


def picture(seed: int) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 255, (48 + seed % 3 * 16, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("mmproj") / "mmproj-test.gguf"
    projector.write(path)
    return str(path)


def driver(mmproj: str, cache: CacheOptions | None = None, **options: object) -> EngineDriver:
    if not DEMO_MODEL.is_file():
        pytest.fail(f"demo model missing at {DEMO_MODEL}: run `make model` (make test does)")
    return EngineDriver(WorkerSpec(name="v", path=str(DEMO_MODEL), mmproj=mmproj, **options), cache)  # type: ignore[arg-type]


def done(o: Outcome) -> Outcome:
    assert o.done.wait(120), "the request did not finish"
    assert o.error is None, o.error
    return o


def logprobs(o: Outcome) -> list[tuple[int, float]]:
    return [(lp.token, lp.logprob) for lp in o.logprobs[0]]


@pytest.fixture(scope="module")
def engine(mmproj: str) -> Iterator[EngineDriver]:
    yield driver(mmproj, slots=4, n_ctx=2048, spec_type="none")


def test_two_images_at_once_answer_as_each_does_alone(mmproj: str) -> None:
    alone = []
    for seed in (1, 2):
        d = driver(mmproj, slots=2, n_ctx=1024, spec_type="none")
        alone.append(logprobs(done(d.generate([], 6, prompt=LONG, media=[picture(seed)], logprobs=2)[1])))
    d = driver(mmproj, slots=2, n_ctx=1024, spec_type="none")
    both = [d.generate([], 6, prompt=LONG, media=[picture(seed)], logprobs=2)[1] for seed in (1, 2)]
    # Each image decoded beside the engine comes back when its thread is done, so which
    # steps the two requests' text after it shares varies from run to run, and with it the
    # last bits of CPU sums: the same tokens, logprobs to 1e-3 (an image in the wrong
    # sequence moves them by whole units).
    for o, solo in zip(both, alone):
        got = logprobs(done(o))
        assert [t for t, _ in got] == [t for t, _ in solo]
        assert all(abs(a - b) < 1e-3 for (_, a), (_, b) in zip(got, solo)), (got, solo)
    assert alone[0] != alone[1]


def test_the_same_image_on_a_fresh_engine_gives_the_same_logprobs(engine: EngineDriver, mmproj: str) -> None:
    first = logprobs(done(engine.generate([], 4, prompt=LONG, media=[picture(5)], logprobs=2)[1]))
    fresh = driver(mmproj, slots=1, n_ctx=1024, spec_type="none")
    assert logprobs(done(fresh.generate([], 4, prompt=LONG, media=[picture(5)], logprobs=2)[1])) == first
    other = logprobs(done(fresh.generate([], 4, prompt=LONG, media=[picture(6)], logprobs=2)[1]))
    assert other[0] != first[0]


def test_usage_counts_image_tokens_and_a_repeat_reuses_them_without_encoding(engine: EngineDriver) -> None:
    image = picture(11)
    first = done(engine.generate([], 2, prompt=PROMPT, media=[image])[1])
    assert first.cached[0] == 0 or first.cached[0] < 12  # at most the text before the image
    encodes = engine.engine.images.encoder.encodes if engine.engine.images else -1
    again = done(engine.generate([], 2, prompt=PROMPT, media=[image])[1])
    prompt_tokens = len(engine.model.tokenize(PROMPT.replace(MEDIA_MARKER, ""))) + projector.SIZES["tiny"].tokens
    assert again.cached[0] >= prompt_tokens - 1  # everything but the last token, image and all
    assert engine.engine.images is not None and engine.engine.images.encoder.encodes == encodes


def test_another_keys_request_encodes_the_same_image_itself(engine: EngineDriver) -> None:
    """What one key's image left (its cells, its kept embeddings) serves that key alone: a
    reuse across keys would tell, by its speed, that the other key sent the same image."""
    images = engine.engine.images
    assert images is not None
    image = picture(31)
    done(engine.generate([], 2, prompt=PROMPT, media=[image], scope="alice")[1])
    encodes = images.encoder.encodes
    again = done(engine.generate([], 2, prompt=PROMPT, media=[image], scope="alice")[1])
    assert images.encoder.encodes == encodes and again.cached[0] > projector.SIZES["tiny"].tokens
    other = done(engine.generate([], 2, prompt=PROMPT, media=[image], scope="bob")[1])
    assert images.encoder.encodes == encodes + 1
    assert other.cached[0] < 12  # at most what the text before the image shares, never the image


def test_an_image_after_a_prompt_longer_than_the_sliding_window_is_decoded_beside(mmproj: str) -> None:
    """Past gemma-3's 512-position window the engine holds only the prompt's last
    sliding-window cells; the copy beside the engine carries those, and the cells it brings
    back (text, image, text after it) must pass the KV invariant: every full-attention
    position, and the sliding window the next token needs.

    Their values are not compared with a decode in place here: past a few hundred
    positions, this model with the random projector's large embeddings answers differently
    from the cells' mere layout (37 other tokens in the cache moved a logit by 2.8 and the
    greedy token), and two engines cannot be given the same layout. A standalone run with
    one layout (two contexts, the same cells) gave bit-identical logits at 14 and 304
    positions, and at 704 a difference no larger than that layout noise."""
    story = " ".join(f"line {i}: the fox crossed the river again." for i in range(70))
    prompt = f"<start_of_turn>user\n{story}\nNow look:{MEDIA_MARKER} What is it?<end_of_turn>\n<start_of_turn>model\n"
    d = driver(mmproj, slots=2, n_ctx=2048, spec_type="none")
    images = d.engine.images
    assert images is not None and images.encoder.beside is not None
    first = done(d.generate([], 4, prompt=prompt, media=[picture(7)])[1])
    assert images.encoder.beside.decoded == 1 and len(first.tokens[0]) == 4
    d.wait_idle()
    books = [s for s in d.engine.slots if s.cache]
    assert books and len(books[0].cache) > 600 and d.engine.kv.span(books[0])[0] > 0  # the window has moved on
    assert d.cell_problems() == []
    # The same prompt again reads its cells back, image and all, and answers as before.
    again = done(d.generate([], 4, prompt=prompt, media=[picture(7)])[1])
    assert again.cached[0] > 600 and again.tokens[0] == first.tokens[0]


@pytest.mark.parametrize("held", ["encode", "decode beside"])
def test_a_request_waiting_for_its_image_holds_no_other_stream(engine: EngineDriver, held: str) -> None:
    """While an image is encoded, or decoded beside the engine, on the encoder thread, a
    text stream's steps go on: its tokens keep arriving (that work is held back here, so
    that the wait is long)."""
    images = engine.engine.images
    assert images is not None and images.encoder.beside is not None
    owner: object = images.encoder.projector if held == "encode" else images.encoder.beside
    name = "encode" if held == "encode" else "decode"
    real = getattr(owner, name)
    release = time.monotonic() + 3.0

    def slow(*args):  # type: ignore[no-untyped-def]
        while time.monotonic() < release:
            time.sleep(0.01)
        return real(*args)

    setattr(owner, name, slow)
    try:
        _, text = engine.generate(engine.model.tokenize(TEXT), 24)
        time.sleep(0.3)
        _, image = engine.generate([], 2, prompt=PROMPT, media=[picture(21 if held == "encode" else 22)])
        done(text)
        assert not image.done.is_set(), f"the image request finished before its {held}"
        assert time.monotonic() < release, f"the text stream waited for the image's {held}"
        done(image)
    finally:
        setattr(owner, name, real)


@pytest.mark.parametrize("kv", [{}, {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "flash_attn": "on"}], ids=["f16", "q8_0"])
def test_an_image_decoded_beside_the_engine_answers_as_one_decoded_in_place(mmproj: str, kv: dict[str, str]) -> None:
    """On a CPU the image's decode runs in a second context, on the encoder thread, and its
    cells are copied into the request's sequence (worker/media/beside.py): the answer is
    the one the engine's own decode gives, bit for bit. A copy the cache refuses falls back
    to the decode in place, answering the same. With a quantized KV cache (issue 43) the
    context beside takes the same types, or no copy would fit: the cells are put in place."""
    answers = []
    for how in ("beside", "in place", "refused"):
        d = driver(mmproj, slots=2, n_ctx=1024, spec_type="none", **kv)
        images = d.engine.images
        assert images is not None and images.encoder.beside is not None
        if how == "in place":
            images.encoder.beside = None
        elif how == "refused":
            images.encoder.beside.decode = lambda span, prefix, tail: b"not a state"  # type: ignore[method-assign]
        answers.append(logprobs(done(d.generate([], 6, prompt=LONG, media=[picture(3)], logprobs=2)[1])))
        if how == "beside":
            assert images.encoder.beside is not None and images.encoder.beside.decoded == 1
            assert images.placed == 1
        assert d.cell_problems() == []
    assert answers[0] == answers[1] == answers[2]


def whole_images(cache: list[int], spans: dict[int, list[int]]) -> list[str]:
    """Every run of placeholder ids in `cache` that is not exactly one image's ids."""
    problems = []
    i = 0
    while i < len(cache):
        if cache[i] >= 0:
            i += 1
            continue
        j = i
        while j < len(cache) and cache[j] < 0:
            j += 1
        run = cache[i:j]
        # Adjacent images are possible in general; here every image has text around it.
        if run != spans.get(run[0]):
            problems.append(f"positions {i}..{j - 1}: {len(run)} placeholder ids that are not one whole image")
        i = j
    return problems


asks = st.lists(
    st.tuples(
        st.sampled_from(["image", "image", "text"]),
        st.integers(0, 5),  # which image
        st.integers(8, 120),  # max_tokens
        st.sampled_from([None, None, 0.05, 0.4]),  # cancel after
        st.sampled_from([1, 1, 2]),  # n
    ),
    min_size=3,
    max_size=7,
)


SEEN: dict[int, list[int]] = {}  # first placeholder id -> an image's ids, of every mix


# A greedy text request whose answer no mix may change (tests/e2e/test_kv_mixes.py's, whose
# first tokens are far from ties): what a fresh engine answers, asked after every mix.
CANARY_TEXT = "<start_of_turn>user\nWrite the alphabet: A B C D E F G"
CANARY: dict[str, list[int]] = {}


@pytest.fixture(scope="module")
def pressed(mmproj: str) -> Iterator[EngineDriver]:
    # A cache of 256 cells: three image prompts with their answers fill it, so that
    # parked entries go (to host memory, and back), slots are purged and requests preempted.
    d = driver(mmproj, CacheOptions(ram_bytes=1 << 26), slots=3, n_ctx=256, n_batch=64)
    CANARY["tokens"] = d.model.tokenize(CANARY_TEXT)
    CANARY["fresh"] = d.run_alone(CANARY["tokens"], 16).tokens[0]
    yield d


@settings(max_examples=MIXES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mix=asks)
def test_image_mixes_keep_books_and_cells_in_step_and_images_whole(
    pressed: EngineDriver, mix: list[tuple[str, int, int, float | None, int]]
) -> None:
    d = pressed
    assert d.projector is not None
    spans = SEEN  # the cache keeps images of earlier mixes too
    outcomes = []
    for kind, which, max_tokens, cancel, n in mix:
        if kind == "image":
            image = picture(100 + which)
            rid, o = d.generate([], max_tokens, prompt=PROMPT, media=[image], n=n, temperature=0.7, seed=which)
            # The image's ids, as the worker makes them: from its pixels and the projector.
            ids = placeholders(d.projector.digest(decode(image, "x")), projector.SIZES["tiny"].tokens)
            spans[ids[0]] = ids
        else:
            rid, o = d.generate(d.model.tokenize(TEXT), max_tokens, n=n, temperature=0.7, seed=which)
        outcomes.append(o)
        if cancel is not None:
            time.sleep(cancel)
            d.cancel(rid)
    for o in outcomes:
        assert o.done.wait(120), "a request did not finish"
        assert o.error is None or "length" in o.error, o.error
    d.wait_idle()
    assert d.cell_problems() == []
    assert d.engine.images is not None and d.engine.images.encoder.beside is not None
    assert d.engine.images.encoder.beside.decoded > 0 or not any(kind == "image" for kind, *_ in mix)
    for seq in [*d.engine.slots, *d.engine.entries.checked()]:
        assert whole_images(list(seq.cache), spans) == [], f"sequence {seq.seq_id}"
    assert d.run_alone(CANARY["tokens"], 16).tokens[0] == CANARY["fresh"], "a mix changed a later greedy answer"
    d.wait_idle()
    assert d.cell_problems() == []
