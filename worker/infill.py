"""llama-server's /infill prompt, laid out as its format_prompt_infill does
(tools/server/server-common.cpp): fill-in-the-middle tokens around the code before and
after the gap, after any files of context.

    [FIM_REP "myproject\\n"] ([FIM_SEP NAME "\\n"] | "\\n\\n--- snippet ---\\n\\n") TEXT ... [FIM_SEP "filename\\n"]
    [BOS] FIM_PRE PREFIX PROMPT FIM_SUF SUFFIX FIM_MID

Budgets, in n_batch tokens: the prefix keeps its last 3/4 of a batch, the suffix its first
1/4 less the prompt and two; the context files keep their last tokens, as many as the
context has room for beyond a batch and twice the answer. The prefix, suffix and files are
tokenized without special tokens (code may contain `<|fim_prefix|>` as text); the prompt
with them, as llama-server does. Pure: the tokens come from stage 2 (worker/text_limits.py).
"""

from __future__ import annotations

from typing import Callable

from worker.fim_tokens import NO_TOKEN, FimTokens
from worker.protocol import Generate, Infill
from worker.rejected import RequestRejected
from worker.request import Request
from worker.text_limits import Limit, Texts, VocabModel, check_ids, checked

def infill_texts(
    g: Generate, m: VocabModel, fim: FimTokens, bos: int | None, n_ctx_slot: int, n_batch: int, n_predict: int,
    build_request: Callable[[Generate, list[int]], Request],
) -> Texts:
    """Stage 1 of an /infill: every text bounded, ids checked; stage 2 lays them out."""
    assert g.infill is not None
    spec: Infill = g.infill
    if (why := fim.missing()):
        raise RequestRejected("unsupported", f"Infill is not supported by this model: {why}", "model")
    limit = Limit(n_ctx_slot - 1, "the infill prompt", f"this model's context holds {n_ctx_slot} tokens", "input_prefix", n_ctx_slot)
    check_ids(spec.prefix, m.n_vocab, "input_prefix")
    check_ids(spec.suffix, m.n_vocab, "input_suffix")
    # The texts, in order: the repo header, each file's head and text, the closing header,
    # the prefix's and suffix's strings, the prompt.
    # Code before and after the gap and the files of context are cut, not refused: an
    # editor sends whole files (llama.vim sends many chunks of them), and only the end of
    # the prefix, the start of the suffix and the end of the context are kept below. Each
    # is cut to the bytes that can make the tokens kept, so none costs more to tokenize
    # than a context's worth.
    widest = m.max_token_bytes()
    keep = n_ctx_slot * widest if widest else None
    texts: list[str] = []
    if fim.rep != NO_TOKEN:
        texts.append("myproject\n")
    for chunk in spec.extra:
        texts.append(f"{chunk.filename}\n" if fim.sep != NO_TOKEN else "\n\n--- snippet ---\n\n")
        texts.append(_tail(chunk.text, keep))
    if fim.sep != NO_TOKEN:
        texts.append("filename\n")
    texts += [_tail(p, keep) for p in spec.prefix if isinstance(p, str)]
    texts += [_head(p, keep) for p in spec.suffix if isinstance(p, str)]
    pieces = [(t, _UNBOUNDED) for t in texts]
    pieces.append(checked(spec.prompt, limit, m))  # the prompt is the gap's start: refused when too long
    parse = [False] * len(texts) + [True]  # only the prompt reads special tokens

    def build(tokens: list[list[int]]) -> Request:
        it = iter(tokens)
        extra: list[int] = []
        if fim.rep != NO_TOKEN:
            extra += [fim.rep, *next(it)]
        for _ in spec.extra:
            head, text = next(it), next(it)
            extra += ([fim.sep] if fim.sep != NO_TOKEN else []) + head + text
        if fim.sep != NO_TOKEN:
            extra += [fim.sep, *next(it)]
        prefix = [t for p in spec.prefix for t in ([p] if isinstance(p, int) else next(it))]
        suffix = [t for p in spec.suffix for t in ([p] if isinstance(p, int) else next(it))]
        prompt = next(it)
        n_prefix = min(len(prefix), 3 * (n_batch // 4))
        n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
        n_extra = min(max(0, n_ctx_slot - n_batch - 2 * n_predict), len(extra))
        inp = [fim.pre, *prefix[len(prefix) - n_prefix :], *prompt]
        end = [fim.suf, *suffix[:n_suffix]]
        if bos is not None:
            inp.insert(0, bos)
        # llama-server's budget can overrun the context by a few tokens (n_predict -1 adds
        # two); the context files give way, so that the prompt fits with room to answer.
        n_extra = min(n_extra, max(0, n_ctx_slot - 2 - len(inp) - len(end)))
        laid = [*extra[len(extra) - n_extra :], *inp, *end, fim.mid]
        if len(laid) > limit.most:
            raise limit.refuse(len(laid))
        return build_request(g, laid)

    return Texts(pieces, build, add_special=False, parse_special=parse)


# The texts cut by bytes above: tokenized whole, whatever their count (the budgets cut them).
_UNBOUNDED = Limit(2**62, "an infill text", "", "input_extra")


def _tail(text: str, n_bytes: int | None) -> str:
    data = text.encode()
    if n_bytes is None or len(data) <= n_bytes:
        return text
    return data[len(data) - n_bytes :].decode(errors="ignore")


def _head(text: str, n_bytes: int | None) -> str:
    data = text.encode()
    if n_bytes is None or len(data) <= n_bytes:
        return text
    return data[:n_bytes].decode(errors="ignore")
