"""One generation job running on a model's worker.

`Generation` owns the lease on the worker and the worker's streams together, and its one
`close()` gives both back, whichever way the response ends. It yields the worker's
TokenEvents; router/generation/stream.py turns them into the internal event stream.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from router.generation import adapters, instances, owners
from router.generation.job import GenerationJob
from router.generation.prompt_bound import bounded_text, refuse_if_too_long
from router.generation.prompts import Prompt, is_tokens
from router.generation.sampling import capped
from router.generation.tagged_calls import ParamTypes
from router.generation.tool_grammar import tool_choice_constraint
from router.server import access_log, adapter_scales, auth, instance_key
from router.server.cache_scope import cache_scope
from supervisor import priority
from supervisor.connection import RequestStream, WorkerConnection
from supervisor.errors import Unsupported
from supervisor.group import ModelGroup, Served
from supervisor.handle import ModelHandle
from supervisor.lease import Lease
from supervisor.slot_queue import Ticket
from worker.protocol import SamplingParams, TokenEvent, ToolFormat, Usage


@dataclass(frozen=True)
class ChatParsing:
    """How a chat's output is read back (router/generation/chat_output.py): the model's
    tool-call format when tools were offered, the offered functions' names, and whether
    the model reasons in <think> blocks."""

    tools: ToolFormat | None
    declared: Collection[str] | None
    reasoning: bool
    # The offered functions' parameters' JSON types, for formats that write values as text.
    param_types: ParamTypes | None = None
    harmony: bool = False  # GPT-OSS's messages, tools or not (router/generation/harmony.py)
    reasoning_tags: tuple[str, str] = ("<think>", "</think>")
    model_format: ToolFormat | None = None  # the model's, tools offered or not


def param_types(offered: Sequence[dict[str, Any]]) -> ParamTypes:
    """Each offered function's parameters' JSON types, where its schema names one."""
    out: dict[str, dict[str, str]] = {}
    for t in offered:
        schema = t["function"].get("parameters")
        props = schema.get("properties") if isinstance(schema, dict) else None
        types: dict[str, str] = {}
        if isinstance(props, dict):
            for k, v in props.items():
                if isinstance(v, dict) and isinstance(v.get("type"), str):
                    types[k] = v["type"]
        out[t["function"]["name"]] = types
    return out


class Generation:
    """One job running on a model's worker. Iterate for its TokenEvents, each with its
    choice's index in the response; every choice ends with an event that has a
    finish_reason; errors raise. `close()` is idempotent and never blocks, so it is safe
    in a `finally` that runs during cancellation: it cancels the generation in the worker
    if it has not finished, and releases the lease (the model may unload again).

    A job of several prompts sends one Generate per prompt (each with n choices), all at
    once; the worker runs them together, and their events are read prompt after prompt
    (a later prompt's events wait in its channel meanwhile)."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._ticket: Ticket | None = None  # its slots, once its turn has come
        self._record: access_log.Record | None = None  # the access log's, to fill in
        self._streams: list[RequestStream] = []
        self._firsts: list[TokenEvent | None] = []
        self._running: list[int] = []  # per stream, choices without their final event
        # Tokens read of each (stream, choice) whose final event has not come: what a
        # generation that ends early (its client gone) counts, as no usage will come.
        self._unfinished: dict[tuple[int, int], int] = {}
        self._closed = False
        self._n = 1
        self._at = 0  # the stream being read
        self.parsing: ChatParsing | None = None  # a chat's; None for a text completion
        self._prompt_usage: Usage | None = None
        self._prompt_usages: list[Usage | None] = []  # each prompt's, from its first event
        self._owner: str | None = None  # the sending key's (owners.py), for GET /slots
        self._scope = ""  # whose cached prefixes it may reuse (router/server/cache_scope.py)
        self._rank = 1  # its class in the slot line (supervisor/config/key_rules.py)
        self._adapters: list[tuple[int, float]] = []  # its LoRA set (router/generation/adapters.py)
        # The job's parameters as sent, after the output caps: what an answer that repeats
        # them (llama-server's generation_settings) must say.
        self.params = SamplingParams()

    @classmethod
    async def start(cls, handle: Served, job: GenerationJob) -> Generation:
        """Take a lease (loading the model if needed), send the job, and wait for its first
        event, so that an error such as context_length_exceeded raises here, before a
        response has committed to a status. A model of several instances runs it on the one
        router/generation/instances.py chooses, and on another if that one cannot start it."""
        if isinstance(handle, ModelGroup):
            group = handle
            return await instances.run_on_instance(
                group, instance_key.current(), lambda h, attempt: cls._start(h, job, attempt, group)
            )
        return await cls._start(handle, job)

    @classmethod
    async def _start(
        cls, handle: ModelHandle, job: GenerationJob, attempt: instances.Attempt | None = None,
        model: Served | None = None,
    ) -> Generation:
        record = access_log.current()
        asked = time.monotonic()
        # Before the lease: an unknown adapter id is a 400 that must not leave one taken.
        chosen = adapters.for_worker(adapter_scales.current(), job.lora)
        gen = cls(await handle.acquire())
        gen._adapters = chosen
        gen._record = record
        key = auth.current_key()
        gen._owner = key.owner if key is not None else None
        gen._scope = cache_scope(key, job.cache_salt)

        # The model's and the key's caps on output, as llama-server's -n: a request asking
        # more, or no limit, generates up to the cap and ends with "length".
        job = dataclasses.replace(
            job, params=capped(job.params, handle.spec.max_tokens_limit, key.max_tokens if key is not None else None)
        )
        gen.params = job.params
        if job.keep_alive is not None:  # set while it holds the model: no unload between
            (model or handle).set_keep_alive(job.keep_alive.seconds)
        try:
            leased = time.monotonic()
            # Each choice of each prompt runs in a slot of its own.
            gen._ticket = await handle.take_slots(gen.conn, len(job.prompts) * job.n, priority.place(key, job.priority))
            gen._rank = gen._ticket.rank  # the worker's line is by class too (worker/priority.py)
            if record is not None:
                record.load_wait, record.slot_wait = leased - asked, time.monotonic() - leased
            await gen._begin(job)
        except BaseException:
            if attempt is not None:
                attempt.sent = bool(gen._streams)
            gen.close()
            raise
        return gen

    async def _begin(self, job: GenerationJob) -> None:
        conn = self._lease.conn
        ready = conn.ready
        messages = list(job.messages) if job.messages is not None else None
        self._n = job.n
        for prompt in job.prompts:
            text = prompt if isinstance(prompt, str) else None
            parts = _parts(job, prompt)
            if parts is not None:  # its strings alone bound it from below
                text = "".join(p for p in parts if isinstance(p, str))
            if ready is not None and (text is not None or messages is not None):
                refuse_if_too_long(
                    ready,
                    bounded_text(text, messages),
                    ready.n_ctx_slot - 1,
                    "the prompt",
                    f"this model's context holds {ready.n_ctx_slot} tokens, prompt and output together",
                    "messages" if job.chat else "prompt",
                )
        params, tools = job.params, job.tools
        fmt = ready.tool_format if ready is not None else None
        if tools.offered and ready is not None:
            if fmt is None:
                raise Unsupported(
                    "This model's built-in chat template cannot take tools; set tool_format = "
                    '"generic" or a Jinja chat_template in its config.',
                    "tools",
                )
            if tools.forced:
                params = msgspec.structs.replace(
                    params, constraint=tool_choice_constraint(fmt, tools.forced, tools.parallel)
                )
        if job.chat:
            self.parsing = ChatParsing(
                tools=fmt if tools.offered else None,
                declared=frozenset(t["function"]["name"] for t in tools.offered) if tools.offered else None,
                reasoning=ready is not None and ready.reasoning,
                param_types=param_types(tools.offered) if tools.offered else None,
                harmony=ready is not None and ready.tool_format == "gpt_oss",
                reasoning_tags=ready.reasoning_tags if ready is not None else ("<think>", "</think>"),
                model_format=ready.tool_format if ready is not None else None,
            )
        for prompt in job.prompts:
            stream = conn.generate(
                params,
                prompt=prompt if isinstance(prompt, str) else None,
                messages=messages,
                prompt_parts=_parts(job, prompt),
                infill=job.infill,
                tools=list(tools.offered) if tools.offered else None,
                template_kwargs=job.template_kwargs,
                prompt_tokens=[t for t in prompt if isinstance(t, int)] if isinstance(prompt, tuple) and is_tokens(prompt) else None,
                n=job.n,
                echo=job.echo,
                add_generation_prompt=job.add_generation_prompt,
                request_id=self._record.id if self._record is not None else None,
                # A whole answer, with no tool calls whose repeats end a choice early
                # (router/generation/stream.py): its tokens need not cross processes one
                # by one.
                hold_events=not job.stream and not tools.offered,
                cache_scope=self._scope,
                media=list(job.media) or None,
                priority=self._rank,
                adapters=self._adapters,
            )
            self._streams.append(stream)
            owners.enter(conn, stream.id, self._owner)
            self._running.append(job.n)
        # Every prompt's first answer before any header: an error in any of them is the
        # response's status.
        for stream in self._streams:
            self._firsts.append(await stream.receive())
        self._prompt_usages = [first.prompt_usage if first is not None else None for first in self._firsts]
        self._prompt_usage = self._prompt_usages[0] if self._prompt_usages else None
        if self._record is not None:
            self._record.first_token = time.monotonic()
            self._record.prompt_tokens = self._record.generated_tokens = 0

    @property
    def prompt_usage(self) -> Usage | None:
        """The first prompt's tokens and cached tokens, as its first event told them
        (None from a worker that does not say)."""
        return self._prompt_usage

    @property
    def conn(self) -> WorkerConnection:
        """The worker this generation runs on, leased until `close()`."""
        return self._lease.conn

    def end_choice(self, index: int) -> None:
        """Stop choice `index` (as the response numbers choices) in the worker: its output
        has ended (ChatOutput.ended). Its final event still comes, with finish_reason
        "cancelled" and its usage; the other choices go on. Never blocks."""
        at, choice = divmod(index, self._n)
        if at < len(self._streams):
            self._streams[at].cancel_choice(choice)

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> TokenEvent:
        while self._at < len(self._streams):
            at = self._at
            if not self._running[at]:
                self._at += 1
                continue
            first = self._firsts[at]
            if first is not None:
                ev, self._firsts[at] = first, None
            else:
                ev = await self._streams[at].receive()
            self._note(at, ev)
            if at:
                ev = msgspec.structs.replace(ev, index=at * self._n + ev.index)
            return ev
        raise StopAsyncIteration

    def _note(self, at: int, ev: TokenEvent) -> None:
        """An event of stream `at` read: its tokens, until its choice's usage counts them."""
        if ev.finish_reason is None:
            key = (at, ev.index)
            self._unfinished[key] = self._unfinished.get(key, 0) + len(ev.tokens)
            return
        self._unfinished.pop((at, ev.index), None)
        self._running[at] -= 1
        if self._record is not None and ev.usage is not None:
            self._count(ev.usage, first_of_prompt=self._running[at] == self._n - 1)

    def _count_unfinished(self) -> None:
        """At a close before the end (a client that left mid-stream, a cancellation), no
        usage comes for the choices still running: their tokens read so far count, and the
        prompt of each prompt none of whose choices finished (from its first event). Called
        once every prompt's first event has come (the record's first_token is set)."""
        assert self._record is not None
        for at, first in enumerate(self._firsts):
            if first is not None:  # read before any header, never handed on
                self._firsts[at] = None
                self._note(at, first)
            usage = self._prompt_usages[at]
            if self._running[at] == self._n and usage is not None:
                self._record.prompt_tokens = (self._record.prompt_tokens or 0) + usage.prompt_tokens
                self._record.cached_tokens += usage.cached_tokens
        left = sum(self._unfinished.values())
        self._unfinished.clear()
        self._record.generated_tokens = (self._record.generated_tokens or 0) + left

    def _count(self, usage: Usage, first_of_prompt: bool) -> None:
        """A finished choice's usage into the access log: its generated tokens, and, for
        the first of its prompt's choices to finish, the prompt's tokens (the choices of a
        prompt share it)."""
        assert self._record is not None
        self._record.generated_tokens = (self._record.generated_tokens or 0) + usage.completion_tokens
        if first_of_prompt:
            self._record.prompt_tokens = (self._record.prompt_tokens or 0) + usage.prompt_tokens
            self._record.cached_tokens += usage.cached_tokens

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._record is not None and self._record.first_token is not None:
            self._count_unfinished()
        for stream in self._streams:
            stream.close()
            owners.remove(self._lease.conn, stream.id)
        if self._ticket is not None:
            self._ticket.release()
        self._lease.release()


def _parts(job: GenerationJob, prompt: Prompt | None) -> list[int | str] | None:
    """The mixed prompt (ids and texts) a Generate carries: /completion's, or one of a
    completions request's prompts that mixes them."""
    if job.prompt_parts is not None:
        return list(job.prompt_parts)
    if isinstance(prompt, tuple) and not is_tokens(prompt):
        return list(prompt)
    return None

