"""The internal generation request: what every dialect's request becomes.

A dialect's handler decodes its body, checks it, and translates it into one
`GenerationJob` (router/api/*/translate.py); everything downstream (the run on a worker,
the event stream, the renderers) takes the job, never a dialect's body. It holds the
messages (or prompts), the tools and tool choice, the sampling parameters with their
output constraint, n and stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from router.generation.prompts import Prompt
from router.generation.tool_schemas import ToolRequest
from worker.protocol import ChatMessage, Infill, Media, SamplingParams


@dataclass(frozen=True)
class KeepAlive:
    """How long the model stays loaded once idle, from this request on (Ollama's
    keep_alive): seconds, < 0 for ever; None: the config's idle_timeout again."""

    seconds: float | None


@dataclass(frozen=True)
class GenerationJob:
    model: str  # as the client named it (an alias stays an alias in the response)
    params: SamplingParams
    prompt: str | None = None  # a text completion's prompt
    messages: tuple[ChatMessage, ...] | None = None  # a chat's messages
    # llama-server's mixed prompt (token ids and strings), from POST /completion.
    prompt_parts: tuple[int | str, ...] | None = None
    infill: Infill | None = None  # llama-server's /infill, laid out by the worker
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    tools: ToolRequest = field(default_factory=ToolRequest)
    template_kwargs: dict[str, Any] | None = None  # chat_template_kwargs
    add_generation_prompt: bool = True  # False: the template does not open the assistant's turn
    # A text completion's prompts when they are not one string (token arrays, or several
    # prompts); each gives n choices, choice p*n + j being prompt p's j-th.
    prompt_list: tuple[Prompt, ...] | None = None
    n: int = 1
    echo: bool = False  # completions: each choice's text starts with its prompt's
    keep_alive: KeepAlive | None = None  # None: the request says nothing of it
    # The `params` fields the request itself set, where that is tracked (a job sent to an
    # upstream, whose own defaults apply to the rest: router/generation/remote/); None:
    # not tracked, every field is the job's.
    sent: frozenset[str] | None = None
    # The reasoning effort the request asked for (OpenAI's reasoning_effort, Responses'
    # reasoning.effort, Ollama's think), for an upstream that takes one (router/generation/
    # remote/): a local model's template reads only whether it thinks (template_kwargs).
    effort: str | None = None
    # The request's own names for the fields above that it calls otherwise (Ollama's
    # options.seed, /completion's n_predict), for the errors that name them when the job
    # is translated for an upstream (router/generation/remote/naming.py).
    names: Mapping[str, str] = field(default_factory=dict)
    # vLLM's cache_salt: no cached prefix is shared with requests of another salt
    # (router/server/cache_scope.py).
    cache_salt: str | None = None
    # A prompt's images and sounds (llama-server's multimodal_data, Ollama's /api/generate
    # images), one for each MEDIA_MARKER in it; a chat's travel in their messages.
    media: tuple[Media, ...] = ()
    # vLLM's `priority`, as sent where the key may send it: the request's class in the slot
    # line (supervisor/priority.py); None: its key's.
    priority: int | None = None
    # llama-server's per-request `lora`: (adapter id, scale) of the served name's adapters,
    # the others at 0 (router/generation/adapters.py); None: the name's scales.
    lora: tuple[tuple[int, float], ...] | None = None

    @property
    def images(self) -> list[Media]:
        """Every image and sound of the request, in order."""
        return [*self.media, *(md for m in self.messages or () for md in m.media or ())]

    @property
    def chat(self) -> bool:
        return self.messages is not None

    @property
    def prompts(self) -> tuple[Prompt | None, ...]:
        """One entry per Generate sent: a prompt, or None for a chat's messages."""
        if self.prompt_list is not None:
            return self.prompt_list
        if self.chat or self.prompt_parts is not None or self.infill is not None:
            return (None,)
        return (self.prompt or "",)

    @property
    def logprobs(self) -> bool:
        return self.params.logprobs is not None

    @property
    def timings(self) -> bool:
        """llama-server's timings_per_token: chunks and the answer carry `timings`."""
        return self.params.timings_per_token
