"""From a request's text to its tokens, with the length checks that protect the worker.

Tokenizing is the one cost a request's text imposes before it is known to fit, and that cost
grows with the text: about 1.4 µs a byte on the demo model, and quadratically with special
tokens (600 KB of `<start_of_turn>` takes 5.6 s). So a text that cannot fit is refused by
its length alone, before it is tokenized. Every token covers at most `max_token_bytes` bytes
of text, so n bytes make at least ceil(n / max_token_bytes) tokens. The bound errs in one
direction only: it never refuses a text that would fit. A text it lets through is tokenized
and checked exactly.

Preparing a request therefore has two stages, which worker/preparer.py runs on two threads:
1. `*_texts`: render the chat template and check byte lengths. This holds the GIL, so it
   must run at full priority, but it is cheap per byte (a 15 MB prompt costs milliseconds).
2. `Texts.tokenize`: tokenize (llama.cpp drops the GIL) and check exact counts, then build
   the Request, EmbedJob or TokenizeResult.

The limits and the two stages' types are in worker/text_limits.py; an embedding's inputs
are prepared in worker/embed_inputs.py. Pure logic over the `TextModel` protocol, so it is
tested with a fake tokenizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from worker import chat_formats
from worker.adapter_turns import adapter_set, scope_suffix
from worker.chat_template import ChatTemplate, TemplateError, TemplateTooLong
from worker.protocol import (
    Detokenize,
    DetokenizeResult,
    Embed,
    Generate,
    Render,
    Rendered,
    Tokenize,
    TokenizeResult,
    fewest_tokens,
)
from worker.embed_inputs import embed_texts
from worker.infill import infill_texts
from worker.media.prompt import media_texts
from worker.rejected import RequestRejected
from worker.request import Request
from worker.stops import StopMatcher
from worker.text_limits import Limit, TextModel, Texts, VocabModel, check_ids, checked

if TYPE_CHECKING:
    from worker.media.projector import Projector

# Pooling types whose output is one vector per input, which is what /v1/embeddings returns.
EMBEDDING_POOLINGS = ("mean", "cls", "last")


def generate_texts(
    g: Generate, m: VocabModel, n_ctx_slot: int, n_batch: int = 2048, projector: Projector | None = None
) -> Texts:
    """Stage 1 of a generation: the prompt rendered and its length bounded."""
    param = "messages" if g.messages is not None else "prompt"
    limit = Limit(
        n_ctx_slot - 1,
        "the prompt",
        f"this model's context holds {n_ctx_slot} tokens, prompt and output together",
        param,
        n_ctx_slot,
    )
    if g.params.logit_bias_text:
        g = _bias_texts_tokenized(g, m)
    if g.params.logit_bias:
        check_ids(list(g.params.logit_bias), m.n_vocab, "logit_bias")
    if g.n < 1:
        raise RequestRejected("invalid_request", "n must be at least 1", "n")
    if g.prompt_parts is not None or g.prompt_tokens is not None:
        if g.media:
            raise RequestRejected("invalid_request", "a prompt of token ids cannot hold images or audio", g.media[0].param)
        return _mixed_texts(g, m, n_ctx_slot, limit)
    if g.infill is not None:
        n_predict = g.params.max_tokens if g.params.max_tokens is not None else -1
        return infill_texts(
            g, m, m.fim, m.bos_id, n_ctx_slot, n_batch, n_predict,
            lambda g2, prompt: _request(g2, prompt, n_ctx_slot, "input_prefix", None),
        )
    in_reasoning = False
    if g.messages is None:
        text = g.prompt or ""
    else:
        template = _chat_template(m, g.tools)
        fmt = template.format
        bound = m.max_token_bytes()
        try:
            text = template.render(
                g.messages, limit.most * bound if bound else None, g.tools, g.template_kwargs, g.add_generation_prompt
            )
        except TemplateTooLong as exc:
            raise limit.refuse(fewest_tokens(exc.n_bytes, bound), at_least=True) from None
        except TemplateError as exc:
            raise RequestRejected("invalid_request", f"chat template: {exc}", "messages") from None
        if fmt.reasoning:
            # The opening tag must come from the generation prompt or the prefill, the
            # text after the last message the model answers: a generous bound on those.
            prefill = chat_formats.prefill_of(g.messages)
            in_reasoning = chat_formats.ends_in_reasoning(
                text, 64 + (len(prefill.content) if prefill else 0), fmt.reasoning_tags
            )

    def request(tokens: list[int]) -> Request:
        return _request(g, tokens, n_ctx_slot, param, text if g.echo else None, in_reasoning)

    media = list(g.media or []) + [md for msg in g.messages or [] for md in msg.media or []]
    if media:
        return media_texts(media, m, projector, text, limit, param, request)
    return Texts([checked(text, limit, m)], lambda tokens: request(tokens[0]))


def _bias_texts_tokenized(g: Generate, m: TextModel) -> Generate:
    """llama-server's text keys in logit_bias: every token of each text gets its bias
    (tokenized without BOS, special tokens as plain text, as common_tokenize(..., false)
    does). The router bounds how many texts and how long."""
    bias = dict(g.params.logit_bias)
    for text, value in g.params.logit_bias_text.items():
        for token in m.tokenize(text, add_special=False, parse_special=False):
            bias[token] = value
    params = msgspec.structs.replace(g.params, logit_bias=bias, logit_bias_text={})
    return msgspec.structs.replace(g, params=params)


def _request(
    g: Generate, prompt: list[int], n_ctx_slot: int, param: str, echo: str | None, in_reasoning: bool = False
) -> Request:
    if not prompt:
        raise RequestRejected("invalid_request", "the prompt is empty", param)
    room = n_ctx_slot - len(prompt)
    adapters = adapter_set(g.adapters)
    p = g.params
    max_new = room if p.max_tokens is None else min(p.max_tokens, room)
    return Request(
        id=g.id, params=p, prompt=prompt, max_new=max_new, stops=StopMatcher(tuple(p.stop)),
        in_reasoning=in_reasoning, n=g.n, echo=echo, request_id=g.request_id,
        scope=g.cache_scope + scope_suffix(adapters), rank=g.priority, adapters=adapters,
    )


def _mixed_texts(g: Generate, m: VocabModel, n_ctx_slot: int, limit: Limit) -> Texts:
    """Stage 1 of a prompt with token ids: OpenAI's token arrays (`prompt_tokens`), or
    llama-server's mixed prompt (`prompt_parts`, ids and strings). Ids are checked against
    the vocabulary now, the strings among them tokenized in stage 2 (only a string that
    comes first gets BOS), and the whole checked against the context once joined."""
    parts: list[int | str] = list(g.prompt_parts if g.prompt_parts is not None else g.prompt_tokens or [])
    check_ids(parts, m.n_vocab, "prompt")
    ids = sum(1 for p in parts if isinstance(p, int))
    if ids > limit.most:
        raise limit.refuse(ids)
    strings = [p for p in parts if isinstance(p, str)]
    texts = [checked(s, limit, m) for s in strings]
    adds = [i == 0 for i, p in enumerate(parts) if isinstance(p, str)]

    def build(tokens: list[list[int]]) -> Request:
        pieces = iter(tokens)
        prompt: list[int] = []
        for p in parts:
            if isinstance(p, int):
                prompt.append(p)
            else:
                prompt.extend(next(pieces))
        if len(prompt) > limit.most:
            raise limit.refuse(len(prompt))
        return _request(g, prompt, n_ctx_slot, "prompt", m.output_text(prompt) if g.echo else None)

    return Texts(texts, build, add_special=adds)



def tokenize_texts(t: Tokenize, m: VocabModel, n_ctx_slot: int, projector: Projector | None = None) -> Texts:
    """Stage 1 of POST /tokenize. A text longer than any prompt this model can take is
    refused rather than tokenized: it cannot be a prompt, and tokenizing it costs without
    bound."""
    limit = Limit(
        n_ctx_slot, "the text", f"/tokenize takes at most {n_ctx_slot} tokens with this model (its context)",
        "content", n_ctx_slot,
    )
    if t.media:  # a chat's input tokens, its images counted as a prompt takes them
        return media_texts(
            t.media, m, projector, t.text, limit, "messages", lambda tokens: TokenizeResult(id=t.id, tokens=tokens)
        )

    def build(tokens: list[list[int]]) -> TokenizeResult:
        if not t.with_pieces:
            return TokenizeResult(id=t.id, tokens=tokens[0])
        return TokenizeResult(id=t.id, tokens=tokens[0], pieces=[piece(m.token_text(tok)) for tok in tokens[0]])

    return Texts([checked(t.text, limit, m)], build, add_special=t.add_special, parse_special=t.parse_special)


def piece(data: bytes) -> str | list[int]:
    """A token's text as llama-server's /tokenize shows it: a string where its bytes are
    valid UTF-8 on their own, else the bytes (half of a character split across tokens)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def detokenize_texts(d: Detokenize, m: VocabModel) -> Texts:
    """POST /detokenize: ids checked now (stage 1); the text made in stage 2, where the
    C call drops the GIL on the low-priority thread."""
    check_ids(d.tokens, m.n_vocab, "tokens")
    return Texts([], lambda _: DetokenizeResult(id=d.id, content=m.detokenize(d.tokens)))


