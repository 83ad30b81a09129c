"""The parameters a request and a model carry across the wire: sampling, a constraint on
the output, chat messages and tool calls, and a model's options (`ModelOptions`, inherited
by the config's tables and by `WorkerSpec`, the spec a worker starts with)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from worker.protocol.load_options import LoadOptions


class Constraint(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """A grammar the output must match, enforced token by token while sampling.

    `kind` says how to read `source`: a JSON schema (as JSON text), a Lark grammar in
    llguidance's dialect (which can embed a JSON schema with `%json { ... }`), or a GBNF
    grammar as llama.cpp writes them. `param` is the request parameter it came from, named
    in the 400 when it does not compile. `given`: a JSON schema as the client gave it,
    before the router narrowed it into `source`, for an upstream that enforces the
    client's schema itself (router/generation/remote/); the router never sends it to a
    worker.
    """

    kind: Literal["json_schema", "lark", "gbnf"]
    source: str
    param: str
    given: str | None = None


# How constrained JSON is laid out (llguidance's JSON options): no free whitespace. With
# flexible whitespace a small model can pad between tokens without end; the separators are
# Python's json.dumps defaults, so an answer reads as usual. Used for JSON schemas and for
# the `%json` parts of Lark grammars (a schema's own "x-guidance" key overrides it).
JSON_LAYOUT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class SamplingParams(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Everything a worker needs to build one request's sampler chain and stop rules.

    The router validates ranges before a frame is built; the worker re-checks the few that
    could abort llama.cpp, because no frame may crash it.
    """

    # These defaults are the only ones: the router's request types take theirs from here.
    # They are llama-server's (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05;
    # llama-cpp-python's server and Ollama are alike), not OpenAI's 1.0 with no truncation:
    # with a 262k-token vocabulary and a small model, untruncated sampling at 1.0 wanders
    # into stray scripts within a few tokens.
    max_tokens: int | None = None  # None: up to the slot's context
    temperature: float = 0.8  # 0 selects greedy
    top_p: float = 0.95  # 1 disables
    top_k: int = 40  # 0 disables
    min_p: float = 0.05  # 0 disables
    seed: int | None = None
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: list[str] = []
    ignore_eos: bool = False
    constraint: Constraint | None = None
    # llama-server's timings_per_token: every event carries Timings, not only the last.
    timings_per_token: bool = False
    # OpenAI's logit_bias with its ids parsed: added to the logits before sampling (the
    # router bounds the values to -100..100; the worker checks the ids against its vocabulary).
    logit_bias: dict[int, float] = {}
    # llama-server's logit_bias keyed by text: each text's tokens get its bias. The worker
    # tokenizes them (no BOS, special tokens as text) into logit_bias before it samples.
    logit_bias_text: dict[str, float] = {}
    # None: no logprobs. k >= 0: each generated token's logprob and its k most likely
    # alternatives, from the logits the sampler used (after logit_bias and any constraint).
    logprobs: int | None = None


# The ranges the router accepts for SamplingParams' float fields, inclusive (a request
# out of them gets a 400, a config out of them is refused). The worker's samplers need no
# more than this; OpenAI's ranges where OpenAI has the parameter.
SAMPLING_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "min_p": (0.0, 1.0),
    "repeat_penalty": (0.0, 10.0),
}
MAX_STOP_STRINGS = 16
# The chat template variables Corral sets from each request itself: neither a request's
# chat_template_kwargs nor a model's may set them.
TEMPLATE_OWN_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")
# llama-server's `false` in logit_bias: the token is never chosen while any other may be.
# Finite, unlike llama-server's -INFINITY, so that a request that bans every token samples
# from equals instead of from NaN.
LOGIT_BAN = -1e9


