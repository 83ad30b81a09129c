"""Ollama's request bodies (docs/api.md of ollama/ollama; api/types.go), as its clients send
them.

Ollama's server is written in Go and ignores JSON keys it does not know, and its clients
rely on that (the Python client sends `tools: []` on every chat and options that newer
servers dropped), so these Structs ignore unknown keys too. A known key of the wrong type
is still a 400 naming it. `stream` is true when absent, as in Ollama.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec

# Integers bounded at decode time: the worker's frames hold at most 64 bits, and a huge
# JSON integer must be a 400 naming its option, not a 500.
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
# keep_alive: a duration string ("5m", "1h30m"), or a number of seconds; < 0: for ever.
KeepAliveValue = Union[float, str, None]


class OllamaOptions(msgspec.Struct, omit_defaults=True):
    """`options`: the sampling options Corral acts on, and the ones it accepts and ignores
    because they set up the runner, which Corral's config does (LOAD_TIME)."""

    num_predict: Int32 | None = None  # -1: no limit; -2: until the context is full
    temperature: float | None = None
    top_k: Int32 | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None  # only its default, 1.0 (no such sampler in Corral)
    repeat_penalty: float | None = None
    repeat_last_n: Int32 | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: Int64 | None = None
    stop: list[str] | None = None
    mirostat: Int32 | None = None  # only 0
    # Set up the runner: the model's table in Corral's config decides them.
    num_ctx: Int32 | None = None
    num_batch: Int32 | None = None
    num_gpu: Int32 | None = None
    main_gpu: Int32 | None = None
    num_thread: Int32 | None = None
    num_keep: Int32 | None = None
    use_mmap: bool | None = None


LOAD_TIME = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "num_keep", "use_mmap")


class OllamaChatRequest(msgspec.Struct):
    model: str
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    format: Union[str, dict[str, Any], None] = None
    options: OllamaOptions | None = None
    stream: bool | None = None
    keep_alive: KeepAliveValue = None
    think: Union[bool, str, None] = None


class OllamaGenerateRequest(msgspec.Struct):
    model: str
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[Int32] | None = None
    raw: bool | None = None
    format: Union[str, dict[str, Any], None] = None
    images: list[str] | None = None
    options: OllamaOptions | None = None
    stream: bool | None = None
    keep_alive: KeepAliveValue = None
    think: Union[bool, str, None] = None


class OllamaShowRequest(msgspec.Struct):
    model: str | None = None
    name: str | None = None  # the older name of `model`
    verbose: bool | None = None


class OllamaEmbedRequest(msgspec.Struct):
    model: str
    input: Union[str, list[str], None] = None
    truncate: bool | None = None
    dimensions: Int32 | None = None
    options: OllamaOptions | None = None
    keep_alive: KeepAliveValue = None


class OllamaEmbeddingsRequest(msgspec.Struct):
    """The older /api/embeddings: one prompt, one vector, not normalized."""

    model: str
    prompt: str | None = None
    options: OllamaOptions | None = None
    keep_alive: KeepAliveValue = None


class OllamaErrorBody(msgspec.Struct):
    """Every error on Ollama's routes: `{"error": "message"}`."""

    error: str
