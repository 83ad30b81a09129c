"""The worker's llama.cpp helpers against the real library and the demo model."""

from __future__ import annotations

import codecs
from typing import Iterator

import pytest

from supervisor.config.templates import BUILTIN_CHAT_TEMPLATES
from tests.e2e.conftest import DEMO_MODEL
from worker.chat_template import BuiltinTemplate, builtin_names
from worker.model import LoadedModel, load
from worker.protocol import ChatMessage, WorkerSpec


def test_supervisor_template_list_matches_llama_cpp() -> None:
    # The supervisor validates chat_template without importing llama_cpp; its copy of the
    # list must follow the installed library.
    assert BUILTIN_CHAT_TEMPLATES == frozenset(builtin_names())


@pytest.fixture(scope="module")
def model() -> Iterator[LoadedModel]:
    if not DEMO_MODEL.is_file():
        pytest.fail(f"demo model missing at {DEMO_MODEL}: run `make model`")
    m = load(WorkerSpec(name="t", path=str(DEMO_MODEL), slots=1, n_ctx=256), lambda p: None)
    yield m
    m.close()


def test_pieces_longer_than_32_bytes_are_not_truncated(model: LoadedModel) -> None:
    # llama-cpp-python's own helper pads to 32 bytes and silently truncates longer pieces.
    long_pieces = [t for t in range(model.n_vocab) if len(model.piece(t)) > 32]
    assert long_pieces, "gemma's vocabulary has pieces longer than 32 bytes"
    for t in long_pieces[:50]:
        assert len(model.piece(t)) > 32


def test_detokenize_round_trips_text_with_emoji(model: LoadedModel) -> None:
    text = "Hello, wörld! 🦙🚀 東京"
    tokens = model.tokenize(text, add_special=False, parse_special=False)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    # Token by token, as streaming does: emoji arrive as single-byte pieces and must never
    # produce a replacement character midway.
    out = "".join(decoder.decode(model.piece(t)) for t in tokens)
    out += decoder.decode(b"", final=True)
    assert out == text


def test_tokenize_grows_its_buffer_for_long_text(model: LoadedModel) -> None:
    text = "🦙" * 500  # several tokens per character: more tokens than bytes/4
    tokens = model.tokenize(text, add_special=True)
    assert len(tokens) > 100
    assert tokens[0] == 2  # BOS


def test_builtin_gemma_template(model: LoadedModel) -> None:
    rendered = BuiltinTemplate("gemma").render(
        [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi")]
    )
    assert rendered.endswith("<start_of_turn>model\n")
    assert "Hi" in rendered and "Be brief." in rendered


async def test_a_real_worker_changes_threads_live_and_costs_about_its_estimate() -> None:
    """SetThreads reaches llama.cpp between decodes (Pong reads it back from the context),
    generation goes on, and the supervisor's pre-load estimate (file + KV cache) is within
    reach of what the loaded worker really holds."""
    import psutil
    import trio

    from supervisor.launcher import open_worker, default_worker_command, stop_worker
    from supervisor.config.gguf_meta import estimate_bytes
    from tests.process.support import generate
    from worker.protocol import Ping, SetThreads

    spec = WorkerSpec(name="t", path=str(DEMO_MODEL), slots=2, n_ctx=2048, threads=2)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            conn = await open_worker(nursery, spec, default_worker_command(), lambda: None)

            async def pong() -> int:
                before = conn.stats
                conn.send(Ping(seq=1))
                while conn.stats is before:
                    await trio.sleep(0.01)
                assert conn.stats is not None
                return conn.stats.threads

            assert await pong() == 2
            conn.send(SetThreads(n_threads=1))
            text, last = await generate(conn, max_tokens=8)
            assert last.finish_reason == "length" and text
            assert await pong() == 1
            assert conn.process is not None
            rss = psutil.Process(conn.process.pid).memory_info().rss
            # A generating worker builds the structured-output vocabulary at load.
            estimate = estimate_bytes(DEMO_MODEL, spec.n_ctx, generates=True)
            print(f"rss={rss} estimate={estimate} ratio={estimate / rss:.2f}")
            assert 0.8 * rss < estimate < 1.25 * rss, (estimate, rss)
            await stop_worker(conn, 5.0)


def test_no_text_makes_fewer_tokens_than_the_length_bound_says(model: LoadedModel) -> None:
    """The length bound that refuses a long prompt before tokenizing it (issue 8,
    finding 3) must never refuse one that fits: every text makes at least
    ceil(bytes / max_token_bytes) tokens. Tried on the texts that pack most bytes into a
    token: whitespace runs, repeated words, the longest tokens themselves, special tokens."""
    from worker.protocol import fewest_tokens

    bound = model.max_token_bytes()
    assert bound is not None and 16 <= bound <= 256  # gemma's longest is 48 bytes
    longest = [t for t in range(model.n_vocab) if len(model.piece(t)) >= bound - 8][:200]
    texts = [
        " " * 5000,
        "\n" * 5000,
        "\t" * 3000,
        "a" * 5000,
        "the " * 2000,
        "<start_of_turn>" * 500,
        "<start_of_turn>user\n" * 300,
        "…" * 3000,
        "".join(model.piece(t).decode("utf-8", errors="ignore") for t in longest) * 3,
        "🦙" * 1000,
    ]
    for text in texts:
        n_bytes = len(text.encode())
        for add_special in (True, False):
            tokens = model.tokenize(text, add_special=add_special)
            assert len(tokens) >= fewest_tokens(n_bytes, bound), (text[:40], len(tokens), n_bytes)
