"""The internal request as an OpenAI chat completion (or text completion) request.

Only what the client asked for is sent. A job's sampling parameters have the model's
defaults filled in where the client said nothing; an upstream has defaults of its own
(OpenAI's temperature is 1.0, llama-server's 0.8), and a hosted API refuses parameters it
does not know, so a parameter the client left unset must not be sent at all. Which ones
the client set is found by building the job twice, with two sets of defaults that differ
in every field (`sent_fields`): a field whose value does not follow the defaults came from
the request, whatever the dialect's translator did to get there.

Parameters that OpenAI's API lacks but llama-server and vLLM take (top_k, min_p,
repeat_penalty, repeat_last_n, ignore_eos, chat_template_kwargs) go under their names when
the client set them; an upstream that refuses them says so in a 400 that names them, which
the client gets. Parameters that cannot mean the same there (token ids of this server's
vocabulary, logprobs by token id, a Lark grammar) are a 400 here, naming them.

Pure: no I/O, tested without an upstream.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import msgspec

from router.generation import media
from router.generation.job import GenerationJob
from router.generation.structured import json_mode
from supervisor.errors import Unsupported
from worker.protocol import ChatMessage, SamplingParams

# Defaults that differ from SamplingParams()'s in every field a translator takes from its
# defaults, and pass every range check.
_PROBE = SamplingParams(
    max_tokens=4099, temperature=0.37, top_p=0.61, top_k=17, min_p=0.013, seed=7919, repeat_penalty=1.07,
    repeat_last_n=33, presence_penalty=0.11, frequency_penalty=0.13, stop=["\x00probe"], ignore_eos=True,
)
_FIELDS: tuple[str, ...] = SamplingParams.__struct_fields__

# SamplingParams' fields under the names an OpenAI-compatible server reads.
_NAMES = {
    "max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "seed": "seed",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "stop": "stop",
    # llama-server's and vLLM's own
    "top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
    "ignore_eos": "ignore_eos",
}
# Fields no upstream can read as this server means them.
_NOT_CARRIED = {
    "logit_bias": "token ids name this server's vocabulary, not the upstream's",
    "logit_bias_text": "the upstream does not take biases by text",
    "logprobs": "log-probabilities are not relayed from an upstream in another dialect",
    "timings_per_token": "the upstream's timings are not relayed",
}


def sent_fields(make: Callable[[SamplingParams], GenerationJob]) -> GenerationJob:
    """The job `make` builds from Corral's defaults, with `sent` set to the sampling fields
    the request itself set (those that come out the same from two sets of defaults)."""
    job = make(SamplingParams())
    probe = make(_PROBE)
    sent = frozenset(f for f in _FIELDS if getattr(job.params, f) == getattr(probe.params, f))
    return dataclasses.replace(job, sent=sent)


def chat_body(job: GenerationJob, model: str) -> dict[str, Any]:
    """The chat completion request for a chat job, streamed with its usage at the end."""
    assert job.messages is not None
    body: dict[str, Any] = {"model": model, "messages": _messages(job.messages)}
    body.update(_sampling(job))
    tools = job.tools
    if tools.offered:
        body["tools"] = list(tools.offered)
        if tools.forced is not None:
            body["tool_choice"] = (
                {"type": "function", "function": {"name": tools.forced[0]["function"]["name"]}}
                if len(tools.forced) == 1
                else "required"
            )
        if not tools.parallel:
            body["parallel_tool_calls"] = False
    elif tools.withheld:  # tool_choice "none", as the client sent it
        body.update(tools=list(tools.withheld), tool_choice="none")
    if job.template_kwargs:
        body["chat_template_kwargs"] = dict(job.template_kwargs)
    if job.effort not in (None, "none"):  # "none" is the default of the models that take it
        body["reasoning_effort"] = job.effort
    _lora(job, body)
    body.update(stream=True, stream_options={"include_usage": True})
    return body


def _lora(job: GenerationJob, body: dict[str, Any]) -> None:
    """llama-server's per-request `lora`, passed on as sent: the ids are the upstream's
    adapters (another Corral or llama-server takes it; a server that does not refuses it
    by name rather than ignoring what was asked)."""
    if job.lora is not None:
        body["lora"] = [{"id": i, "scale": s} for i, s in job.lora]


def completion_body(job: GenerationJob, model: str) -> dict[str, Any]:
    """The text completion request for a job with one text prompt."""
    if job.prompt is None or job.prompt_list is not None or job.prompt_parts is not None or job.infill is not None:
        raise Unsupported("Only a text prompt can be sent to this model's upstream.", "prompt")
    if job.media:  # a completion has no place for images in OpenAI's API
        raise Unsupported("A prompt with images or audio cannot be sent to this model's upstream; send a chat.", job.media[0].param)
    body: dict[str, Any] = {"model": model, "prompt": job.prompt}
    body.update(_sampling(job))
    if job.echo:
        body["echo"] = True
    _lora(job, body)
    body.update(stream=True, stream_options={"include_usage": True})
    return body


def sent_set(job: GenerationJob) -> frozenset[str]:
    """The sampling fields the request set, refusing those no upstream can take (a 400
    naming the first)."""
    p, sent = job.params, job.sent if job.sent is not None else frozenset(_FIELDS)
    for field, why in _NOT_CARRIED.items():
        if field in sent and getattr(p, field) != getattr(SamplingParams(), field):
            raise Unsupported(f"'{field}' cannot be sent to this model's upstream: {why}.", field)
    return sent


def _sampling(job: GenerationJob) -> dict[str, Any]:
    p, sent = job.params, sent_set(job)
    out: dict[str, Any] = {}
    for field, name in _NAMES.items():
        value = getattr(p, field)
        # An empty stop list and ignore_eos false are every server's defaults; a dialect that
        # has no such parameter leaves them so, which looks "set" to sent_fields.
        if field in sent and value is not None and not (field in ("stop", "ignore_eos") and not value):
            out[name] = value
    if job.n != 1:
        out["n"] = job.n
    c = p.constraint
    if c is not None:
        if json_mode(c):
            out["response_format"] = {"type": "json_object"}  # JSON mode, as the client asked
        elif c.kind == "json_schema":
            # Not strict: OpenAI's strict mode refuses schemas that do not require every
            # property, which the client did not ask to be held to.
            out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": json.loads(c.given or c.source)}}
        elif c.kind == "gbnf":
            out["grammar"] = c.source  # llama-server's
        else:
            raise Unsupported(f"'{c.param}': a Lark grammar cannot be sent to this model's upstream.", c.param)
    return out


def _messages(turns: tuple[ChatMessage, ...]) -> list[dict[str, Any]]:
    return [_message(m) for m in answered_ids(turns)]


def answered_ids(turns: tuple[ChatMessage, ...]) -> list[ChatMessage]:
    """The conversation with an id on every tool result. One without the id of the call it
    answers (Ollama's carry only the tool's name) gets the id of the call it answers: the
    earliest unanswered call of the assistant's last turn with that name, else the earliest
    unanswered one, since OpenAI's and Anthropic's APIs refuse a tool result without one."""
    out: list[ChatMessage] = []
    unanswered: list[tuple[str, str]] = []  # (id, name) of the last assistant turn's calls
    for m in turns:
        if m.role == "assistant" and m.tool_calls:
            unanswered = [(c.id, c.name) for c in m.tool_calls]
        if m.role == "tool" and m.tool_call_id is None and unanswered:
            match = next((c for c in unanswered if c[1] == m.name), unanswered[0])
            m = msgspec.structs.replace(m, tool_call_id=match[0])
        if m.role == "tool":
            unanswered = [c for c in unanswered if c[0] != m.tool_call_id]
        out.append(m)
    return out


def _message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.media:  # text, image_url and input_audio parts, in the order the client sent them
        out["content"] = [
            {"type": "text", "text": p} if isinstance(p, str) else media.openai_part(p)
            for p in media.pieces(m.content, m.media)
        ]
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls
        ]
        if not m.content:
            out["content"] = None
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.reasoning_content:
        out["reasoning_content"] = m.reasoning_content  # llama-server's and vLLM's
    return out
