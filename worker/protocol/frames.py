"""The frames: every message between the supervisor and a worker, each a msgspec Struct
tagged by its class name. Request-scoped frames carry the id the supervisor chose."""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec

from worker.protocol.events import TokenEvent
from worker.protocol.parameters import ChatMessage, Infill, Media, SamplingParams, ToolFormat


class Frame(msgspec.Struct, tag=True, forbid_unknown_fields=True, omit_defaults=True):
    """Base of every frame; the tag is the class name."""


# ---- supervisor -> worker ---------------------------------------------------------------------


class Generate(Frame):
    """Start a generation. Exactly one of `prompt`, `messages`, `prompt_tokens` and
    `prompt_parts` is set.

    `prompt_parts` is llama-server's mixed prompt: token ids used as they are, and strings
    tokenized in place (the first element with BOS, as llama-server's tokenize_mixed). The
    worker checks every id against its vocabulary; a bad one is a 400 naming `prompt`.

    `n` choices share the prompt: the worker evaluates it once and samples each choice with
    its own chain (seed + i where a seed is given); their events carry `index`. `echo`: the
    first event of each choice carries the prompt's text in `echo` (the router cannot
    detokenize a token prompt itself).
    """

    id: int
    params: SamplingParams
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    prompt_parts: list[int | str] | None = None
    infill: Infill | None = None  # llama-server's /infill (then nothing else is set)
    # OpenAI tool objects, validated by the router; rendered into the prompt.
    tools: list[dict[str, Any]] | None = None
    # Extra template variables (llama-server's chat_template_kwargs, e.g. enable_thinking).
    template_kwargs: dict[str, Any] | None = None
    # False: the template does not open the assistant's turn (llama-server's
    # add_generation_prompt; a chat continuing its last message needs none).
    add_generation_prompt: bool = True
    prompt_tokens: list[int] | None = None
    n: int = 1
    echo: bool = False
    # The HTTP request's id (x-request-id), for the worker's log lines about it.
    request_id: str | None = None
    # A whole answer (no stream, no tools): events may wait for the end (worker/event_hold.py).
    hold_events: bool = False
    # Whose cached prefixes this request may reuse, and whose its own cells become: the
    # router's cache scope (router/server/cache_scope.py), one per key or key group and
    # request salt. Requests of different scopes share no cells, so that no request learns
    # (from cached_tokens, or from the time its prompt took) what another key sent.
    cache_scope: str = ""
    # Its class in the slot line (supervisor/config/key_rules.py RANKS: 0 interactive, 1
    # normal, 2 batch; lower first, as vLLM's `priority`): a request waits behind those of
    # a lower rank, and one waiting with no slot free parks the newest running request of a
    # higher rank (worker/priority.py).
    priority: int = 1
    # Images, in the order their MEDIA_MARKER stands in the rendered prompt (a chat's
    # messages, or `prompt`); a model without a projector refuses them.
    media: list[Media] | None = None
    # The LoRA adapters it decodes under: (index in the worker's loaded list, scale), no
    # scale 0, by index (worker/adapter_turns.py); empty: the base model. The router
    # resolves a request's `lora`, or the served name's scales, into this.
    adapters: list[tuple[int, float]] = []


class Embed(Frame):
    """Embed texts, or (when `tokens` is set, and `inputs` empty) token arrays, or (when
    `parts` is set) llama-server's mixed prompts: token ids and texts, the texts tokenized
    in place. `truncate`: an input longer than the model embeds is cut at its end (Ollama's
    default) rather than refused."""

    id: int
    inputs: list[str]
    tokens: list[list[int]] | None = None
    truncate: bool = False
    parts: list[list[int | str]] | None = None
    # Rerank instead (a model with pooling = "rank"): each of `inputs` is a document, scored
    # against this query; EmbedResult.data holds each one's scores (one for most rerankers).
    rank_query: str | None = None
    # llama-server's embd_normalize: -1 none, 0 max-abs to int16's range, 2 Euclidean (the
    # default), p > 2 the p-norm. Pooled vectors only: per-token ones go out as they are.
    normalize: int = 2
    # llama-server's native /embedding: a model with pooling = "none" may answer, with a
    # vector per token (EmbedResult.per_token); OpenAI's shape has no place for them.
    native: bool = False