def _chat_template(m: TextModel, tools: list[dict[str, Any]] | None) -> ChatTemplate:
    """The model's chat template, if it can render a chat with these tools."""
    if m.template is None:
        raise RequestRejected(
            "unsupported",
            "this model has no chat template; set chat_template in its config or use "
            "/v1/completions",
            "messages",
        )
    if tools and m.template.format.tools is None:
        raise RequestRejected(
            "unsupported",
            "this model's built-in chat template cannot take tools; set tool_format = "
            '"generic" or a Jinja chat_template in its config',
            "tools",
        )
    return m.template


def render_texts(r: Render, m: TextModel) -> Texts:
    """POST /apply-template: the chat template rendered here, in stage 1 (it holds the GIL);
    nothing is tokenized."""
    try:
        prompt = _chat_template(m, r.tools).render(
            r.messages, tools=r.tools, template_kwargs=r.template_kwargs, add_generation_prompt=r.add_generation_prompt
        )
    except TemplateError as exc:
        raise RequestRejected("invalid_request", f"chat template: {exc}", "messages") from None
    return Texts([], lambda _: Rendered(id=r.id, prompt=prompt))


def pooling_problem(pooling: str, native: bool = False) -> str | None:
    """Why a model with this pooling cannot answer an embedding request, or None if it can
    (`native`: llama-server's /embedding, which answers pooling = "none" with a vector per
    token; /v1/embeddings cannot)."""
    if pooling in EMBEDDING_POOLINGS or (native and pooling == "none"):
        return None
    if pooling == "rank":
        why = "'rank' pooling makes a reranker's relevance score (served on /rerank), not an embedding"
    else:
        # llama-server's words (server-context.cpp, handle_embeddings_impl)
        why = "Pooling type 'none' is not OAI compatible: it gives one vector per token (served on /embedding)"
    return f"{why}; /v1/embeddings needs pooling = mean, cls or last in this model's config"


def texts_for(
    frame: Generate | Embed | Tokenize | Detokenize | Render, m: VocabModel, n_ctx_slot: int, n_batch: int,
    projector: Projector | None = None,
) -> Texts:
    """Stage 1 for any request frame."""
    if isinstance(frame, Generate):
        return generate_texts(frame, m, n_ctx_slot, n_batch, projector)
    if isinstance(frame, Embed):
        return embed_texts(frame, m, n_batch)
    if isinstance(frame, Detokenize):
        return detokenize_texts(frame, m)
    if isinstance(frame, Render):
        return render_texts(frame, m)
    return tokenize_texts(frame, m, n_ctx_slot, projector)
