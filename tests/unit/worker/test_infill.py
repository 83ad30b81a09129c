"""Issue 22, item 4: llama-server's /infill prompt (tools/server/server-common.cpp,
format_prompt_infill), laid out with a fake vocabulary: one token per byte, the FIM
tokens 900 to 904. Checks the order, which pieces read special tokens, and the budgets."""

from __future__ import annotations

import pytest

from worker.fim_tokens import NO_TOKEN, FimTokens
from worker.infill import infill_texts
from worker.protocol import Generate, Infill, InfillChunk, SamplingParams
from worker.rejected import RequestRejected
from worker.request import Request

FIM = FimTokens(pre=900, suf=901, mid=902, rep=903, sep=904)
BOS = 2


class Bytes:
    """One token per byte; `special` records which texts were read for special tokens."""

    n_vocab = 1000
    template = None

    def __init__(self) -> None:
        self.special: list[str] = []

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        assert not add_special  # /infill adds no BOS to any piece; it places its own
        if parse_special:
            self.special.append(text)
        return list(text.encode())

    def max_token_bytes(self) -> int | None:
        return 1

    def detokenize(self, tokens: list[int]) -> str:
        return ""

    def token_text(self, token: int) -> bytes:
        return b""


def laid_out(infill: Infill, fim: FimTokens = FIM, n_batch: int = 64, n_ctx: int = 512, n_predict: int = -1) -> tuple[list[int], Bytes]:
    m = Bytes()
    g = Generate(id=1, params=SamplingParams(), infill=infill)
    texts = infill_texts(g, m, fim, BOS, n_ctx, n_batch, n_predict, lambda g2, prompt: Request(
        id=g2.id, params=g2.params, prompt=prompt, max_new=1, stops=None,  # type: ignore[arg-type]
    ))
    request = texts.tokenize(m)
    assert isinstance(request, Request)
    return request.prompt, m


def b(text: str) -> list[int]:
    return list(text.encode())


def test_prefix_prompt_suffix_middle_in_llama_servers_order() -> None:
    """PSM: [BOS] <PRE> prefix prompt <SUF> suffix <MID>; the prompt follows the prefix
    (server-common.cpp, whatever the README draws), and only it reads special tokens."""
    prompt, m = laid_out(Infill(prefix=["def f():\n", 7], suffix=["\nreturn"], prompt="<x>"), fim=FimTokens(pre=900, suf=901, mid=902))
    assert prompt == [BOS, 900, *b("def f():\n"), 7, *b("<x>"), 901, *b("\nreturn"), 902]
    assert m.special == ["<x>"]


def test_context_files_go_first_with_the_repository_tokens() -> None:
    infill = Infill(prefix=["a"], suffix=["b"], extra=[InfillChunk(text="x = 1", filename="lib.py")])
    prompt, _ = laid_out(infill)
    extra = [903, *b("myproject\n"), 904, *b("lib.py\n"), *b("x = 1"), 904, *b("filename\n")]
    assert prompt == [*extra, BOS, 900, *b("a"), 901, *b("b"), 902]
    # Without FIM_REP and FIM_SEP each file is set off by a snippet line
    plain, _ = laid_out(infill, fim=FimTokens(pre=900, suf=901, mid=902))
    assert plain[: len(b("\n\n--- snippet ---\n\nx = 1"))] == b("\n\n--- snippet ---\n\nx = 1")


def test_budgets_keep_the_prefixs_end_the_suffixs_start_and_the_contexts_end() -> None:
    """n_batch 64: the prefix keeps its last 48 tokens, the suffix its first 16 - 2 - |prompt|;
    the context files their last n_ctx - n_batch - 2 n_predict."""
    infill = Infill(prefix=["p" * 100 + "END"], suffix=["START" + "s" * 100], prompt="ab",
                    extra=[InfillChunk(text="c" * 500, filename="f")])
    prompt, _ = laid_out(infill, fim=FimTokens(pre=900, suf=901, mid=902, sep=904), n_batch=64, n_ctx=512, n_predict=100)
    pre, suf = prompt.index(900), prompt.index(901)
    assert prompt[pre + 1 : suf] == [*b(("p" * 100 + "END")[-48:]), *b("ab")]
    assert prompt[suf + 1 : -1] == b(("START" + "s" * 100)[:12])
    assert len(prompt[: pre - 1]) == 512 - 64 - 200  # BOS sits right before <PRE>


def test_a_model_without_fim_tokens_is_refused_in_llama_servers_words() -> None:
    with pytest.raises(RequestRejected, match="prefix token is missing. suffix token is missing. middle token is missing. "):
        laid_out(Infill(prefix=["a"], suffix=["b"]), fim=FimTokens())
    assert FimTokens(pre=1, suf=2, mid=NO_TOKEN).missing() == "middle token is missing. "


def test_long_code_and_context_are_cut_not_refused() -> None:
    """An editor sends whole files: llama-server keeps the prefix's end, the suffix's start
    and the context's end, and so does Corral, tokenizing no more than a context's worth of
    each (here one byte a token: 512 bytes), and the prompt always fits with room to answer."""
    infill = Infill(prefix=["a" * 5000 + "END"], suffix=["START" + "b" * 5000], prompt="",
                    extra=[InfillChunk(text="c" * 5000 + "LAST", filename="f")])
    prompt, m = laid_out(infill, fim=FimTokens(pre=900, suf=901, mid=902), n_batch=64, n_ctx=512, n_predict=-1)
    assert len(prompt) <= 512 - 1
    assert prompt[prompt.index(900) + 1 : prompt.index(900) + 1 + 48][-3:] == b("END")
    assert prompt[prompt.index(901) + 1 : prompt.index(901) + 6] == b("START")
    assert bytes(prompt[prompt.index(BOS) - 4 : prompt.index(BOS)]) == b"LAST"
