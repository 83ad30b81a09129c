"""llama-server's own request bodies (/completion, /tokenize, /detokenize, /apply-template)
and its error body.

Every parameter llama-server's README lists for /completion is accepted by name (what each
does is router/api/llama/translate.py's); names outside the README are refused, as on the
OpenAI routes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from router.api.openai import schemas
from router.api.openai.schemas import Int32

# Ids travel as msgpack integers and are checked against the vocabulary in the worker; this
# bound only keeps a huge JSON integer a 400 here.
TokenId = Int32


class NativeCompletionRequest(schemas.SamplingFields, forbid_unknown_fields=True):
    """POST /completion. The sampling parameters and their defaults are the OpenAI routes'
    (which are llama-server's); what follows is /completion's own."""

    prompt: str | list[Any] | dict[str, Any] = ""
    return_tokens: bool = False
    id_slot: Int32 = -1  # accepted, ignored: the slot with the longest cached prefix is taken
    # Accepted with no effect on what is generated.
    n_keep: Int32 = 0
    n_discard: Int32 = 0
    n_cache_reuse: Int32 = 0
    min_keep: Int32 = 0
    t_max_prompt_ms: Int32 = 0
    t_max_predict_ms: Int32 = 0
    samplers: list[str] | str | None = None
    return_progress: bool = False
    post_sampling_probs: bool = False
    sse_ping_interval: float | None = None
    response_fields: list[str] | None = None  # honoured: the final answer holds only these
    # Samplers Corral does not have: accepted at their disabled values only.
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    mirostat: Int32 = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: Int32 = 2
    dry_penalty_last_n: Int32 = -1
    dry_sequence_breakers: list[str] | None = None
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    n_probs: Int32 = 0
    n_indent: Int32 = 0
    n_cmpl: Int32 = 1
    lora: list[Any] | None = None


# Each sampler Corral lacks, with the value that turns it off.
class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """llama-server's /tokenize, plus `model` to route by."""

    content: str
    model: str | None = None  # None: the server's default model
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    tokens: list[TokenId]
    model: str | None = None


class ApplyTemplateRequest(msgspec.Struct, forbid_unknown_fields=True):
    """What shapes a chat's prompt, as llama-server's /apply-template reads it from a chat
    body: the messages, the tools offered and the extra template variables."""

    messages: list[dict[str, Any]]
    model: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


class SlotsQuery(msgspec.Struct, forbid_unknown_fields=True):
    """GET /slots's and /props's query string."""

    model: str | None = None
    fail_on_no_slot: str | None = None


class NativeErrorDetail(msgspec.Struct):
    code: int  # the HTTP status, as llama-server writes it
    message: str
    type: str
    param: str | None = None  # Corral's addition: the parameter to fix
    n_prompt_tokens: int | None = None  # exceed_context_size_error only
    n_ctx: int | None = None


class NativeErrorBody(msgspec.Struct):
    """Every error on llama-server's own routes (router/api/llama/errors.py)."""

    error: NativeErrorDetail


class ModelActionRequest(msgspec.Struct, forbid_unknown_fields=True):
    """POST /models/load and /models/unload, as llama-server's router mode takes them."""

    model: str


class RerankRequest(msgspec.Struct, forbid_unknown_fields=True):
    """POST /rerank: Jina/Cohere's body, or TEI's (`texts`); router/api/llama/rerank.py."""

    query: str
    model: str | None = None
    documents: Any = None  # Jina/Cohere: a list of strings
    texts: Any = None  # TEI's name for them; the answer is then TEI's shape
    top_n: Int32 | None = None
    return_documents: bool = False
    return_text: bool = False  # TEI's


class NativeEmbeddingRequest(msgspec.Struct, forbid_unknown_fields=True):
    """POST /embedding and /embeddings (llama-server's native embeddings): `input` or
    `content`, each taking every prompt shape /completion takes."""

    input: str | list[Any] | dict[str, Any] | None = None
    content: str | list[Any] | dict[str, Any] | None = None
    model: str | None = None
    embd_normalize: Annotated[int, msgspec.Meta(ge=-1, le=64)] = 2
    # Checked as llama-server checks it, with no effect: the native answer is floats.
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None


class InfillRequest(NativeCompletionRequest, forbid_unknown_fields=True):
    """POST /infill: /completion's body, and the code around the gap (llama-server's
    handle_infill): `input_prefix` and `input_suffix` (texts, or ids and texts mixed),
    `input_extra` (files of context: `{"filename", "text"}`), `prompt` (a text that
    continues the prefix)."""

    input_prefix: str | list[Any] | None = None
    input_suffix: str | list[Any] | None = None
    input_extra: Any = None
