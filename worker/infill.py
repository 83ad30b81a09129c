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
    texts: list[str] = []
    if fim.rep != NO_TOKEN:
        texts.append("myproject\n")
    for chunk in spec.extra:
        texts.append(f"{chunk.filename}\n" if fim.sep != NO_TOKEN else "\n\n--- snippet ---\n\n")
        texts.append(chunk.text)
    if fim.sep != NO_TOKEN:
        texts.append("filename\n")
    texts += [p for p in spec.prefix if isinstance(p, str)]
    texts += [p for p in spec.suffix if isinstance(p, str)]
    texts.append(spec.prompt)
    parse = [False] * (len(texts) - 1) + [True]  # only the prompt reads special tokens

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
        laid = [*extra[len(extra) - n_extra :], *inp, *end, fim.mid]
        if len(laid) > limit.most:
            raise limit.refuse(len(laid))
        return build_request(g, laid)

    return Texts([checked(t, limit, m) for t in texts], build, add_special=False, parse_special=parse)