class Tokenize(Frame):
    id: int
    text: str
    add_special: bool = True
    parse_special: bool = True
    with_pieces: bool = False  # answer each token's text too (TokenizeResult.pieces)
    # Images for the text's media markers: counted as a prompt takes them (a chat's input
    # tokens), each position its placeholder id.
    media: list[Media] | None = None


class Detokenize(Frame):
    """Token ids back to text, special tokens written out (llama-server's /detokenize)."""

    id: int
    tokens: list[int]


class Render(Frame):
    """Render messages with the model's chat template (llama-server's /apply-template);
    answered with Rendered. `tools` and `template_kwargs` as in Generate: the prompt a chat
    request with them would get; without `add_generation_prompt`, the assistant's turn is
    not opened."""

    id: int
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


class SlotsQuery(Frame):
    """What each slot is doing now (llama-server's GET /slots); answered with SlotsResult.
    The worker answers from its reader, not the engine thread."""

    id: int


class SlotFile(Frame):
    """llama-server's POST /slots/{id}?action=: save slot `slot`'s cached tokens and KV
    cells to the file `filename` in `folder`, restore them from it, or erase them. The
    engine acts once the slot is idle (llama-server waits likewise); answered with
    SlotFileResult or an Error.

    `folder_max_bytes`: what the folder's files may take in all (a save past it is refused,
    0: no bound); `cache_scope`: the caller's (Generate.cache_scope): a restored slot's cells
    become that scope's; with `own_only`, a save or erase acts only on a slot whose cells
    are that scope's."""

    id: int
    slot: int
    action: Literal["save", "restore", "erase"]
    folder: str = ""
    filename: str = ""
    folder_max_bytes: int = 0
    cache_scope: str = ""
    own_only: bool = False
    bound_root: str = ""  # the slot folder, whose files folder_max_bytes bounds in all ("": `folder`)


class Cancel(Frame):
    """Stop generation `id`: every choice, or only choice `index` of an n > 1 request
    (the router ends one whose tool calls began repeating). A cancelled choice still gets
    its final event (finish_reason "cancelled", with usage) unless the router forgot it."""

    id: int
    index: int | None = None


class Ping(Frame):
    seq: int


class Shutdown(Frame):
    grace: float = 5.0


class SetThreads(Frame):
    """Use this many CPU threads from the next decode step on. The supervisor divides the
    cores among the workers loaded together and re-divides when that set changes."""

    n_threads: int


class SetCacheBudget(Frame):
    """Keep at most this many bytes of saved prompts in host memory (the supervisor's share
    of prompt_cache_budget, re-divided as models load and unload), dropping the oldest."""

    n_bytes: int


# ---- worker -> supervisor ---------------------------------------------------------------------


class Loading(Frame):
    progress: float  # 0.0 .. 1.0


class Ready(Frame):
    n_ctx: int  # KV cells shared by every slot
    n_ctx_slot: int  # the most tokens (prompt + output) one request may hold
    slots: int
    n_vocab: int
    n_ctx_train: int
    has_template: bool
    embeddings: bool
    n_embd: int
    description: str = ""
    # The most bytes of text one token covers (0: no such bound for this tokenizer). A
    # text of n bytes makes at least fewest_tokens(n, max_token_bytes) tokens, so the
    # router can refuse a prompt that cannot fit without sending it here.
    max_token_bytes: int = 0
    # For llama-server's GET /props: the template's source (Jinja text, or a built-in's
    # name), the BOS/EOS texts, and llama-cpp-python's version. Never a local path.
    chat_template: str = ""
    bos_token: str = ""
    eos_token: str = ""
    build_info: str = ""
    # How this model writes tool calls, so the router can parse them; None: the model
    # cannot take tools (a built-in template not set to "generic").
    tool_format: ToolFormat | None = None
    # Whether output may hold reasoning blocks for the router to split off, and the tags
    # that open and close one (<think> and </think> unless the template's family differs).
    reasoning: bool = False
    reasoning_tags: tuple[str, str] = ("<think>", "</think>")
    # Why llama-server's /infill cannot run on this model: its fill-in-the-middle tokens
    # that are missing, in llama-server's words ("" when it has them).
    fim_missing: str = ""
    # What its projector (mmproj) lets prompts hold besides text.
    vision: bool = False
    audio: bool = False
    # What llama.cpp allocated on each GPU (model, KV and compute buffers, by its device
    # names: CUDA0, Vulkan1), read from its load log: the supervisor's gpu_memory_budget
    # counts it instead of its estimate once the model runs. Empty on a CPU.
    device_bytes: dict[str, int] = {}