class ToolCall(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A function call an assistant made earlier in the conversation, as the client sent
    it: `arguments` is the JSON text, parsed only when a template renders it."""

    id: str
    name: str
    arguments: str


# Where an image stands in a message's content or a prompt, as the router writes it and the
# worker's projector reads it (libmtmd's media_marker). Made of private-use characters, not
# llama-server's "<__media__>", so that a user's text that says "<__media__>" is only text: a
# marker a client could type would let it move or add images (llama-server draws a random
# marker per process for the same reason). /completion's prompt_string, which does use
# "<__media__>", is rewritten by the router (router/api/llama/translate.py).
MEDIA_MARKER = "<\ue000image\ue001>"


def audio_format(data: bytes) -> str | None:
    """"wav", "mp3" or "flac" by a Media's first bytes, as libmtmd's is_audio_file tells them
    (llama-server's /completion takes a sound where an image may be); None: not audio. The
    router routes by it, the worker decodes by it (worker/media/sounds.py)."""
    if data[:4] in (b"RIFF", b"RF64") and data[8:12] == b"WAVE":
        return "wav"
    if data.startswith(b"fLaC"):
        return "flac"
    if data.startswith(b"ID3") or (len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


class Media(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """An image's or a sound's bytes as the client sent them (base64 decoded), and the
    parameter that carried it, which an error names. The worker decodes them
    (worker/media/pictures.py, worker/media/sounds.py)."""

    data: bytes
    param: str
    # What the client sent it as: an image part, or an audio one (OpenAI's input_audio, a
    # transcription's file, or multimodal_data that is audio by its first bytes).
    kind: Literal["image", "audio"] = "image"
    # The router's alone: an image named by URL, fetched before the job runs (from the
    # hosts [server] image_url_hosts lists: router/generation/image_urls.py); never sent.
    url: str = ""


class ChatMessage(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    role: str
    content: str = ""
    # OpenAI's optional message fields, for tool calling and reasoning models; None is
    # "not sent", which templates tell apart from an empty value (`'tool_calls' in message`).
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None  # a tool message: the call it answers
    reasoning_content: str | None = None  # an assistant message's earlier reasoning
    # Its images and sounds, one for each MEDIA_MARKER in `content`, in order (a model with
    # a projector only).
    media: list[Media] | None = None


Pooling = Literal["mean", "cls", "last", "rank", "none"]
# How a model writes tool calls (see worker/chat_formats.py); "auto" reads its template.
ToolFormat = Literal[
    "hermes", "llama3", "mistral", "generic",
    # a section between two markers (worker/chat_formats.py, BLOCKS)
    "deepseek_r1", "deepseek_v3_1", "command_r7b", "kimi_k2", "nemotron", "seed_oss", "minimax_m2",
    "firefunction", "functionary_v3_1", "apriel",
    "gpt_oss",  # OpenAI's harmony messages (router/generation/harmony.py)
    "functionary_v3_2",  # >>>recipient messages (router/generation/functionary.py)
    "lfm2", "gemma4", "apertus", "deepseek_v3_2", "deepseek_v4", "kimi_k3", "gigachat_v3", "gigachat_v3_1",
    "command_r_plus", "minicpm5", "hy3", "minimax_m3",
    "muse_glimmer",  # recipient messages (router/generation/muse.py)
]
TOOL_FORMATS: tuple[str, ...] = ToolFormat.__args__  # type: ignore[attr-defined]


class ModelOptions(LoadOptions, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A model's options that the worker applies, and their defaults; listed nowhere else.

    The config's `[models.NAME]` table, the supervisor's resolved spec and `WorkerSpec`
    all inherit these fields, and `options_of` copies them from one to the next, so a new
    option is declared here once and nothing names it on the way to the worker.
    Keyword-only, so that a subclass's own required fields (a name, a path) come first:
    in `WorkerSpec`'s JSON that keeps the model's name at the start of a `ps` line. How
    llama.cpp loads the model (flash attention, KV cache types, mmap, GPU split, tensor
    overrides, RoPE) is declared in `LoadOptions`, the base (worker/protocol/load_options.py).
    """

    slots: int = 4
    # Finished prompts kept in the KV cache beyond the slots' own, each under a sequence of
    # its own (worker/kv_entries.py), so that a conversation whose slot another user took
    # still finds its cells. They share the n_ctx cells and give them up first when a
    # request needs room. None: twice the slots (at most 256 sequences in all).
    cached_prompts: int | None = None
    # Saved prompts beyond the KV cache (worker/prompt_cache.py): bytes of host memory for
    # the cells of entries the KV cache gave up, and a folder where the hottest prompts
    # outlive the worker (an idle unload, a reload, a restart), with its byte budget. The
    # worker keeps a model's files in a subfolder named after the model. None: nowhere.
    prompt_cache_bytes: int = 1 << 30
    prompt_cache_dir: str | None = None
    prompt_cache_disk_bytes: int = 2 << 30
    n_ctx: int = 4096  # KV cells shared by all slots
    # Speculative decoding (llama-server's --spec-type, --spec-draft-n-max): "ngram" drafts
    # the tokens that followed the earlier occurrence of the output's last few tokens in the
    # prompt or the output (worker/ngram_draft.py) and verifies them in the same decode step
    # as the other slots, at most draft_max a step; the output is the same. On by default:
    # it measured 2.3x on code editing and 1.4x on sampled stories (bench/speculative.py).
    # "none": one token a step.
    spec_type: Literal["none", "ngram", "draft"] = "ngram"
    draft_max: int = 16
    # A smaller model with the same vocabulary that drafts instead of n-gram lookup
    # (llama-server's --model-draft, --spec-type draft-simple; worker/draft_model.py) unless
    # spec_type is "none"; its draft stops at a token whose probability, as the draft model
    # sees it, is under draft_p_min (llama-server's --draft-p-min).
    draft_model: str | None = None
    draft_p_min: float = 0.0
    # The model's projector (llama-server's --mmproj): a vision (or audio) encoder GGUF made
    # for this text model, which lets its prompts hold images (worker/media/). The config's
    # path is relative to the config file; the supervisor makes it absolute.
    mmproj: str | None = None
    # The most one request may hold, prompt and output together. None: all n_ctx (one KV
    # pool for all slots, llama-server's --kv-unified). llama-server without it gives each
    # slot n_ctx / parallel; this says the same here, while the slots still share cells.
    n_ctx_slot: int | None = None
    n_batch: int = 512  # most tokens in one decode step; prompts are prefilled in chunks of it
    # None: the supervisor gives the worker a share of the cores; a worker that is still
    # told None (started by hand, a test) uses all of them.
    threads: int | None = None
    n_gpu_layers: int = 0
    # A built-in name ("gemma") or a Jinja file; the supervisor makes the path absolute
    # before it reaches the worker.
    chat_template: str | None = None
    embeddings: bool = False
    pooling: Pooling | None = None  # embeddings only; None: the model's own, else mean
    # Weight repacking (llama-server's --repack). Off by default: on AMX CPUs a repacked
    # model segfaults on the first multi-token decode (ggml-org/llama.cpp#20824).
    repack: bool = False
    # Give sliding-window layers a KV cache as large as n_ctx, so that cells that have left
    # the window usually stay for prefix reuse. Usually, not always: llama.cpp may still give
    # them away, and the worker checks before it keeps a prefix (worker/kv_rules.py).
    swa_full: bool = True
    # How tool calls are offered and written: "auto" decides from the chat template
    # (worker/chat_formats.py); a built-in template takes tools only as "generic".
    tool_format: Literal[
        "auto", "hermes", "llama3", "mistral", "generic", "deepseek_r1", "deepseek_v3_1", "command_r7b",
        "kimi_k2", "nemotron", "seed_oss", "minimax_m2", "firefunction", "functionary_v3_1", "apriel", "gpt_oss",
        "functionary_v3_2", "lfm2", "gemma4", "apertus", "deepseek_v3_2", "deepseek_v4", "kimi_k3", "gigachat_v3",
        "gigachat_v3_1", "command_r_plus", "minicpm5", "hy3", "minimax_m3", "muse_glimmer",
    ] = "auto"
    # False: <think> blocks stay in `content` instead of going to `reasoning_content`.
    reasoning: bool = True
    # Jinja template variables every request gets unless it sets them itself
    # (llama-server's --chat-template-kwargs; --reasoning off is {enable_thinking = false}).
    chat_template_kwargs: dict[str, Any] = {}


def sequences(options: ModelOptions) -> int:
    """The llama.cpp sequences a model's context needs: one per slot, one per cached prompt
    (none for an embedding model, whose inputs are never reused)."""
    if options.embeddings:
        return options.slots
    cached = options.cached_prompts if options.cached_prompts is not None else 2 * options.slots
    return min(options.slots + cached, MAX_SEQUENCES)


MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ


def options_of(source: ModelOptions) -> dict[str, Any]:
    """`source`'s model options alone, without the fields its own class adds, as keyword
    arguments for building another kind of ModelOptions."""
    return {name: getattr(source, name) for name in ModelOptions.__struct_fields__}


class WorkerSpec(ModelOptions, forbid_unknown_fields=True, frozen=True):
    """What a worker loads. The supervisor passes it as JSON on the command line, so `ps`
    shows which model a worker process serves."""

    name: str
    path: str


class InfillChunk(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A file of llama-server's /infill `input_extra`: repository context before the code."""

    text: str
    filename: str = "tmp"


class Infill(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """llama-server's /infill: the code before and after the gap (texts and token ids, as
    its mixed prompts), files of context, and a `prompt` that continues the prefix. The
    worker lays them out with the model's fill-in-the-middle tokens (worker/infill.py)."""

    prefix: list[int | str]
    suffix: list[int | str]
    extra: list[InfillChunk] = []
    prompt: str = ""
