"""An embedding request's inputs, from texts, token arrays or llama-server's mixed prompts
to the token lists an EmbedJob embeds (stage 1 of worker/prompts.py's two): every input
must fit one batch, or is cut to it when the request says so.
"""

from __future__ import annotations

from worker.protocol import Embed
from worker.rejected import RequestRejected
from worker.request import EmbedJob
from worker.text_limits import Limit, Texts, VocabModel, check_ids, checked


def _embed_limit(i: int, n_batch: int, cut: bool = False) -> Limit:
    """Input i's bound: one batch. "too large" as llama-server words it (its
    test_embedding_error_prompt_too_long reads it)."""
    return Limit(n_batch, f"input[{i}]", f"too large: this model embeds at most {n_batch}", "input", cut=cut)


def embed_texts(e: Embed, m: VocabModel, n_batch: int) -> Texts:
    """Stage 1 of an embedding request: every input must fit one batch."""
    if e.rank_query is not None:
        return _rerank_texts(e, e.rank_query, m, n_batch)
    if e.parts is not None:
        return _embed_parts(e, m, n_batch)
    if e.tokens is not None:
        return _embed_tokens(e, m, n_batch)
    texts = []
    for i, text in enumerate(e.inputs):
        if not text:
            raise RequestRejected("invalid_request", f"input[{i}] is empty", "input")
        limit = _embed_limit(i, n_batch, e.truncate)
        texts.append(checked(text, limit, m))

    def build(tokens: list[list[int]]) -> EmbedJob:
        for i, toks in enumerate(tokens):
            if not toks:
                raise RequestRejected("invalid_request", f"input[{i}] makes no tokens", "input")
        return EmbedJob(id=e.id, inputs=tokens, normalize=e.normalize)

    return Texts(texts, build)


def _embed_parts(e: Embed, m: VocabModel, n_batch: int) -> Texts:
    """Mixed inputs (llama-server's tokenize_input_subprompt): each a list of token ids and
    texts. Ids are checked now; the texts are tokenized in stage 2, a text that comes
    first in its input with BOS; each input is then checked, or cut, as a text is."""
    inputs = [list(p) for p in e.parts or []]
    if not inputs:
        raise RequestRejected("invalid_request", "input is empty", "input")
    texts: list[tuple[str, Limit]] = []
    adds: list[bool] = []
    for i, parts in enumerate(inputs):
        if not parts:
            raise RequestRejected("invalid_request", f"input[{i}] is empty", "input")
        check_ids(parts, m.n_vocab, "input")
        limit = _embed_limit(i, n_batch, e.truncate)
        for j, p in enumerate(parts):
            if isinstance(p, str):
                texts.append(checked(p, limit, m))
                adds.append(j == 0)

    def build(tokens: list[list[int]]) -> EmbedJob:
        pieces = iter(tokens)
        out: list[list[int]] = []
        for i, parts in enumerate(inputs):
            toks: list[int] = []
            for p in parts:
                toks.extend(next(pieces) if isinstance(p, str) else [p])
            if not toks:
                raise RequestRejected("invalid_request", f"input[{i}] makes no tokens", "input")
            if len(toks) > n_batch and e.truncate:
                toks = toks[:n_batch]
            elif len(toks) > n_batch:
                raise _embed_limit(i, n_batch).refuse(len(toks))
            out.append(toks)
        return EmbedJob(id=e.id, inputs=out, normalize=e.normalize)

    return Texts(texts, build, add_special=adds)


def _rerank_texts(e: Embed, query: str, m: VocabModel, n_batch: int) -> Texts:
    """A rerank: one input per document, laid out as llama-server lays a query and a
    document out for a reranker (worker/text_limits.py, RerankShape), each within a batch."""
    if not e.inputs:
        raise RequestRejected("invalid_request", "documents is empty", "documents")
    shape = m.rerank_shape
    if shape.template is not None:
        texts = [shape.template.replace("{query}", query).replace("{document}", doc) for doc in e.inputs]
        limits = [_embed_limit(i, n_batch) for i in range(len(texts))]

        def build_templated(tokens: list[list[int]]) -> EmbedJob:
            return EmbedJob(id=e.id, inputs=tokens, scores=True)

        # Tokenized as llama-server does it: no BOS added, special tokens parsed.
        return Texts([checked(t, lim, m) for t, lim in zip(texts, limits)], build_templated, add_special=False)
    pieces = [query, *e.inputs]
    limit = _embed_limit(0, n_batch)

    def build(tokens: list[list[int]]) -> EmbedJob:
        q, docs = tokens[0], tokens[1:]
        out = []
        for i, d in enumerate(docs):
            toks = [shape.bos] if shape.bos is not None else []
            toks += q
            toks += [shape.eos] if shape.eos is not None else []
            toks += [shape.sep] if shape.sep is not None else []
            toks += d
            toks += [shape.eos] if shape.eos is not None else []
            if len(toks) > n_batch:
                raise _embed_limit(i, n_batch).refuse(len(toks))
            out.append(toks)
        return EmbedJob(id=e.id, inputs=out, scores=True)

    return Texts([checked(p, limit, m) for p in pieces], build, add_special=False, parse_special=False)


def _embed_tokens(e: Embed, m: VocabModel, n_batch: int) -> Texts:
    """Token-array inputs: checked as texts are once tokenized, and against the vocabulary."""
    inputs = [list(t) for t in e.tokens or []]
    if not inputs:
        raise RequestRejected("invalid_request", "input is empty", "input")
    for i, toks in enumerate(inputs):
        if not toks:
            raise RequestRejected("invalid_request", f"input[{i}] is empty", "input")
        if len(toks) > n_batch and e.truncate:
            inputs[i] = toks[:n_batch]
        elif len(toks) > n_batch:
            raise _embed_limit(i, n_batch).refuse(len(toks))
        check_ids(toks, m.n_vocab, "input")

    def build(_: list[list[int]]) -> EmbedJob:
        return EmbedJob(id=e.id, inputs=inputs, normalize=e.normalize)

    return Texts([], build)


# The most values one request's per-token embeddings (pooling = "none") may hold: each is
# a Python float in the worker and about 20 bytes of JSON in the answer, so 4M values are
# some 130 MB in the worker and 80 MB on the wire. Without a bound, 100 inputs of 2,048
# tokens from a 4,096-wide model asked for 800M values in one request: gigabytes, and the
# worker's end.
MAX_PER_TOKEN_VALUES = 4_000_000


def check_per_token_size(job: EmbedJob, n_embd: int) -> None:
    """Refuse a per-token embedding request whose answer would be too large."""
    n_tokens = sum(len(t) for t in job.inputs)
    if n_tokens * n_embd > MAX_PER_TOKEN_VALUES:
        raise RequestRejected(
            "invalid_request",
            f"per-token embeddings of {n_tokens} tokens would be {n_tokens * n_embd} values "
            f"({n_embd} a token); at most {MAX_PER_TOKEN_VALUES} a request: send fewer or shorter inputs",
            "input",
        )