def fewest_tokens(n_bytes: int, max_token_bytes: int | None) -> int:
    """A lower bound on the tokens that `n_bytes` of text make (0: no bound known)."""
    if not max_token_bytes:
        return 0
    return -(-n_bytes // max_token_bytes)


def utf8_length(text: str) -> int:
    """Bytes of `text` in UTF-8; free for ASCII text (CPython knows a string is ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", errors="replace"))


class Failed(Frame):
    message: str


class Step(Frame):
    """One frame per decode step, for every request that advanced in it."""

    events: list[TokenEvent]


class EmbedResult(Frame):
    id: int
    data: list[list[float]]  # a vector per input; empty when per_token is set
    prompt_tokens: int
    # pooling = "none" (Embed.native): each input's vectors, one per token, as they are.
    per_token: list[list[list[float]]] | None = None


class TokenizeResult(Frame):
    id: int
    tokens: list[int]
    # With Tokenize.with_pieces: each token's text, or its bytes where they are not valid
    # UTF-8 on their own (llama-server's shape).
    pieces: list[str | list[int]] | None = None


class DetokenizeResult(Frame):
    id: int
    content: str


class Rendered(Frame):
    id: int
    prompt: str


class SlotState(msgspec.Struct, forbid_unknown_fields=True):
    """One slot, as GET /slots shows it. `params` are the running request's, if any."""

    id: int
    n_ctx: int
    is_processing: bool
    id_task: int = -1  # the request id in this worker, -1 when idle
    n_decoded: int = 0
    n_remain: int = -1
    n_cached: int = 0  # tokens in the slot's KV cache
    params: SamplingParams | None = None


class SlotsResult(Frame):
    id: int
    slots: list[SlotState]


class SlotFileResult(Frame):
    id: int
    slot: int
    n_tokens: int  # tokens saved, restored or erased
    n_bytes: int = 0  # bytes written or read
    ms: float = 0.0


ErrorCode = Literal[
    "context_length_exceeded",
    "invalid_request",
    "unsupported",
    "unavailable",  # the worker is shutting down: the same request may be sent again
    "insufficient_storage",  # a slot file past the folder's bound, or a full disk (507)
    "internal",
]


class Error(Frame):
    """A request failed before or during generation. `param` names the offending field.
    A context_length_exceeded refusal carries the counts llama-server reports with it (the
    prompt's tokens, or a lower bound when it was refused by length, and the context)."""

    id: int
    code: ErrorCode
    message: str
    param: str | None = None
    n_prompt_tokens: int | None = None
    n_ctx: int | None = None


class Pong(Frame):
    seq: int
    active: int = 0
    queued: int = 0
    threads: int = 0  # CPU threads per decode now; 0 while loading
    # Prompt tokens fed to llama_decode since the worker started: n > 1 choices evaluate
    # their shared prompt once, which this shows (a cached prefix is not decoded either).
    prompt_tokens_decoded: int = 0
    # KV cells the slots' caches hold now (cells that siblings share count once a slot).
    kv_cells_used: int = 0
    # Slots whose books and KV cells disagreed and were dropped (each one a bug), and cached
    # prefixes the sliding window no longer held (decoded again): worker/kv_cache.py.
    kv_repairs: int = 0
    kv_prefixes_refused: int = 0
    # The prompt cache's counters and sizes (Engine.cache_counts: parked entries, host
    # memory, disk), each a running total or a size now; /metrics names each one.
    prompt_cache: dict[str, int] = {}


class Occupancy(Frame):
    """Requests holding a slot and requests waiting (for a slot, or still being prepared).
    Sent whenever either changes, right after the Step that changed it: a count that
    only came with the next Pong lagged the in-flight count by up to a ping interval."""

    active: int
    queued: int


ToWorker = Union[
    Generate, Embed, Tokenize, Cancel, Ping, Shutdown, SetThreads, SetCacheBudget, Detokenize, Render, SlotsQuery, SlotFile
]
FromWorker = Union[
    Loading, Ready, Failed, Step, EmbedResult, TokenizeResult, Error, Pong, Occupancy,
    DetokenizeResult, Rendered, SlotsResult, SlotFileResult,
]
