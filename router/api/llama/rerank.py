"""Reranking as llama-server serves it (POST /rerank, /reranking, /v1/rerank,
/v1/reranking): the Jina/Cohere shape (`query`, `documents`, `top_n`, `return_documents`)
and Hugging Face TEI's (`texts`, `return_text`), for a model with `pooling = "rank"`. The
worker scores each document against the query (worker/embed_inputs.py lays them out as
llama-server does); this module reads the body and shapes the answer (server-common.cpp,
format_response_rerank): sorted by score, best first, cut to `top_n`. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from router.api.llama.schemas import RerankRequest
from supervisor.errors import InvalidRequest

MAX_DOCUMENTS = 1024


@dataclass(frozen=True)
class Rerank:
    query: str
    documents: list[str]
    top_n: int
    tei: bool  # answer in TEI's shape (a bare list, `score`)
    with_text: bool


def read(r: RerankRequest) -> Rerank:
    """The request, checked: 400 naming the parameter for anything else."""
    tei = r.texts is not None and r.documents is None
    param = "texts" if tei else "documents"
    docs = r.texts if tei else r.documents
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
        raise InvalidRequest(f"'{param}' must be a non-empty array of strings.", param)
    if len(docs) > MAX_DOCUMENTS:
        raise InvalidRequest(f"'{param}' holds at most {MAX_DOCUMENTS} documents.", param)
    if r.top_n is not None and r.top_n < 0:
        raise InvalidRequest(f"Invalid 'top_n': expected a value >= 0, got {r.top_n}.", "top_n")
    top_n = len(docs) if r.top_n is None else min(r.top_n, len(docs))
    return Rerank(r.query, docs, top_n, tei, r.return_text if tei else r.return_documents)


def answer(rr: Rerank, scores: list[list[float]], prompt_tokens: int, model: str) -> Any:
    """llama-server's answer: each document's index and its score (the first of its
    scores), best first, `top_n` of them."""
    label = "score" if rr.tei else "relevance_score"
    ranked = sorted(range(len(rr.documents)), key=lambda i: -(scores[i][0] if scores[i] else 0.0))
    results: list[dict[str, Any]] = []
    for i in ranked[: rr.top_n]:
        item: dict[str, Any] = {"index": i, label: scores[i][0] if scores[i] else 0.0}
        if rr.with_text:
            if rr.tei:
                item["text"] = rr.documents[i]
            else:
                item["document"] = {"text": rr.documents[i]}
        results.append(item)
    if rr.tei:
        return results
    return {
        "model": model,
        "object": "list",
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        "results": results,
    }
