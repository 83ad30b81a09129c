"""llama-server's native embeddings (POST /embedding, /embeddings): the request read and
the answer shaped as its server-context.cpp does (handle_embeddings_impl, and
server_task_result_embd's to_json_non_oaicompat): a bare list, an entry per input, each
`{"index", "embedding"}` where `embedding` is a list of vectors: the pooled one alone, or
with pooling = "none" one per token, as the model gave them (not normalized). OpenAI's
shape is /v1/embeddings'. Pure."""

from __future__ import annotations

from typing import Any

from router.api.llama.schemas import NativeEmbeddingRequest
from router.generation.prompts import Prompt, prompt_list
from supervisor.errors import InvalidRequest
from worker.protocol import EmbedResult


def inputs(r: NativeEmbeddingRequest) -> tuple[list[Prompt], str]:
    """The inputs to embed, and the parameter they came in (`input` first, as llama-server
    reads it)."""
    param = "input" if r.input is not None else "content"
    value = r.input if r.input is not None else r.content
    if value is None:
        raise InvalidRequest('"input" or "content" must be provided', "input")
    if isinstance(value, list) and not value:
        raise InvalidRequest(f'"{param}" must not be empty', param)
    prompts = prompt_list(value, param)
    for i, p in enumerate(prompts):
        if not p:  # llama-server: "Input content cannot be empty"
            raise InvalidRequest(f"Input content cannot be empty ({param}[{i}]).", param)
    return prompts, param


def answer(result: EmbedResult) -> list[dict[str, Any]]:
    """The answer: each input's vectors, in input order."""
    if result.per_token is not None:
        return [{"index": i, "embedding": vectors} for i, vectors in enumerate(result.per_token)]
    return [{"index": i, "embedding": [vector]} for i, vector in enumerate(result.data)]
